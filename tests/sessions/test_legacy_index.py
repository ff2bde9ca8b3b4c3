"""The diskcache index of older versions (``sessions/index/legacy.py``), written here as they wrote it
(``tests/sessions/old_index.py``, with diskcache itself):

1. ``serve``'s index (``SqliteIndex``) reads it once: every session with its served history (a value in a file
   too), recall sources, traces, responses, snapshot records and the salt; then its file is moved aside. A
   migration cut short is done again; a damaged file is moved aside and costs its sessions, not the start.
2. ``ls``/``rm`` beside an older proxy read it where it is, and never migrate it; ``rm`` deletes the record and
   the file; ``--index diskcache`` is refused in one line.
3. Nothing is unpickled: a pickled value reads as absent, a key is parsed from its bytes, never unpickled.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import pickletools
import sqlite3
import subprocess
import sys

import diskcache
import pytest

from pflash_proxy.sessions.index import SnapshotRecord, open_index
from pflash_proxy.sessions.index import sqlite as sqlite_module
from pflash_proxy.sessions.index.legacy import DiskcacheReader, parse_key
from pflash_proxy.sessions.index.sqlite import SqliteIndex
from tests.sessions.old_index import OldIndex


def msgs(*texts: str) -> list[dict[str, object]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


class CreatesFile:
    """Unpickling this creates ``path``: what a writer of a shared store could plant."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _recall_source():
    from tests.sessions.test_redis_index import _recall_source as make

    return make("amber")


def _cli(home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pflash_proxy", *args], capture_output=True, text=True,
                          env={**os.environ, "PFLASH_HOME": str(home)}, timeout=60)


def test_a_diskcache_index_is_read_once_and_moved_aside(tmp_path):
    from pflash_proxy.sessions.traces import TurnTraces, append

    home = tmp_path / "home"
    old = OldIndex(home / "sessions")
    source = _recall_source()
    recs = []
    for i in range(5):
        history = msgs(*(f"session {i} message {n}" for n in range(2 * i + 1)))
        if i == 4:  # 40 KB: diskcache keeps it in a file of its own
            history[-1]["content"] = "a long pasted document " * 2000
        rec = old.save(f"seed{i}", history, owner=f"o{i}", recall_sources=[source] if i == 0 else [])
        recs.append((rec.id, history))
    assert list((home / "sessions").rglob("*.val")), "a value kept in a file"
    sid0 = recs[0][0]
    traces = TurnTraces(1)
    traces.add({"v": 2, "kind": "compression", "turn": 1, "message": 0, "text": "a document", "units": {"a": [1]}})
    log_before = old.update_trace_log(sid0, lambda kept: append(kept, traces))
    old.put_response("ra", {"session": sid0, "items": [1]})
    old.put_response("rb", {"session": sid0, "items": [2]})
    old.put_snapshot(SnapshotRecord(session=sid0, file=f"pf-{sid0}.bin", tokens=9, served_hashes=["h"],
                                    model_identity="m", size=100))
    salt = old.salt
    uses = {k[1]: old.cache.get(k) for k in old.cache.iterkeys() if k[0] == "used"}
    old.close()

    new = open_index(home, "sqlite")
    try:
        assert isinstance(new, SqliteIndex) and new.salt == salt
        assert new.last_uses() == pytest.approx(uses)
        for i, (sid, history) in enumerate(recs):
            found, matched, _ = new.lookup(f"seed{i}", history + msgs("next"))
            assert found is not None and found.id == sid and matched == len(history) and found.served == history
            assert found.owner == f"o{i}"
        first = new.lookup("seed0", recs[0][1] + msgs("next"))[0]
        assert [s.omitted_texts for s in first.recall_sources] == [source.omitted_texts]
        assert new.trace_log(sid0) == log_before and log_before.traces[0]["text"] == "a document"
        assert new.response("ra") == {"session": sid0, "items": [1]} and new.last_response(sid0) == "rb"
        assert new.snapshot(sid0).tokens == 9
        assert not (home / "sessions" / "cache.db").exists()
        assert len(list((home / "sessions").glob("cache.db.migrated-*"))) == 1
        # and it goes on as an index of its own: a turn, a prune with everything it had
        rec = new.lookup("seed1", recs[1][1] + msgs("more"))[0]
        new.save_session(rec, [*rec.client_hashes, "h-more"], recs[1][1] + msgs("more"))
        assert new.prune(older_than=None, max_sessions=0)
        assert new.count_sessions() == 0 and new.response("ra") is None
    finally:
        new.close()
    again = open_index(home, "sqlite")  # nothing read twice
    assert again.count_sessions() == 0
    again.close()


def test_a_migration_cut_short_is_done_again(tmp_path, monkeypatch):
    home = tmp_path / "home"
    old = OldIndex(home / "sessions")
    rec = old.save("seed", msgs("hello", "hi"))
    old.close()

    def cut_short(directory, db):
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(sqlite_module, "migrate", cut_short)
    first = open_index(home, "sqlite")  # serves, without the old sessions this once
    assert first.get(rec.id) is None and (home / "sessions" / "cache.db").exists()
    first.close()
    monkeypatch.undo()
    second = open_index(home, "sqlite")
    try:
        assert second.get(rec.id) is not None and second.get(rec.id).served == msgs("hello", "hi")
    finally:
        second.close()


def test_the_default_index_of_a_home_kept_by_diskcache_keeps_its_sessions(tmp_path, caplog):
    """Upgrading a proxy whose --home holds the diskcache index: ``--index embedded`` (the default) reads it, so the
    next turn of every stored session continues it."""
    caplog.set_level(logging.INFO, "pflash_proxy.sessions")
    home = tmp_path / "home"
    old = OldIndex(home / "sessions")
    history = msgs("hello", "hi")
    rec = old.save("seed", history)
    old.close()
    new = open_index(home)
    try:
        found, matched, _ = new.lookup("seed", history + msgs("next"))
        assert found is not None and found.id == rec.id and matched == 2
    finally:
        new.close()
    assert "1 sessions read from the diskcache index" in caplog.text


@pytest.mark.parametrize("content", [b"this is not a sqlite database" * 100, "no Cache table"])
def test_a_damaged_diskcache_index_costs_its_sessions_not_the_start(tmp_path, caplog, content):
    d = tmp_path / "home" / "sessions"
    d.mkdir(parents=True)
    if isinstance(content, bytes):
        (d / "cache.db").write_bytes(content)
    else:
        sqlite3.connect(d / "cache.db").execute("CREATE TABLE other (x)").connection.close()
    index = open_index(tmp_path / "home")
    try:
        assert isinstance(index, SqliteIndex) and index.count_sessions() == 0
        index.save_session(index.new_session("seed", False), ["h"], msgs("hello"))
        assert index.count_sessions() == 1
    finally:
        index.close()
    assert list(d.glob("cache.db.corrupt-*")) and not (d / "cache.db").exists()
    assert "is damaged" in caplog.text


def test_ls_and_rm_beside_an_older_proxy_read_its_diskcache_index_and_move_nothing(tmp_path):
    """``ls``/``rm`` take no lock: run beside an older proxy that still serves from diskcache, they read its index
    where it is and never migrate it (sessions that proxy saved after a move would be lost to the new index)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    old = OldIndex(home / "sessions")
    keep, drop = old.save("seed", msgs("a")), old.save("other", msgs("b"))
    snaps = home / "slots"
    snaps.mkdir(mode=0o700)
    for rec in (keep, drop):
        (snaps / f"pf-{rec.id}.bin").write_bytes(b"kv")
        old.put_snapshot(SnapshotRecord(session=rec.id, file=f"pf-{rec.id}.bin", tokens=9, served_hashes=["h"],
                                        model_identity="m", size=100))
    r = _cli(home, "ls", "--json")  # the slots in --home: where the snapshots are
    assert r.returncode == 0, r.stderr
    assert sorted(s["session"] for s in json.loads(r.stdout)) == sorted([keep.id, drop.id])
    r = _cli(home, "rm", drop.id[:12])
    assert r.returncode == 0 and "removed 1 snapshot" in r.stdout, r.stderr
    assert not (snaps / f"pf-{drop.id}.bin").exists() and (snaps / f"pf-{keep.id}.bin").exists()
    assert [k for k in old.cache.iterkeys() if k[0] == "snapshot"] == [("snapshot", keep.id)]  # the old proxy sees it
    old.close()
    assert (home / "sessions" / "cache.db").exists() and not (home / "sessions" / "index.db").exists()


def test_index_diskcache_is_refused_in_one_line_naming_what_to_use(tmp_path):
    for args in (["ls", "--index", "diskcache"], ["serve", "--index", "diskcache", "--upstream", "http://127.0.0.1:9"]):
        r = _cli(tmp_path / "home", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "'diskcache' was removed: use 'embedded'" in r.stderr


def test_nothing_stored_pickled_is_unpickled(tmp_path):
    marker = tmp_path / "ran"
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    old = OldIndex(home / "sessions")
    rec = old.save("seed", msgs("hi"))
    old.close()
    plain = diskcache.Cache(str(home / "sessions"))  # diskcache's own Disk pickles values, as older versions did
    evil = CreatesFile(str(marker))
    for key in (("session", rec.id), ("snapshot", rec.id), ("response", "r1"), ("responses", rec.id),
                ("chain", "c" * 64), ("recall", "k")):
        plain.set(key, evil)
    plain.close()
    reader = DiskcacheReader(home / "sessions")
    assert reader.items()[("session", rec.id)] is None and reader.snapshots() == []
    reader.close()
    assert _cli(home, "ls", "--json").stdout.strip() == "[]"
    index = open_index(home)
    try:
        assert index.get(rec.id) is None and index.count_sessions() == 0 and index.snapshots() == []
        assert index.lookup("seed", msgs("hi"))[0] is None and index.response("r1") is None
    finally:
        index.close()
    assert not marker.exists()


def test_keys_are_parsed_not_unpickled(tmp_path):
    for key in [("chain", "c" * 64), ("salt",), ("session", "é" * 300), ("a", "b", "c")]:
        assert parse_key(pickle.dumps(key, protocol=5)) == key
        assert parse_key(pickletools.optimize(pickle.dumps(key, protocol=5))) == key
    assert parse_key(pickle.dumps(CreatesFile("/tmp/never"), protocol=5)) is None
    assert parse_key(b"") is None and parse_key(b"\x80\x05garbage") is None
    marker = tmp_path / "ran"
    old = OldIndex(tmp_path / "idx")
    old.save("seed", msgs("hi"))
    old.cache._sql("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, "
                   "mode, filename, value) VALUES (?, 0, 0, NULL, 0, 0, NULL, 0, 1, NULL, 5)",
                   (pickle.dumps(CreatesFile(str(marker)), protocol=5),))
    old.close()
    reader = DiskcacheReader(tmp_path / "idx")
    kinds = sorted({k[0] for k in reader.items()})
    reader.close()
    assert kinds == ["chain", "salt", "served", "session", "used"]
    assert not marker.exists() and not os.path.exists("/tmp/never")
