"""Persisted session state in one ``diskcache.Cache`` (SQLite: every write is an atomic transaction).

Values are plain data: a session id, a salt or a time as itself, every record as schema-versioned JSON
(``codec.py``), validated when read; a value that is not a readable record (one an older version pickled, or
anything else) is logged and read as absent, never unpickled. Keys are tuples of strings; they are read back
(listing the index) by parsing their bytes, never by unpickling them.

Keys:
1. ``("chain", h_i)`` → session id, for every prefix of every served request (see ``identity``);
2. ``("session", sid)`` → ``SessionRecord``: each message's client hash, how many served messages are stored,
   and the keys of its recall sources; ``("served", sid, i)`` → the exact served version of message ``i``, and
   ``("recall", key)`` → one recall source: each written once, by the save that added it, never again with a
   later turn's record (the store keeps those it read or wrote in memory, by key: they never change, so a turn of
   a long session reads and writes its record and its new messages, not its whole history and every document it
   compressed);
3. ``("used", sid)`` → the session's last use (epoch s), kept beside the record for pruning; ``("traces", sid)``
   → the session's ``TraceLog`` (the inspector's: written after each answer, never read by a turn), each trace's
   original text and units under ``("trace-part", sid, key)``, written once (``codec.TraceParts``);
4. ``("snapshot", sid)`` → ``SnapshotRecord``: the slot file, its token count, the served-message hashes it
   covers, the model identity it belongs to, size, checksum and last use;
5. ``("response", rid)`` → one Responses answer (``stages/chains.py``): its owner, the session that recorded
   it, the response it continues *within that session* (or none) and the items it adds to that one's; and
   ``("responses", sid)`` → the ids a session recorded, so they go with it;
6. ``("salt",)`` → the random salt the owners' credentials are hashed with (``identity.credential``).

``prune`` bounds the index: sessions unused for ``--session-ttl-days`` and those beyond ``--max-sessions``
(least recently used first) are forgotten with their chain entries and their responses (and the per-session
response keys of indexes written before responses had their own, in the same sweep).

The served history (``save_session``) is written while a request is forwarded, and committed before the answer's
first byte goes to the client (``stages/sessions.py``), so a client never holds an answer to a served prefix the
proxy does not know how to replay.

``write_mark``/``unchanged_since`` tell a caller whether a write that can change a ``lookup``'s answer or the
record it returns (``save_session``, ``update_record``, ``prune``) began or ended in this process since a mark
was taken.

A ``lookup`` reads the chain entries and records it needs through ``Mirror``: a write-through copy, in memory, of
the most recently used ``("chain", h)`` and ``("session", sid)`` values. This process is the only writer of those
keys (``pflash-proxy rm`` deletes snapshots alone), so the copy is exact when every write mirrors what it
committed: a save puts its record and the entry of its whole history and updates the mirrored entries it
rewrote, ``update_record`` puts the record, a prune drops what it deleted, each after its transaction committed
and before it ends (``_writing``). A key the mirror does not hold is read from SQLite, and what a lookup read
there is taken into the mirror only when no such write began or ended during the lookup (``write_mark``), so a
value read before a concurrent write never outlives it. A turn that continues a session it served recently reads
no SQLite row but its new messages' chain entries (absent: never mirrored), and decodes no record: a save keeps
the record it wrote as decoding its bytes would give it, a lookup that had to decode bytes keeps what it decoded,
each beside those bytes until the session is saved again, and each lookup gets a copy whose lists and dicts are its
own.

Failures of the layer below (SQLite: disk full, a damaged file, a lock timeout; ``OSError``) are translated at
this boundary into ``StoreError``, which callers treat as "serve without the index", never as a failed request.
An index that cannot even be opened at start-up is moved aside (``cache.db.corrupt-<time>``) and a fresh one is
started, so a damaged file costs the cached sessions, not the service.
"""

from __future__ import annotations

import functools
import logging
import pickle
import pickletools
import secrets
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any, Callable, ParamSpec, TypeVar

import diskcache

from pflash_proxy.config import private_dir
from pflash_proxy.sessions.identity import chain, message_hash
from pflash_proxy.sessions.lru import ENTRY_BYTES, ValueCache, footprint
from pflash_proxy.sessions.index.base import SessionRecord, SnapshotRecord, StoreError, TraceLog, begin_save, prune_victims
from pflash_proxy.sessions.index.base import WriteMarks, as_stored as _as_stored, fresh as _fresh
from pflash_proxy.sessions.index.codec import PartWrites, RecordError, RecordParts, TraceParts, decode, encode
from pflash_proxy.sessions.index.codec import snapshot_records
from pflash_proxy.sessions.index.codec import trace_log as stored_trace_log


log = logging.getLogger("pflash_proxy.sessions")
T = TypeVar("T")
P = ParamSpec("P")


Key = tuple[str, ...]
MIRROR_KEYS = 1024  # chain entries and records the lookup mirror holds (``Mirror``), the least recently used out
MIRROR_BYTES = 32 << 20  # and the bytes they keep alive, at most (a record's bytes grow with its history)
DECODED_BYTES = 32 << 20  # the records kept decoded beside their bytes (``SessionStore._decodes``), at most


class Mirror:
    """Stored values of some keys, as this process last wrote or read them (module docstring); thread-safe.
    Absent means "not known here", never "not stored". At most ``size`` keys and ``max_bytes`` bytes kept alive
    (``lru.footprint`` of each key and value, and ``lru.ENTRY_BYTES`` each), the least recently used out first."""

    def __init__(self, size: int = MIRROR_KEYS, max_bytes: int = MIRROR_BYTES):
        self.size = size
        self.max_bytes = max_bytes
        self._items: OrderedDict[Key, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Key) -> object | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Key, value: object) -> None:
        with self._lock:
            self._put(key, value)

    @staticmethod
    def _cost(key: Key, value: object) -> int:
        return footprint(key) + footprint(value) + ENTRY_BYTES

    def _put(self, key: Key, value: object) -> None:
        old = self._items.pop(key, None)
        self._bytes -= old[1] if old is not None else 0
        cost = self._cost(key, value)
        if cost > self.max_bytes:
            return
        self._items[key] = (value, cost)
        self._bytes += cost
        while len(self._items) > self.size or self._bytes > self.max_bytes:
            _, (_, gone) = self._items.popitem(last=False)
            self._bytes -= gone

    def update(self, keys: Sequence[Key], value: object) -> None:
        """``keys`` now hold ``value``: the mirrored ones among them take it."""
        with self._lock:
            for key in keys:
                if key in self._items:
                    self._put(key, value)

    def drop(self, keys: Sequence[Key]) -> None:
        with self._lock:
            for key in keys:
                old = self._items.pop(key, None)
                self._bytes -= old[1] if old is not None else 0

    @property
    def bytes(self) -> int:
        """The bytes counted for the kept keys and values."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def learn(self, read: Sequence[tuple[Key, object]], still_true: Callable[[], bool]) -> None:
        """Take what a reader found in SQLite, when ``still_true()`` (no write ran since it began reading)."""
        if not read:
            return
        with self._lock:
            if still_true():
                for key, value in read:
                    self._put(key, value)


def _guarded(fn: Callable[P, T]) -> Callable[P, T]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kw: P.kwargs) -> T:
        try:
            return fn(*args, **kw)
        except (sqlite3.Error, OSError, diskcache.Timeout, RecordError) as exc:
            raise StoreError(f"session index: {type(exc).__name__}: {exc}") from exc
    return wrapper


class KeyDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no types
    """diskcache's ``Disk`` with a fast path for this index's keys (tuples of one to three short strings).

    diskcache stores a key that is not a str/bytes/number as ``pickletools.optimize(pickle.dumps(key))``: for a
    ``("chain", <64 hex>)`` key that is ~7 µs of pure Python in every read and write, more than the SQLite
    query itself. ``put`` writes those very bytes directly (protocol 5: ``PROTO``, one ``FRAME``, a
    ``SHORT_BINUNICODE`` per string, ``TUPLE1..3``, ``STOP``), so keys written before and after are the same rows.
    Any other key, and every key if the bytes ever differ from diskcache's own (checked once per process on a
    sample), takes diskcache's path.

    Nothing it reads back is unpickled: a key is parsed from those bytes (``_parse_key``; one that does not parse
    reads as ``UNREADABLE_KEY``), a value stored pickled (by an older version) reads as None, and only plain
    values (bytes, str, numbers) are written, so diskcache never pickles one.
    """

    _TUPLE_OPS = {1: b"\x85", 2: b"\x86", 3: b"\x87"}
    fast: bool | None = None  # None: not checked yet

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is tuple and KeyDisk.fast is not False:
            data = _key_bytes(key) if self.pickle_protocol == 5 else None
            if data is not None:
                if KeyDisk.fast is None:
                    KeyDisk.fast = data == pickletools.optimize(pickle.dumps(key, protocol=5))
                    if not KeyDisk.fast:
                        log.warning("diskcache key encoding differs from the fast path; using diskcache's own")
                        return super().put(key)  # type: ignore[no-any-return]
                return sqlite3.Binary(data), False
        return super().put(key)  # type: ignore[no-any-return]

    def get(self, key: Any, raw: bool) -> Any:
        if raw:
            return super().get(key, raw)
        parsed = _parse_key(bytes(key))
        return parsed if parsed is not None else UNREADABLE_KEY

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if not read and not isinstance(value, (bytes, str, int, float)):
            raise TypeError(f"the session index stores plain values, not {type(value).__name__}")
        return super().store(value, read, key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == diskcache.core.MODE_PICKLE:
            log.warning("session index: a value stored pickled (by an older version) is ignored")
            return None
        return super().fetch(mode, filename, value, read)


UNREADABLE_KEY = ("?",)  # what a stored key reads as when its bytes are not a tuple of strings
_STRING_OPS = {0x8C: 1, 0x58: 4}  # SHORT_BINUNICODE (1-byte length), BINUNICODE (4-byte length)


def _parse_key(data: bytes) -> tuple[str, ...] | None:
    """The tuple of 1-3 strings that protocol-5 pickle bytes (``_tuple_key``'s, or ``pickletools.optimize``'s of
    such a tuple) spell, read without unpickling; None for any other bytes."""
    if data[:2] != b"\x80\x05":
        return None
    i = 2
    if data[i:i + 1] == b"\x95":  # FRAME + 8-byte length
        i += 9
    items: list[str] = []
    while i < len(data):
        op = data[i]
        if op in _STRING_OPS:
            n = _STRING_OPS[op]
            size = int.from_bytes(data[i + 1:i + 1 + n], "little")
            start = i + 1 + n
            raw = data[start:start + size]
            if len(raw) != size:
                return None
            try:
                items.append(raw.decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                return None
            i = start + size
        elif op == 0x94:  # MEMOIZE (a key pickled without optimizing)
            i += 1
        elif op in (0x85, 0x86, 0x87) and len(items) == op - 0x84 and data[i + 1:] in (b".", b"\x94."):
            return tuple(items)  # TUPLE1-3, then STOP
        else:
            return None
    return None


_KEY_BYTES: dict[tuple[object, ...], bytes | None] = {}  # the keys of the sessions in use, spelled once each
_KEY_BYTES_MAX = 8192


def _key_bytes(key: tuple[object, ...]) -> bytes | None:
    """``_tuple_key`` of keys seen before from a bounded table: a turn's keys (its session, last use and chain
    entries) are mostly the previous turn's."""
    try:
        return _KEY_BYTES[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable part: diskcache's own path
        return None
    data = _tuple_key(key)
    if len(_KEY_BYTES) >= _KEY_BYTES_MAX:
        _KEY_BYTES.clear()
    _KEY_BYTES[key] = data
    return data


def _tuple_key(key: tuple[object, ...]) -> bytes | None:
    """``pickletools.optimize(pickle.dumps(key, 5))`` for a tuple of 1-3 distinct strings of < 256 UTF-8 bytes, else
    None."""
    op = KeyDisk._TUPLE_OPS.get(len(key))
    if op is None or len(set(key)) != len(key):  # pickle writes a repeated object as a memo reference
        return None
    parts = []
    for item in key:
        if type(item) is not str:
            return None
        try:
            raw = item.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: pickle's own path
            return None
        if len(raw) > 255:
            return None
        parts.append(b"\x8c" + bytes((len(raw),)) + raw)
    payload = b"".join(parts) + op + b"."
    return b"\x80\x05\x95" + len(payload).to_bytes(8, "little") + payload


def _cache(directory: Path) -> diskcache.Cache:
    """Nothing expires, nothing is evicted by size (``prune`` bounds the index), ``cull_limit=0`` spares every
    write diskcache's scan for expired keys, and every value stays in SQLite (``disk_min_file_size``): diskcache
    removes a file-backed value's old file when its own ``set`` ends, before the enclosing ``transact()``
    commits, so a reader in another thread or process would see the old row point at a deleted file (None)
    for the rest of that transaction. Inline rows are read as of the last commit."""
    return diskcache.Cache(str(directory), size_limit=2**34, eviction_policy="none", cull_limit=0,
                           disk=KeyDisk, disk_min_file_size=2**31)


def _open(directory: Path) -> diskcache.Cache:
    """The index's cache (``_cache``); a damaged database is moved aside and a fresh index started."""
    try:
        cache = _cache(directory)
        cache.get(("probe",))  # a damaged file can open and fail only at the first read
        return cache
    except sqlite3.DatabaseError as exc:
        db = directory / "cache.db"
        aside = db.with_name(f"cache.db.corrupt-{int(time.time())}")
        log.error("session index %s is damaged (%s); moved aside to %s, starting a fresh index", db, exc, aside.name)
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(db) + suffix)
            if p.exists():
                p.replace(Path(str(aside) + suffix))
        return _cache(directory)


class SessionStore(WriteMarks):
    """The embedded ``SessionIndex``: one diskcache directory (module docstring)."""

    remote = False  # local SQLite, the snapshot records in memory

    def __init__(self, directory: Path):
        super().__init__()  # writes that can change what ``lookup`` answers or returns, counted (``WriteMarks``)
        private_dir(directory)
        self.cache = _open(directory)
        # the snapshot index in memory: stats, eviction and restores read it without touching SQLite, and
        # without listing every key of the index (one scan at start-up, in the executor: ``snapshots()``)
        self._snaps: dict[str, SnapshotRecord] | None = None
        self._snaps_lock = threading.RLock()  # pruning runs in the executor, requests on the loop
        self.cache.add(("salt",), secrets.token_hex(16))  # only if absent: owners' hashes survive a restart
        self.salt: str = self.cache.get(("salt",))
        self.parts = RecordParts()  # the records' served messages and recall sources under keys of their own
        self.mirror = Mirror()  # what a lookup reads, kept as written (module docstring)
        # session id -> a record's stored bytes and the record decoded from them (``_decoded``), within
        # DECODED_BYTES (the bytes and the record's objects counted) and MIRROR_KEYS records
        self._decodes: ValueCache[tuple[bytes, SessionRecord]] = ValueCache(DECODED_BYTES, MIRROR_KEYS)

    def close(self) -> None:
        self.cache.close()

    def as_cluster(self) -> None:
        return None  # this proxy's own

    # Sessions -----------------------------------------------------------------------------------------------
    @_guarded
    def lookup(self, seed: str, messages: Sequence[Mapping[str, object]]) -> tuple[SessionRecord | None, int, list[str]]:
        """Longest served prefix: (session, number of leading messages it covers, client hashes)."""
        hashes = [message_hash(m) for m in messages]
        chain_values = chain(seed, hashes)
        mark = self.write_mark()
        read: list[tuple[Key, object]] = []  # found in SQLite, for the mirror
        try:
            for i in range(len(chain_values) - 1, -1, -1):
                sid = self._mirrored(("chain", chain_values[i]), read)
                if not isinstance(sid, str):
                    continue
                rec = self._decoded(sid, self._mirrored(("session", sid), read))
                if rec is None or not self.parts.load_served(rec, self._read_many):
                    continue
                if rec.continued_by(hashes, i + 1):
                    self.parts.load_recall(rec, self._read_many)
                    return rec, i + 1, hashes
            return None, 0, hashes
        finally:
            self.mirror.learn(read, lambda: self.unchanged_since(mark))

    def _mirrored(self, key: Key, read: list[tuple[Key, object]]) -> object:
        """The value stored under ``key``: the mirror's, else SQLite's (noted in ``read``)."""
        value = self.mirror.get(key)
        if value is None:
            value = self.read(key)
            if value is not None:
                read.append((key, value))
        return value

    def _read_many(self, keys: list[tuple[str, ...]]) -> list[object]:
        return [self.read(key) for key in keys]

    @_guarded
    def get(self, sid: str) -> SessionRecord | None:
        rec = self._record(sid)
        if rec is None:
            return None
        return rec if self.parts.load_served(rec, self._read_many) else None

    def _record(self, sid: str) -> SessionRecord | None:
        """The record as stored, its served messages under keys not read (``prune`` needs only its keys)."""
        return self._decoded(sid, self.read(("session", sid)))

    def _decoded(self, sid: str, data: object) -> SessionRecord | None:
        """The record stored as ``data`` under ``sid`` (None: nothing, unreadable, or another session's). The
        bytes a lookup finds in the mirror are the ones it found there last time until the session is saved
        again, so the record decoded from them is kept (``_decodes``; a save keeps the one it wrote:
        ``_keep_decoded``) and a copy of it returned."""
        kept = self._decodes.get(sid)
        if kept is not None and kept[0] is data:
            return _fresh(kept[1])
        rec: SessionRecord | None = decode("session", data, f"session {sid[:40]}") if data else None
        if rec is None or rec.id != sid:
            return None
        if isinstance(data, bytes):
            self._keep(sid, data, _fresh(rec))
        return rec

    def _keep_decoded(self, rec: SessionRecord, data: bytes) -> None:
        """After a save of ``rec`` as ``data`` (``_put``): the record a lookup would decode from them, kept for it."""
        self._keep(rec.id, data, _as_stored(rec))

    def _keep(self, sid: str, data: bytes, rec: SessionRecord) -> None:
        self._decodes.put(sid, (data, rec), footprint(sid) + footprint(data) + footprint(rec))

    @_guarded
    def read(self, key: tuple[str, ...]) -> object:
        """``cache.get`` that survives a concurrent rewrite: diskcache keeps large values in files, and a reader
        whose row pointed at the file a writer just replaced gets the default (None) although the key exists;
        read again then (the writer's new row is committed by the time its old file is gone)."""
        for _ in range(3):
            value = self.cache.get(key)
            if value is not None or key not in self.cache:
                return value
        return self.cache.get(key)

    @_guarded
    def write(self, key: tuple[str, ...], value: object) -> None:
        self.cache.set(key, value)

    def new_session(self, seed: str, explicit: bool, parent: SessionRecord | None = None, upto: int = 0,
                    owner: str | None = None) -> SessionRecord:
        return SessionRecord.new(seed, explicit, parent, upto, owner)

    @_guarded
    def save_session(self, rec: SessionRecord, client_hashes: list[str], served: Sequence[dict[str, object]]) -> None:
        entries = begin_save(rec, client_hashes, served)
        self._writing(+1)
        try:
            with self.cache.transact():
                writes, data = self._put(rec)
                for h in entries:
                    self.cache.set(("chain", h), rec.id)
            self.parts.committed(writes)
            self._keep_decoded(rec, data)
            self.mirror.put(("session", rec.id), data)
            if entries:  # the entry of the whole history is the one the session's next turn looks up
                self.mirror.update([("chain", h) for h in entries[:-1]], rec.id)
                self.mirror.put(("chain", entries[-1]), rec.id)
        finally:
            self._writing(-1)

    @_guarded
    def update_record(self, rec: SessionRecord) -> None:
        """Write ``rec`` back as it is. Marked as a write: a lookup that read the record before it must read it
        again under the lease, or the next turn would commit the record without the change."""
        self._writing(+1)
        try:
            with self.cache.transact():
                writes, data = self._put(rec)
            self.parts.committed(writes)
            self._keep_decoded(rec, data)
            self.mirror.put(("session", rec.id), data)
        finally:
            self._writing(-1)

    @_guarded
    def trace_log(self, sid: str) -> TraceLog | None:
        kept = stored_trace_log(self.read(("traces", sid)), f"traces of {sid[:40]}")
        return None if kept is None else TraceParts.joined(sid, kept, self._read_many)

    @_guarded
    def update_trace_log(self, sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog | None:
        """One SQLite transaction: read, ``update``, write (the new texts and units under keys of their own, those
        the log no longer names deleted: ``TraceParts``), and the session's last use."""
        with self.cache.transact():
            if ("session", sid) not in self.cache:
                return None
            kept = stored_trace_log(self.cache.get(("traces", sid)), f"traces of {sid[:40]}") or TraceLog()
            write = TraceParts.update(sid, kept, update)
            for key, data in write.writes:
                self.cache.set(key, data)
            for key in write.gone:
                self.cache.delete(key)
            self.cache.set(("traces", sid), write.log)
            self.cache.set(("used", sid), time.time())
        return write.new

    def _put(self, rec: SessionRecord) -> tuple[PartWrites, bytes]:
        """Write the record (in the caller's transaction), its new served messages and recall sources first; the
        caller hands the writes it returns to ``parts.committed``, and the record as stored to the mirror, once
        that transaction committed."""
        writes = self.parts.new(rec)
        for key, value in writes.values:
            self.cache.set(key, value)
        data = encode("session", rec)
        self.cache.set(("session", rec.id), data)
        # last use on its own key: pruning ranks every session without reading their records
        self.cache.set(("used", rec.id), rec.last_use)
        return writes, data

    def _last_uses(self, keys: list[tuple[str, ...]] | None = None) -> dict[str, float]:
        keys = list(self.cache.iterkeys()) if keys is None else keys
        used = {k[1]: t for k in keys if k[0] == "used" and isinstance(t := self.cache.get(k), (int, float))}
        for k in keys:  # records written before the "used" key existed
            if k[0] == "session" and k[1] not in used and (rec := self.get(k[1])) is not None:
                used[k[1]] = rec.last_use
        return used

    @_guarded
    def prune(self, *, older_than: float | None, max_sessions: int,
              keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Forget sessions last used before ``older_than`` (epoch s; None = no age limit), then the least
        recently used beyond ``max_sessions``; never one in ``keep`` (resident or busy).  Removes the record and
        the chain entries that still point at it (a fork that took over a shared prefix keeps it).  Returns the
        removed ids; their snapshots are the caller's to delete."""
        self._writing(+1)
        try:
            return self._prune(older_than, max_sessions, keep)
        finally:
            self._writing(-1)

    def _prune(self, older_than: float | None, max_sessions: int, keep: set[str] | frozenset[str]) -> list[str]:
        keys = list(self.cache.iterkeys())
        self._drop_legacy_responses(keys)
        ranked = sorted(self._last_uses(keys).items(), key=lambda kv: kv[1])
        victims = prune_victims(ranked, older_than, max_sessions, keep)
        trace_parts: dict[str, list[Key]] = {}  # by session: listed already, not read from each log
        for k in keys:
            if k[0] == "trace-part" and len(k) == 3:
                trace_parts.setdefault(k[1], []).append(k)
        for sid in victims:
            with self.cache.transact():
                # read in the transaction: a save or trace write that committed since the listing named more parts
                rec = self._decoded(sid, self.cache.get(("session", sid)))
                kept = stored_trace_log(self.cache.get(("traces", sid)), f"traces of {sid[:40]}")
                self.cache.delete(("session", sid))
                self.cache.delete(("used", sid))
                self.cache.delete(("traces", sid))
                for key in {*trace_parts.get(sid, ()), *(TraceParts.keys(sid, kept) if kept is not None else ())}:
                    self.cache.delete(key)
                for rid in self._ids(sid):
                    self.cache.delete(("response", rid))
                self.cache.delete(("responses", sid))
                for key in RecordParts.keys(rec) if rec is not None else ():
                    self.cache.delete(key)
                dropped: list[Key] = [("session", sid)]
                for h in chain(rec.seed, rec.client_hashes) if rec is not None else ():
                    if self.cache.get(("chain", h)) == sid:
                        self.cache.delete(("chain", h))
                        dropped.append(("chain", h))
            self.mirror.drop(dropped)
            if rec is not None:
                self.parts.forget(rec)
        return victims

    def _drop_legacy_responses(self, keys: list[tuple[str, ...]]) -> None:
        """Indexes written before responses had their own entries kept the items per session
        (``("response-items", sid)``) and an unpruned ``("response", rid)`` → ``(sid,)``: both go."""
        legacy = [k for k in keys if k[0] == "response-items"]
        if not legacy:
            return
        for k in keys:
            if k[0] == "response" and self.cache.get(k) is None:  # the legacy entries were pickled: unreadable
                self.cache.delete(k)
        for k in legacy:
            self.cache.delete(k)

    # Responses (stages/chains.py) -------------------------------------------------------------------------
    @_guarded
    def response(self, rid: str) -> dict[str, object] | None:
        """One recorded response (``put_response``), or None (unknown, pruned, or written by an older index)."""
        data = self.read(("response", rid))
        entry = decode("response", data, f"response {rid[:40]}") if data else None
        return entry if isinstance(entry, dict) else None

    def _ids(self, sid: str) -> list[str]:
        data = self.cache.get(("responses", sid))
        return (decode("ids", data, f"responses of {sid[:40]}") or []) if data else []

    @_guarded
    def last_response(self, sid: str) -> str | None:
        ids = self._ids(sid)
        return ids[-1] if ids else None

    @_guarded
    def put_response(self, rid: str, entry: Mapping[str, object]) -> bool:
        """Record response ``rid`` (``entry["session"]`` owns it); False when that session is gone meanwhile."""
        sid = str(entry["session"])
        with self.cache.transact():
            if ("session", sid) not in self.cache:
                return False
            ids = [r for r in self._ids(sid) if r != rid]
            self.cache.set(("responses", sid), encode("ids", ids + [rid]))
            self.cache.set(("response", rid), encode("response", entry))
        return True

    @_guarded
    def last_uses(self) -> dict[str, float]:
        """Every session's last use (epoch s), without unpickling the records (the inspector's list)."""
        return self._last_uses()

    @_guarded
    def count_sessions(self) -> int:
        return len(self._last_uses())

    @_guarded
    def sessions(self) -> list[SessionRecord]:
        recs = (self.get(k[1]) for k in list(self.cache.iterkeys()) if k[0] == "session")
        return [rec for rec in recs if rec is not None]

    # Snapshots ----------------------------------------------------------------------------------------------
    def _snapshot_index(self) -> dict[str, SnapshotRecord]:
        with self._snaps_lock:
            if self._snaps is None:
                self._snaps = snapshot_records((key[1], self.cache.get(key)) for key in list(self.cache.iterkeys())
                                               if key[0] == "snapshot")
            return self._snaps

    @_guarded
    def snapshot(self, sid: str) -> SnapshotRecord | None:
        return self._snapshot_index().get(sid)

    @_guarded
    def put_snapshot(self, rec: SnapshotRecord) -> None:
        with self._snaps_lock:
            self.cache.set(("snapshot", rec.session), encode("snapshot", rec))
            self._snapshot_index()[rec.session] = rec

    @_guarded
    def drop_snapshot(self, sid: str) -> SnapshotRecord | None:
        with self._snaps_lock:
            rec = self._snapshot_index().pop(sid, None)
            self.cache.delete(("snapshot", sid))
            return rec

    @_guarded
    def snapshots(self) -> list[SnapshotRecord]:
        with self._snaps_lock:
            return list(self._snapshot_index().values())

    @_guarded
    def volume(self) -> int:
        """Bytes the index takes on disk (SQLite pages plus value files), from diskcache's own count."""
        return int(self.cache.volume())
