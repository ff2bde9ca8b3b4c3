"""The session index read that survives a concurrent rewrite of a large record (diskcache's file race)."""

from __future__ import annotations

from pflash_proxy.sessions.store import SessionStore


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
