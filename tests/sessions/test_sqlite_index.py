"""The embedded index on plain SQLite tables (``sessions/index/sqlite.py``), where it differs from the others (the
``SessionIndex`` contract runs on every backend in ``test_redis_index.py``):

1. Hostile or damaged content, written straight into its tables as any writer of the state directory could: values
   of the wrong type, bytes that are no record, text that is not UTF-8, a last use that is no number, a salt that is
   no text: each reads as absent (or is replaced), never as a failed call; nothing is ever unpickled.
2. A file that is no database, or whose tables are shaped otherwise, is moved aside and a fresh index started.
3. A process killed mid-stream (SIGKILL) loses no save it reported committed.
4. A save keeps what decoding its bytes gives; a lookup reads the bytes and decodes them only when they changed.
5. A prune gives its pages back (``volume`` shrinks), and takes everything that carries the session's id.
"""

from __future__ import annotations

import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.index import SnapshotRecord, TraceLog
from pflash_proxy.sessions.index import sqlite as sqlite_module
from pflash_proxy.sessions.index.base import as_stored
from pflash_proxy.sessions.index.codec import decode, encode
from pflash_proxy.sessions.index.sqlite import SqliteIndex

BAD = b"\xff\xfe\x80 not utf-8 \xc3"
ROOT = Path(__file__).resolve().parents[2]


def msgs(*texts: str) -> list[dict[str, object]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def save(index, seed: str, messages: list[dict[str, object]]):
    rec, _, hashes = index.lookup(seed, messages)
    rec = rec or index.new_session(seed, False)
    index.save_session(rec, hashes, messages)
    return rec


class Pickled:  # what a pickle planted in the index would build, if anything unpickled it
    ran: list[str] = []

    def __reduce__(self):
        return (Pickled.ran.append, ("unpickled",))


def test_hostile_rows_in_every_table_read_as_absent(tmp_path, caplog):
    index = SqliteIndex(tmp_path / "idx")
    rec = save(index, "seed", msgs("hello", "hi"))
    index.put_snapshot(SnapshotRecord(session=rec.id, file=f"pf-{rec.id}.bin", tokens=5, served_hashes=["h"],
                                      model_identity="m", size=10))
    assert index.put_response("r1", {"session": rec.id, "items": []})
    planted = pickle.dumps(Pickled())
    raw = sqlite3.connect(index.db)
    with raw:
        raw.execute("INSERT INTO chain VALUES (?, ?)", ("planted-int", 7))
        raw.execute("INSERT INTO chain VALUES (?, CAST(? AS TEXT))", ("planted-bad", BAD))
        for n, value in enumerate((planted, BAD, 3.5, "text, not a record", None)):
            raw.execute("INSERT INTO session VALUES (?, ?, ?)", (f"planted{n}", n, value if value is not None else b""))
        raw.execute("INSERT INTO session VALUES (CAST(? AS TEXT), 'not a time', ?)", (BAD, planted))
        raw.execute("INSERT INTO served VALUES ('planted0', 0, ?)", (planted,))
        raw.execute("INSERT INTO recall VALUES ('planted', 'planted0', ?)", (BAD,))
        raw.execute("INSERT INTO traces VALUES ('planted0', ?)", (planted,))
        raw.execute("INSERT INTO trace_part VALUES ('planted0', 'k', ?)", (BAD,))
        raw.execute("INSERT INTO snapshot VALUES ('planted', ?)", (planted,))
        raw.execute("INSERT INTO snapshot VALUES (CAST(? AS TEXT), ?)", (BAD, BAD))
        other = SnapshotRecord(session=rec.id, file="pf-x.bin", tokens=1, served_hashes=[], model_identity="m", size=1)
        raw.execute("INSERT INTO snapshot VALUES ('someone-else', ?)", (encode("snapshot", other),))
        raw.execute("INSERT INTO response (rid, sid, data) VALUES ('planted', ?, ?)", (rec.id, planted))
        raw.execute("INSERT INTO response (rid, sid, data) VALUES (CAST(? AS TEXT), 'x', ?)", (BAD, BAD))
    raw.close()
    fresh = SqliteIndex(tmp_path / "idx")  # nothing cached: everything is read from the tables
    try:
        for sid in ("planted0", "planted1", "planted2", "planted3", "planted4", BAD.decode("utf-8", "replace")):
            assert fresh.get(sid) is None and fresh.trace_log(sid) is None and fresh.snapshot(sid) is None
        assert fresh.response("planted") is None and fresh.last_response(rec.id) == "planted"  # its id, not its value
        assert [s.session for s in fresh.snapshots()] == [rec.id]  # another session's record is not this one's
        found, matched, _ = fresh.lookup("seed", msgs("hello", "hi", "more"))
        assert found is not None and found.id == rec.id and matched == 2
        uses = fresh.last_uses()
        assert uses[rec.id] > 1e9 and min(uses.values()) == 0.0  # 'not a time' ranks oldest
        assert fresh.count_sessions() == 7 and [r.id for r in fresh.sessions()] == [rec.id]
        assert rec.id not in fresh.prune(older_than=None, max_sessions=1)
        assert fresh.get(rec.id) is not None
    finally:
        fresh.close()
        index.close()
    assert Pickled.ran == [] and "not a readable" in caplog.text


def test_a_salt_that_is_not_text_is_replaced(tmp_path, caplog):
    index = SqliteIndex(tmp_path / "idx")
    salt = index.salt
    index.close()
    again = SqliteIndex(tmp_path / "idx")
    assert again.salt == salt  # the same across restarts
    again._conn().execute("UPDATE meta SET value = ? WHERE name = 'salt'", (BAD,))
    again.close()
    replaced = SqliteIndex(tmp_path / "idx")
    assert isinstance(replaced.salt, str) and len(replaced.salt) == 32 and replaced.salt != salt
    replaced.close()
    assert "salt is not text" in caplog.text


@pytest.mark.parametrize("damage", ["not a database", "foreign table"])
def test_a_damaged_index_is_moved_aside_and_a_fresh_one_started(tmp_path, damage, caplog):
    d = tmp_path / "idx"
    index = SqliteIndex(d)
    save(index, "seed", msgs("hello"))
    index.close()
    for suffix in ("-wal", "-shm"):
        Path(str(index.db) + suffix).unlink(missing_ok=True)
    if damage == "not a database":
        index.db.write_bytes(b"garbage " * 512)
    else:
        raw = sqlite3.connect(index.db)
        raw.executescript("DROP TABLE session; CREATE TABLE session (x)")
        raw.close()
    fresh = SqliteIndex(d)
    try:
        assert fresh.count_sessions() == 0 and fresh.lookup("seed", msgs("hello"))[0] is None
        save(fresh, "seed", msgs("hello again"))
        assert fresh.count_sessions() == 1
    finally:
        fresh.close()
    assert [p.name for p in d.glob("index.db.corrupt-*")] and "moved aside" in caplog.text


def _recall_source():
    from tests.sessions.test_redis_index import _recall_source as make

    return make("amber")


_WRITER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from pflash_proxy.sessions.index.sqlite import SqliteIndex
index = SqliteIndex(Path({directory!r}))
for n in range(10**9):
    rec = index.new_session("seed", False)
    messages = [{{"role": "user", "content": "conversation %d " % n + "x" * 3000}}]
    index.save_session(rec, ["h%d" % n], messages)
    print(rec.id, flush=True)
"""


def test_a_killed_writer_loses_no_committed_save(tmp_path):
    d = tmp_path / "idx"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER.format(root=str(ROOT), directory=str(d))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    committed = [proc.stdout.readline().strip() for _ in range(50)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    index = SqliteIndex(d)
    try:
        assert all(index.get(sid) is not None for sid in committed)
        assert index.count_sessions() >= 50
    finally:
        index.close()


def test_a_save_keeps_what_decoding_its_bytes_gives_and_a_lookup_decodes_changed_bytes_only(tmp_path, monkeypatch):
    index = SqliteIndex(tmp_path / "idx")
    rec = index.new_session("seed", False, owner="o")
    rec.recall_sources = [_recall_source()]
    history = msgs("one", "two")
    index.save_session(rec, index.lookup("seed", history)[2], history)
    data = index._conn().execute("SELECT data FROM session WHERE sid = ?", (rec.id,)).fetchone()[0]
    kept_bytes, kept = index._decodes.get(rec.id)
    assert kept_bytes == data and kept == decode("session", data) == as_stored(rec)
    decoded = []
    real = sqlite_module.decode
    monkeypatch.setattr(sqlite_module, "decode", lambda *a: decoded.append(a[0]) or real(*a))
    first = index.lookup("seed", history + msgs("three"))[0]
    second = index.lookup("seed", history + msgs("three"))[0]
    assert decoded == [] and first is not second and first.served is not second.served
    first.client_hashes.append("x")
    assert "x" not in index.lookup("seed", history + msgs("three"))[0].client_hashes  # each reader its own lists
    other = SqliteIndex(tmp_path / "idx")  # another writer changes the bytes: read, decoded, not the kept record
    found = other.lookup("seed", history + msgs("three"))[0]
    found.trace_totals["recalls"] = 5
    other.update_record(found)
    other.close()
    decoded.clear()
    assert index.get(rec.id).trace_totals == {"recalls": 5} and decoded == ["session"]
    index.close()


def test_a_prune_gives_pages_back_and_leaves_no_row_of_the_session(tmp_path):
    index = SqliteIndex(tmp_path / "idx")
    ids = []
    for i in range(30):
        rec = save(index, f"seed{i}", msgs(*(f"{i}: " + "lorem ipsum " * 400 for _ in range(4))))
        index.update_trace_log(rec.id, lambda kept: TraceLog([{"kind": "turn", "text": "t" * 5000}], {}))
        index.put_response(f"r{i}", {"session": rec.id})
        ids.append(rec.id)
    c = index._conn()
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before, file_before = index.volume(), index.db.stat().st_size
    assert index.prune(older_than=None, max_sessions=3) == ids[:27]
    assert index.volume() < before / 3
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert index.db.stat().st_size < file_before / 3  # the file itself, not only its count of pages in use
    for table in ("session", "served", "recall", "traces", "trace_part", "response"):
        assert {sid for (sid,) in c.execute(f"SELECT DISTINCT sid FROM {table}")} <= set(ids[27:]), table
    assert {sid for (sid,) in c.execute("SELECT DISTINCT sid FROM chain")} == set(ids[27:])
    index.close()


def test_a_lookup_of_a_long_request_the_index_never_saw_and_of_an_old_prefix(tmp_path):
    """The longest prefixes are read one by one, the rest in one query: both find the longest stored one."""
    index = SqliteIndex(tmp_path / "idx")
    long = msgs(*(f"message {i}" for i in range(sqlite_module._IN_CHUNK + 30)))
    rec = save(index, "seed", long[:3])
    found, matched, hashes = index.lookup("seed", long)
    assert found is not None and found.id == rec.id and matched == 3 and len(hashes) == len(long)
    assert hashes == [message_hash(m) for m in long]
    assert index.lookup("seed", msgs("nothing", "like", "it"))[0] is None
    index.close()


def test_writes_wait_for_each_other_and_reads_never_wait(tmp_path):
    """Each thread has its own connection: a reader reads while another thread holds the write lock."""
    import threading

    index = SqliteIndex(tmp_path / "idx")
    rec = save(index, "seed", msgs("hello"))
    inside, release = threading.Event(), threading.Event()

    def slow_update(kept: TraceLog) -> TraceLog:
        inside.set()
        release.wait(10)
        return TraceLog([{"kind": "turn"}], {})
    writer = threading.Thread(target=index.update_trace_log, args=(rec.id, slow_update))
    writer.start()
    assert inside.wait(10)
    t0 = time.monotonic()
    assert index.get(rec.id) is not None and index.lookup("seed", msgs("hello", "x"))[1] == 1
    assert time.monotonic() - t0 < 1
    release.set()
    writer.join()
    assert index.trace_log(rec.id).traces == [{"kind": "turn"}]
    index.close()


CLOSE_RACE = '''
import sys, threading, time
from pathlib import Path
from pflash_proxy.sessions.index import open_index
from pflash_proxy.sessions.index.base import StoreError
index = open_index(Path(sys.argv[1]), "sqlite")
for i in range(300):
    rec = index.new_session(f"seed{i}", False)
    msgs = [{"role": "user", "content": f"{i} " + "word " * 200}]
    index.save_session(rec, index.lookup(f"seed{i}", msgs)[2], msgs)
stop, errors = threading.Event(), []
def read():
    while not stop.is_set():
        try:
            index.last_uses(); index.sessions()
        except StoreError:
            return
        except Exception as exc:
            errors.append(repr(exc)); return
threads = [threading.Thread(target=read) for _ in range(4)]
for t in threads: t.start()
time.sleep(0.3)
index.close()
stop.set()
for t in threads: t.join()
print("closed", errors)
'''


def test_closing_while_other_threads_read_waits_for_them_and_never_crashes(tmp_path):
    """The proxy's stop closes the index while a prune or lookup may still run in a worker thread: ``close`` waits
    for calls in flight (closing a connection another thread reads from crashed the interpreter, SIGSEGV, 5 of 5
    runs), and a call after it fails as the index's own error."""
    r = subprocess.run([sys.executable, "-c", CLOSE_RACE, str(tmp_path / "idx")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "closed []"
