"""``SqliteIndex``: this proxy's ``SessionIndex``, SQLite tables (``sqlite3``, WAL) in one file, ``index.db``.

Every value is a ``codec`` record (validated when read; one that is not reads as absent, nothing is unpickled);
every key a column:

1. ``chain(h, sid)``: each prefix of each served request → its session (``identity.chain``);
2. ``session(sid, last_use, data)``: the ``SessionRecord``, its last use apart so pruning reads no record;
   ``served(sid, pos, data)``: one served message; ``recall(key, sid, data)``: one recall source (both written
   once, by the save that added them);
3. ``traces(sid, data)``: the session's ``TraceLog``; ``trace_part(sid, key, data)``: one trace's text or units;
4. ``snapshot(sid, data)``: the ``SnapshotRecord`` (also held in memory, read on the event loop);
5. ``response(seq, rid, sid, data)``: one Responses answer, in the order recorded;
6. ``meta(name, value)``: the ``salt`` credentials are hashed with.

Each thread has its own connection. A lookup is one read transaction; a write one ``BEGIN IMMEDIATE``
transaction; a prune deletes everything that carries the session's id in one. Text that is not UTF-8 reads with
replacement characters; a last use that is not a number ranks oldest. A file that is no database of these tables
is moved aside (``index.db.corrupt-<time>``) and a fresh one started; SQLite's failures raise ``StoreError``.
Opening reads a diskcache index of older versions in the same directory once (``migrate``).
"""

from __future__ import annotations

import functools
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

from pflash_proxy.config import private_dir
from pflash_proxy.sessions.identity import chain, message_hash
from pflash_proxy.sessions.lru import ValueCache, footprint
from pflash_proxy.sessions.index.base import (SessionRecord, SnapshotRecord, StoreError, TraceLog, begin_save,
                                              WriteMarks, as_stored, fresh, prune_victims)
from pflash_proxy.sessions.index.codec import Key, PartWrites, RecordError, RecordParts, TraceParts, decode, encode
from pflash_proxy.sessions.index.codec import snapshot_records
from pflash_proxy.sessions.index.legacy import FILE as OLD_FILE, DiskcacheReader
from pflash_proxy.sessions.index.codec import trace_log as stored_trace_log

log = logging.getLogger("pflash_proxy.sessions")
T = TypeVar("T")
P = ParamSpec("P")

FILE = "index.db"
BUSY_TIMEOUT_S = 60  # a writer waits this long for another's transaction
DECODED_BYTES = 32 << 20  # the records kept decoded beside their bytes (``SqliteIndex._record``), at most
DECODED_RECORDS = 1024  # and how many
_PROBES = 4  # the longest prefixes a lookup reads one by one (``_entries``)
_IN_CHUNK = 500  # chain entries asked in one query (SQLite's bound on parameters is far above)
_TABLES = {  # name -> its columns (``_check`` reads each, so a table shaped otherwise is a damaged index)
    "meta": "name TEXT PRIMARY KEY, value",
    "chain": "h TEXT PRIMARY KEY, sid TEXT NOT NULL",
    "session": "sid TEXT PRIMARY KEY, last_use REAL NOT NULL, data BLOB NOT NULL",
    "served": "sid TEXT NOT NULL, pos INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (sid, pos)",
    "recall": "key TEXT PRIMARY KEY, sid TEXT NOT NULL, data BLOB NOT NULL",
    "traces": "sid TEXT PRIMARY KEY, data BLOB NOT NULL",
    "trace_part": "sid TEXT NOT NULL, key TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (sid, key)",
    "snapshot": "sid TEXT PRIMARY KEY, data BLOB NOT NULL",
    "response": "seq INTEGER PRIMARY KEY, rid TEXT NOT NULL UNIQUE, sid TEXT NOT NULL, data BLOB NOT NULL",
}
_SCHEMA = "".join(f"CREATE TABLE IF NOT EXISTS {name} ({cols});" for name, cols in _TABLES.items()) + \
    "CREATE INDEX IF NOT EXISTS recall_sid ON recall (sid);" \
    "CREATE INDEX IF NOT EXISTS response_sid ON response (sid, seq);"
_COLUMNS = {name: [c.split()[0] for c in cols.split(", ") if c.split()[0].isidentifier() and c.split()[0] != "PRIMARY"]
            for name, cols in _TABLES.items()}


def _guarded(fn: Callable[P, T]) -> Callable[P, T]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kw: P.kwargs) -> T:
        index = args[0]
        assert isinstance(index, SqliteIndex)
        with index._idle:  # counted in flight: ``close`` waits for it before it closes the connections
            index._active += 1
        try:
            return fn(*args, **kw)
        except (sqlite3.Error, OSError, RecordError) as exc:
            raise StoreError(f"session index: {type(exc).__name__}: {exc}") from exc
        finally:
            with index._idle:
                index._active -= 1
                if not index._active:
                    index._idle.notify_all()
    return wrapper


def _text(data: bytes) -> str:
    """A TEXT value as read: bytes that are not UTF-8 get replacement characters (they name no real key)."""
    return data.decode("utf-8", "replace")


def _connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.text_factory = _text
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a crash of the process (not of the OS)
    # 8192 pages cached, and up to 64 MiB of the file read through a shared mapping (recall sources are large rows)
    conn.execute("PRAGMA cache_size=8192")
    conn.execute("PRAGMA mmap_size=67108864")
    return conn


def _check(conn: sqlite3.Connection) -> None:
    """Create the tables (a new index), or read each table's columns: a file that is not a database, or one whose
    tables are shaped otherwise, raises ``sqlite3.DatabaseError``."""
    conn.execute("PRAGMA auto_vacuum=FULL")  # a new file only: each commit gives freed pages back
    if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
        raise sqlite3.DatabaseError("journal mode is not WAL")
    conn.executescript(_SCHEMA)
    for name, cols in _COLUMNS.items():
        conn.execute(f"SELECT {', '.join(cols)} FROM {name} LIMIT 0").fetchall()


def _move_aside(db: Path, tag: str) -> str:
    """Rename ``db`` and its ``-wal``/``-shm`` files to ``<name>.<tag>-<time>``; returns that name."""
    aside = f"{db.name}.{tag}-{int(time.time())}"
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(db) + suffix)
        if p.exists():
            p.replace(db.with_name(aside + suffix))
    return aside


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    """``exc`` says the file is damaged or foreign, not merely in use."""
    return getattr(exc, "sqlite_errorcode", None) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _open(directory: Path) -> Path:
    """The index's database file, checked (``_check``); a damaged one is moved aside and a fresh one started."""
    db = directory / FILE
    try:
        conn = _connect(db)
        try:
            _check(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        if not _damaged(exc):
            raise StoreError(f"session index {db}: {exc}") from exc
        aside = _move_aside(db, "corrupt")
        log.error("session index %s is damaged (%s); moved aside to %s, starting a fresh index", db, exc, aside)
        conn = _connect(db)
        try:
            _check(conn)
        finally:
            conn.close()
    return db


def migrate(directory: Path, db: Path) -> int:
    """Copy the diskcache index older proxies kept in ``directory`` (``OLD_FILE``) into ``db`` in one
    transaction (values copied as stored, validated when read), then move its file aside (``.migrated-<time>``;
    ``.corrupt-<time>`` when it is no readable index). Done again at the next open if cut short. Returns the
    sessions copied."""
    try:
        old = DiskcacheReader(directory)
    except sqlite3.DatabaseError as exc:
        if not _damaged(exc):
            raise
        aside = _move_aside(directory / OLD_FILE, "corrupt")
        log.error("session index: the diskcache index in %s is damaged (%s); moved aside to %s", directory, exc, aside)
        return 0
    try:
        values = old.items()
    finally:
        old.close()
    salt, rows = values.get(("salt",)), _old_rows(values)
    conn = _connect(db)
    try:
        conn.execute("BEGIN IMMEDIATE")
        if isinstance(salt, str) and salt:
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('salt', ?)", (salt,))
        for table, found in rows.items():
            columns = _COLUMNS[table][1:] if table == "response" else _COLUMNS[table]  # ``seq``: the order inserted
            conn.executemany(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) "
                             f"VALUES ({', '.join('?' * len(columns))})", found)
        conn.execute("COMMIT")
    finally:
        conn.close()
    aside = _move_aside(directory / OLD_FILE, "migrated")
    log.info("session index: %d sessions read from the diskcache index in %s; its file moved aside to %s",
             len(rows["session"]), directory, aside)
    return len(rows["session"])


def _old_rows(values: dict[Key, object]) -> dict[str, list[tuple[object, ...]]]:
    """The rows of each table that hold the diskcache index's ``values`` (by key), as stored. A session whose
    record does not read is left out with its parts, as are recall sources no record names and responses no
    session lists."""
    rows: dict[str, list[tuple[object, ...]]] = {name: [] for name in _TABLES if name != "meta"}
    records = {k[1]: rec for k, v in values.items() if k[0] == "session" and len(k) == 2 and v
               and (rec := decode("session", v, f"session {k[1][:40]}")) is not None and rec.id == k[1]}
    recall_owner = {key: sid for sid, rec in records.items() for key in rec.recall_keys}
    for key, value in values.items():
        kind, rest = key[0], key[1:]
        if value is None or (len(rest) > 1 and kind not in ("served", "trace-part")):
            continue
        if kind == "chain" and isinstance(value, str):
            rows["chain"].append((rest[0], value))
        elif kind == "session" and rest[0] in records:
            used = values.get(("used", rest[0]))
            rows["session"].append((rest[0], used if isinstance(used, (int, float)) else records[rest[0]].last_use,
                                    value))
        elif kind == "served" and len(rest) == 2 and rest[1].isdigit() and rest[0] in records:
            rows["served"].append((rest[0], int(rest[1]), value))
        elif kind == "recall" and rest[0] in recall_owner:
            rows["recall"].append((rest[0], recall_owner[rest[0]], value))
        elif kind in ("traces", "snapshot", "trace-part") and len(rest) == (2 if kind == "trace-part" else 1):
            rows[kind.replace("-", "_")].append((*rest, value))
        elif kind == "responses" and isinstance(ids := decode("ids", value, f"responses of {rest[0][:40]}"), list):
            rows["response"].extend((rid, rest[0], data) for rid in ids
                                    if (data := values.get(("response", rid))) is not None)
    return rows


class SqliteIndex(WriteMarks):
    """The embedded ``SessionIndex`` on SQLite tables (module docstring)."""

    remote = False  # local SQLite, the snapshot records in memory

    def __init__(self, directory: Path):
        super().__init__()
        private_dir(directory)
        self.db = _open(directory)
        if (directory / OLD_FILE).exists():
            try:
                migrate(directory, self.db)
            except (StoreError, sqlite3.Error, OSError) as exc:  # the old file stays: tried again at the next open
                log.error("session index: the diskcache index in %s could not be read (%s); starting without its "
                          "sessions", directory, exc)
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        self._active = 0  # the calls in flight (``_guarded``), and the condition ``close`` waits on for none
        self._idle = threading.Condition()
        self._snaps: dict[str, SnapshotRecord] | None = None  # the snapshot records in memory (``snapshots``)
        self._snaps_lock = threading.RLock()
        self.parts = RecordParts()  # the records' served messages and recall sources, byte-bounded in memory
        # session id -> a record's stored bytes and the record decoded from them (``_record``), byte-bounded
        self._decodes: ValueCache[tuple[bytes, SessionRecord]] = ValueCache(DECODED_BYTES, DECODED_RECORDS)
        self.salt = self._salt()

    # Connections and transactions -----------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (opened at its first call)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise sqlite3.ProgrammingError("the session index is closed")
            conn = self._local.conn = _connect(self.db)
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def _tx(self, begin: str = "BEGIN IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """One transaction on this thread's connection: ``BEGIN IMMEDIATE`` (a write: it holds the write lock from
        the start, so what it reads is what it changes) or ``BEGIN`` (reads, one consistent view)."""
        conn = self._conn()
        conn.execute(begin)
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self, wait_s: float = 30) -> None:
        """Close every thread's connection once no call is in flight on any of them (closing a connection another
        thread is reading from crashes the interpreter); a call begun after it fails with ``StoreError``. A call
        still running after ``wait_s`` keeps the connections open (they close when collected), logged."""
        self._closed = True
        with self._idle:
            if not self._idle.wait_for(lambda: not self._active, wait_s):
                log.warning("session index: %d calls still running after %.0f s; its connections are left open",
                            self._active, wait_s)
                return
            with self._conns_lock:
                conns, self._conns = self._conns, []
            for conn in conns:
                conn.close()

    def as_cluster(self) -> None:
        return None  # this proxy's own

    @_guarded
    def _salt(self) -> str:
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO meta VALUES ('salt', ?)", (secrets.token_hex(16),))
            salt = c.execute("SELECT value FROM meta WHERE name = 'salt'").fetchone()[0]
            if not isinstance(salt, str) or not salt:
                log.warning("session index: the stored salt is not text; a new one is written")
                salt = secrets.token_hex(16)
                c.execute("UPDATE meta SET value = ? WHERE name = 'salt'", (salt,))
        return salt

    # Sessions ---------------------------------------------------------------------------------------------------
    @_guarded
    def lookup(self, seed: str, messages: Sequence[Mapping[str, object]]
               ) -> tuple[SessionRecord | None, int, list[str]]:
        """Longest served prefix: (session, number of leading messages it covers, client hashes). One query
        finds every chain entry of the request; the record of the longest is read, then shorter ones only when
        it cannot continue the request."""
        hashes = [message_hash(m) for m in messages]
        values = chain(seed, hashes)
        with self._tx("BEGIN") as c:
            unreadable: set[str] = set()
            for i, sid in self._entries(c, values):
                if not isinstance(sid, str) or sid in unreadable:
                    continue
                rec = self._record(c, sid)
                if rec is None or not self.parts.load_served(rec, functools.partial(self._read_parts, c)):
                    unreadable.add(sid)
                    continue
                if rec.continued_by(hashes, i + 1):
                    self.parts.load_recall(rec, functools.partial(self._read_parts, c))
                    return rec, i + 1, hashes
        return None, 0, hashes

    @staticmethod
    def _entries(c: sqlite3.Connection, values: list[str]) -> Iterator[tuple[int, object]]:
        """The chain entries stored for ``values`` as (position, session id), the longest prefix first, read as
        they are needed: the ``_PROBES`` longest one by one (a continued session's history is the second
        longest: its request adds a message), the rest in one query per ``_IN_CHUNK`` (a request the index
        never saw misses them all)."""
        end = len(values)
        for i in range(end - 1, max(-1, end - 1 - _PROBES), -1):
            row = c.execute("SELECT sid FROM chain WHERE h = ?", (values[i],)).fetchone()
            if row is not None:
                yield i, row[0]
        end = max(0, end - _PROBES)
        while end > 0:
            start = max(0, end - _IN_CHUNK)
            rows = ", ".join(["(?, ?)"] * (end - start))
            params = [x for i in range(start, end) for x in (i, values[i])]
            yield from c.execute(f"WITH q(i, h) AS (VALUES {rows}) SELECT q.i, chain.sid FROM q JOIN chain "
                                 "ON chain.h = q.h ORDER BY q.i DESC", params)
            end = start

    def _record(self, c: sqlite3.Connection, sid: str) -> SessionRecord | None:
        """The record as stored (None: nothing, unreadable, or another session's). The record decoded from the
        bytes read last time is kept beside them (``_decodes``), and a copy of it returned while the stored bytes
        are the same."""
        row = c.execute("SELECT data FROM session WHERE sid = ?", (sid,)).fetchone()
        if not row:
            return None
        data = row[0]
        kept = self._decodes.get(sid)
        if kept is not None and kept[0] == data:
            return fresh(kept[1])
        rec: SessionRecord | None = decode("session", data, f"session {sid[:40]}")
        if rec is None or rec.id != sid:
            return None
        if isinstance(data, bytes):
            self._keep(sid, data, fresh(rec))
        return rec

    def _read_parts(self, c: sqlite3.Connection, keys: list[Key]) -> list[object]:
        """The stored values of ``codec``'s part keys (None for one that is gone): a session's served messages in
        one query, recall sources and trace parts each by key."""
        if keys and all(k[0] == "served" and k[1] == keys[0][1] and k[2].isdigit() for k in keys):
            positions = [int(k[2]) for k in keys]
            rows = c.execute("SELECT pos, data FROM served WHERE sid = ? AND pos BETWEEN ? AND ?",
                             (keys[0][1], min(positions), max(positions))).fetchall()
            by_pos = dict(rows)
            return [by_pos.get(i) for i in positions]
        out: list[object] = []
        for key in keys:
            if key[0] == "recall":
                row = c.execute("SELECT data FROM recall WHERE key = ?", (key[1],)).fetchone()
            elif key[0] == "trace-part":
                row = c.execute("SELECT data FROM trace_part WHERE sid = ? AND key = ?", key[1:]).fetchone()
            elif key[0] == "served" and key[2].isdigit():
                row = c.execute("SELECT data FROM served WHERE sid = ? AND pos = ?", (key[1], int(key[2]))).fetchone()
            else:
                row = None
            out.append(row[0] if row else None)
        return out

    @staticmethod
    def _write_part(c: sqlite3.Connection, sid: str, key: Key, data: bytes) -> None:
        if key[0] == "served":
            c.execute("INSERT OR REPLACE INTO served VALUES (?, ?, ?)", (sid, int(key[2]), data))
        elif key[0] == "recall":
            c.execute("INSERT OR REPLACE INTO recall VALUES (?, ?, ?)", (key[1], sid, data))
        elif key[0] == "trace-part":
            c.execute("INSERT OR REPLACE INTO trace_part VALUES (?, ?, ?)", (sid, key[2], data))
        else:
            raise RecordError(f"no table for a part under {key[0]!r}")

    @_guarded
    def get(self, sid: str) -> SessionRecord | None:
        with self._tx("BEGIN") as c:
            rec = self._record(c, sid)
            if rec is None or not self.parts.load_served(rec, functools.partial(self._read_parts, c)):
                return None
            return rec

    def new_session(self, seed: str, explicit: bool, parent: SessionRecord | None = None, upto: int = 0,
                    owner: str | None = None) -> SessionRecord:
        return SessionRecord.new(seed, explicit, parent, upto, owner)

    @_guarded
    def save_session(self, rec: SessionRecord, client_hashes: list[str], served: Sequence[dict[str, object]]) -> None:
        entries = begin_save(rec, client_hashes, served)
        with self.writing():
            with self._tx() as c:
                writes, data = self._put(c, rec)
                c.executemany("INSERT OR REPLACE INTO chain VALUES (?, ?)", [(h, rec.id) for h in entries])
            self._committed(rec, writes, data)

    @_guarded
    def update_record(self, rec: SessionRecord) -> None:
        """Write ``rec`` back as it is (marked as a write: a lookup that read it before reads it again)."""
        with self.writing():
            with self._tx() as c:
                writes, data = self._put(c, rec)
            self._committed(rec, writes, data)

    def _put(self, c: sqlite3.Connection, rec: SessionRecord) -> tuple[PartWrites, bytes]:
        """Write the record in the caller's transaction, its new served messages and recall sources first; the
        caller hands what it returns to ``_committed`` once that transaction committed."""
        writes = self.parts.new(rec)
        for key, value in writes.values:
            self._write_part(c, rec.id, key, value)
        data = encode("session", rec)
        c.execute("INSERT OR REPLACE INTO session VALUES (?, ?, ?)", (rec.id, rec.last_use, data))
        return writes, data

    def _committed(self, rec: SessionRecord, writes: PartWrites, data: bytes) -> None:
        """After a save of ``rec`` as ``data`` committed: the parts cache takes its new messages, and the record
        decoding ``data`` gives is kept beside it (the session's next lookup reads these very bytes)."""
        self.parts.committed(writes)
        self._keep(rec.id, data, as_stored(rec))

    def _keep(self, sid: str, data: bytes, rec: SessionRecord) -> None:
        self._decodes.put(sid, (data, rec), footprint(sid) + footprint(data) + footprint(rec))

    @_guarded
    def trace_log(self, sid: str) -> TraceLog | None:
        with self._tx("BEGIN") as c:
            row = c.execute("SELECT data FROM traces WHERE sid = ?", (sid,)).fetchone()
            kept = stored_trace_log(row[0] if row else None, f"traces of {sid[:40]}")
            return None if kept is None else TraceParts.joined(sid, kept, functools.partial(self._read_parts, c))

    @_guarded
    def update_trace_log(self, sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog | None:
        """One write transaction: read, ``update``, write (the new texts and units as parts, those the log no
        longer names deleted: ``TraceParts``), and the session's last use."""
        with self._tx() as c:
            if c.execute("SELECT 1 FROM session WHERE sid = ?", (sid,)).fetchone() is None:
                return None
            row = c.execute("SELECT data FROM traces WHERE sid = ?", (sid,)).fetchone()
            kept = stored_trace_log(row[0] if row else None, f"traces of {sid[:40]}") or TraceLog()
            write = TraceParts.update(sid, kept, update)
            for key, data in write.writes:
                self._write_part(c, sid, key, data)
            c.executemany("DELETE FROM trace_part WHERE sid = ? AND key = ?", [k[1:] for k in write.gone])
            c.execute("INSERT OR REPLACE INTO traces VALUES (?, ?)", (sid, write.log))
            c.execute("UPDATE session SET last_use = ? WHERE sid = ?", (time.time(), sid))
        return write.new

    def _last_uses(self) -> dict[str, float]:
        """Every session's last use; one that is not a number reads as 0 (the oldest: pruned first)."""
        rows = self._conn().execute("SELECT sid, last_use FROM session").fetchall()
        return {sid: float(t) if isinstance(t, (int, float)) else 0.0 for sid, t in rows}

    @_guarded
    def prune(self, *, older_than: float | None, max_sessions: int,
              keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Forget sessions last used before ``older_than`` (epoch s; None = no age limit), then the least
        recently used beyond ``max_sessions``; never one in ``keep``. Each victim goes in one transaction with
        everything that carries its id, and the chain entries that still point at it (a fork that took over a
        shared prefix keeps those). Returns the removed ids; their snapshots are the caller's to delete."""
        with self.writing():
            ranked = sorted(self._last_uses().items(), key=lambda kv: kv[1])
            victims = prune_victims(ranked, older_than, max_sessions, keep)
            for sid in victims:
                with self._tx() as c:
                    rec = self._record(c, sid)
                    for table in ("session", "served", "recall", "traces", "trace_part", "response"):
                        c.execute(f"DELETE FROM {table} WHERE sid = ?", (sid,))
                    if rec is not None:
                        c.executemany("DELETE FROM chain WHERE h = ? AND sid = ?",
                                      [(h, sid) for h in chain(rec.seed, rec.client_hashes)])
                if rec is not None:
                    self.parts.forget(rec)
        return victims

    # Responses (stages/chains.py) ---------------------------------------------------------------------------------
    @_guarded
    def response(self, rid: str) -> dict[str, object] | None:
        row = self._conn().execute("SELECT data FROM response WHERE rid = ?", (rid,)).fetchone()
        entry = decode("response", row[0], f"response {rid[:40]}") if row else None
        return entry if isinstance(entry, dict) else None

    @_guarded
    def last_response(self, sid: str) -> str | None:
        row = self._conn().execute("SELECT rid FROM response WHERE sid = ? ORDER BY seq DESC LIMIT 1",
                                   (sid,)).fetchone()
        return row[0] if row and isinstance(row[0], str) else None

    @_guarded
    def put_response(self, rid: str, entry: Mapping[str, object]) -> bool:
        """Record response ``rid`` (``entry["session"]`` owns it); False when that session is gone meanwhile."""
        sid = str(entry["session"])
        data = encode("response", entry)
        with self._tx() as c:
            if c.execute("SELECT 1 FROM session WHERE sid = ?", (sid,)).fetchone() is None:
                return False
            c.execute("INSERT OR REPLACE INTO response (rid, sid, data) VALUES (?, ?, ?)", (rid, sid, data))
        return True

    @_guarded
    def last_uses(self) -> dict[str, float]:
        return self._last_uses()

    @_guarded
    def count_sessions(self) -> int:
        return int(self._conn().execute("SELECT count(*) FROM session").fetchone()[0])

    @_guarded
    def sessions(self) -> list[SessionRecord]:
        sids = [sid for (sid,) in self._conn().execute("SELECT sid FROM session").fetchall()]
        return [rec for sid in sids if (rec := self.get(sid)) is not None]

    @_guarded
    def volume(self) -> int:
        """Bytes the index's pages in use take (its file less free pages; the write-ahead log is checkpointed
        into it)."""
        c = self._conn()
        pages = c.execute("PRAGMA page_count").fetchone()[0] - c.execute("PRAGMA freelist_count").fetchone()[0]
        return int(pages * c.execute("PRAGMA page_size").fetchone()[0])

    # Snapshots ----------------------------------------------------------------------------------------------------
    def _snapshot_index(self) -> dict[str, SnapshotRecord]:
        with self._snaps_lock:
            if self._snaps is None:
                self._snaps = snapshot_records(self._conn().execute("SELECT sid, data FROM snapshot").fetchall())
            return self._snaps

    @_guarded
    def snapshot(self, sid: str) -> SnapshotRecord | None:
        return self._snapshot_index().get(sid)

    @_guarded
    def put_snapshot(self, rec: SnapshotRecord) -> None:
        with self._snaps_lock:
            self._conn().execute("INSERT OR REPLACE INTO snapshot VALUES (?, ?)", (rec.session, encode("snapshot", rec)))
            self._snapshot_index()[rec.session] = rec

    @_guarded
    def drop_snapshot(self, sid: str) -> SnapshotRecord | None:
        with self._snaps_lock:
            rec = self._snapshot_index().pop(sid, None)
            self._conn().execute("DELETE FROM snapshot WHERE sid = ?", (sid,))
            return rec

    @_guarded
    def snapshots(self) -> list[SnapshotRecord]:
        with self._snaps_lock:
            return list(self._snapshot_index().values())
