"""The session index read that survives a concurrent rewrite of a large record (diskcache's file race)."""

from __future__ import annotations

from pflash_proxy.sessions.index.local import SessionStore


def test_a_read_racing_a_rewrite_reads_again(tmp_path, monkeypatch):
    store = SessionStore(tmp_path / "idx")
    rec = store.new_session("seed", False)
    store.save_session(rec, ["h"], [{"role": "user", "content": "x" * 100_000}])  # a file-backed value
    real_get = store.cache.get
    misses = iter([True])

    def racing_get(key, default=None, **kw):  # the first read lands between a writer's new row and old file
        if key == ("session", rec.id) and next(misses, False):
            return default
        return real_get(key, default, **kw)

    monkeypatch.setattr(store.cache, "get", racing_get)
    got = store.get(rec.id)
    assert got is not None and got.served[0]["content"] == "x" * 100_000
    assert store.get("no-such-session") is None


def test_a_reader_never_misses_a_large_record_another_thread_rewrites(tmp_path):
    """A writer (another index on the same directory, as a worker thread or a second process) rewrites a large
    record while this thread reads it: every read finds it. With file-backed values diskcache deletes the old
    file before the writer's transaction commits, and about a third of these reads came back None."""
    import threading

    store = SessionStore(tmp_path / "idx")
    rec = store.new_session("seed", False)
    big = [{"role": "user", "content": "x" * 100_000}]
    store.save_session(rec, ["h"], big)
    done = threading.Event()

    def writer():
        other = SessionStore(tmp_path / "idx")
        mine = other.get(rec.id)
        for i in range(300):
            other.save_session(mine, ["h", str(i)], big + [{"role": "user", "content": str(i)}])
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = missed = 0
    while not done.is_set() or reads < 100:
        reads += 1
        missed += store.get(rec.id) is None
    thread.join()
    assert missed == 0, f"{missed} of {reads} reads found no record"
