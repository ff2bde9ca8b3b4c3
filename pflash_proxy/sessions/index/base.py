"""The session index seam: the records it keeps, the ``SessionIndex`` protocol every backend implements, and ``run``.

Backends: ``sqlite.SqliteIndex`` (this proxy's own) and ``redis.RedisIndex`` (several nodes': ``ClusterIndex``).
Every backend raises ``StoreError`` for a failure below it (disk full, a damaged file, a lost connection); callers
then serve without the index, never fail the request. Calls block: ``run`` makes a call from the event loop on the
loop when it is small and the index local, in a worker thread otherwise (always for a ``remote`` index).

A ``SessionRecord`` is read at every turn's lookup and written at its commit, so what is large or read only by
the inspector lives apart: each served message and each recall source under a key of its own, written once
(``served_keyed``, ``recall_keys``; ``codec.RecordParts``), and the inspector's traces in a ``TraceLog``
(``trace_log``/``update_trace_log``). Records of older versions (inline messages and sources, ``traces`` in the
record, an ``extra`` dict) are still read.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pflash_proxy.jsontypes import JSONObject
from pflash_proxy.sessions.identity import chain

if TYPE_CHECKING:
    from pflash_proxy.compress.recall import RecallSource


T = TypeVar("T")


class StoreError(Exception):
    """The session index could not be read or written (disk full, damaged file, lock timeout)."""


# the keys of the per-feature data in records written before the typed fields
_LEGACY_EXTRA = {"pflash_recall": "recall_sources", "pflash_inspector": "traces",
                 "pflash_inspector_totals": "trace_totals"}


@dataclass
class SessionRecord:
    id: str
    seed: str
    client_hashes: list[str] = field(default_factory=list)
    served: list[dict[str, object]] = field(default_factory=list)  # the messages as served (chat messages)
    explicit: bool = False
    owner: str | None = None  # the credential's hash (identity.credential); None: requests without one
    created: float = field(default_factory=time.time)
    last_use: float = field(default_factory=time.time)
    turns: int = 0
    # compression: the omitted units of compressed messages, recalled on a later short question
    recall_sources: list[RecallSource] = field(default_factory=list)
    # how many leading messages of ``served`` are stored under keys of their own (``("served", id, i)``), each
    # written once, by the save that added it; the rest (none, once an index saved the record) are inline
    served_keyed: int = 0
    # not stored: how many leading messages of ``served`` an index read back from their keys (the next save writes
    # the ones after them)
    served_stored: int = field(default=0, compare=False, repr=False)
    # the keys each stored recall source has of its own (``recall_key``), oldest first: a source is written once,
    # when the turn that made it is committed, never again with every later turn's record
    recall_keys: list[str] = field(default_factory=list)
    # not stored: how many of ``recall_sources`` (from the first) an index read back from ``recall_keys``; the
    # ones after it are new, and the next save gives them keys
    recall_stored: int = field(default=0, compare=False, repr=False)
    # the inspector's traces and totals as versions before the trace log kept them (read, never written)
    traces: list[JSONObject] = field(default_factory=list)
    trace_totals: dict[str, int] = field(default_factory=dict)

    @classmethod
    def new(cls, seed: str, explicit: bool, parent: SessionRecord | None = None, upto: int = 0,
            owner: str | None = None) -> SessionRecord:
        """A fresh record (not yet stored); a branch of ``parent`` (same owner) starts with its first ``upto``
        turns."""
        rec = cls(id=uuid.uuid4().hex, seed=seed, explicit=explicit, owner=owner)
        if parent is not None and upto and parent.owner == owner:
            rec.client_hashes = parent.client_hashes[:upto]
            rec.served = parent.served[:upto]
        return rec

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> SessionRecord:
        """A record from what an index stored (``stored``), including records that kept ``extra``."""
        data = dict(data)
        extra = data.pop("extra", None) or {}
        for old, new in _LEGACY_EXTRA.items():
            if old in extra and new not in data:
                data[new] = extra[old]
        return cls(**{k: v for k, v in data.items() if k in _RECORD_FIELDS})

    def stored(self) -> dict[str, object]:
        """The record as plain fields (objects in them kept as they are: ``codec.py`` stores them)."""
        return {name: getattr(self, name) for name in _STORED_FIELDS}

    def continued_by(self, hashes: Sequence[str], n: int) -> bool:
        """The request of message hashes ``hashes`` begins with this record's first ``n`` messages, and the record
        holds their served versions (a record whose served history is shorter than its hashes, damaged or written
        by a version that kept it elsewhere, would replay the request without them)."""
        return len(self.served) >= n and self.client_hashes[:n] == list(hashes[:n])

    def new_served(self) -> list[tuple[int, dict[str, object]]]:
        """For an index's save: the served messages not stored yet, with their positions; the record now counts
        them as stored (``served_keyed``). The messages before them are the ones stored: a session's served
        history only grows (a request that diverges from it is a new session), and each message keeps the content
        it was served with."""
        new = list(enumerate(self.served[self.served_stored:], self.served_stored))
        self.served_stored = self.served_keyed = len(self.served)
        return new

    def new_recall_sources(self) -> list[tuple[str, RecallSource]]:
        """For an index's save: the recall sources not stored yet, each with the new key it is written under;
        the record now names them in ``recall_keys`` (its record is written after them, in the same
        transaction)."""
        new = [(uuid.uuid4().hex, source) for source in self.recall_sources[self.recall_stored:]]
        if new:
            self.recall_keys = [*self.recall_keys, *(key for key, _ in new)]
            self.recall_stored = len(self.recall_sources)
        return new


@dataclass
class TraceLog:
    """What the inspector keeps of a session apart from its record: plain-data traces (newest last) and running
    totals (``sessions/traces.py`` says what they hold and bounds them)."""

    traces: list[JSONObject] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)


_RECORD_FIELDS = frozenset(f.name for f in fields(SessionRecord))
_NOT_STORED = frozenset({"served_stored", "recall_stored"})  # what an index learnt reading the record back
_STORED_FIELDS = tuple(f.name for f in fields(SessionRecord) if f.name not in _NOT_STORED)  # in field order


_CONTAINERS = tuple(f.name for f in fields(SessionRecord) if f.default_factory in (list, dict))


def fresh(rec: SessionRecord) -> SessionRecord:
    """A copy of ``rec`` whose lists and dicts are its own (what they hold is shared: served messages and recall
    sources are shared by every reader already, ``codec.RecordParts``): what an index that keeps decoded records
    hands each reader."""
    out = object.__new__(type(rec))
    attrs = out.__dict__
    attrs.update(rec.__dict__)
    for name in _CONTAINERS:
        attrs[name] = attrs[name].copy()
    return out


def as_stored(rec: SessionRecord) -> SessionRecord:
    """What decoding the bytes a save just wrote of ``rec`` returns (``codec.decode``), without decoding them: the
    save stored every served message and recall source under keys of their own (``RecordParts.new``), so the
    record as stored holds none inline, and has read none back."""
    out = fresh(rec)
    out.served, out.recall_sources = [], []
    out.served_stored = out.recall_stored = 0
    return out


def begin_save(rec: SessionRecord, client_hashes: Sequence[str], served: Sequence[dict[str, object]]) -> list[str]:
    """What every backend's ``save_session`` does first: the chain entries the save writes (``chain_to_write``, read
    before ``rec`` changes), then ``rec`` stamped as saved now: its client hashes, its served history, its last use,
    one more turn. Returns the entries."""
    entries = chain_to_write(rec, client_hashes)
    rec.client_hashes = list(client_hashes)
    rec.served = list(served)
    rec.last_use = time.time()
    rec.turns += 1
    return entries


def chain_to_write(rec: SessionRecord, client_hashes: Sequence[str]) -> list[str]:
    """The chain entries a save of ``rec`` with ``client_hashes`` writes (before ``rec`` takes them): one per prefix,
    except the prefixes ``rec``'s previous save already wrote (a stored record, ``turns`` > 0, whose hashes begin
    the same way). A turn of a long conversation writes the entries of its new messages, not of all of them.
    An entry of such a prefix that another session's save took over since (a fork writes its shared prefix) is
    left to that session: its served history begins the same way, so a lookup of that prefix finds an equal
    history either way."""
    values = chain(rec.seed, client_hashes)
    if not rec.turns:  # a new session, or a fork: every prefix is its own (a fork takes its parent's over)
        return values
    known, n = rec.client_hashes, 0
    limit = min(len(known), len(client_hashes))
    while n < limit and known[n] == client_hashes[n]:
        n += 1
    return values[n:]


def prune_victims(ranked: list[tuple[str, float]], older_than: float | None, max_sessions: int,
                  keep: set[str] | frozenset[str]) -> list[str]:
    """What an index prunes, from ``(session id, last use)`` oldest first: sessions last used before
    ``older_than``, then the least recently used beyond ``max_sessions``, never one in ``keep``."""
    excess = len(ranked) - max_sessions
    victims: list[str] = []
    for sid, last_use in ranked:
        if sid in keep:
            continue
        if (older_than is not None and last_use < older_than) or len(victims) < excess:
            victims.append(sid)
    return victims


@dataclass
class SnapshotRecord:
    session: str
    file: str
    tokens: int
    served_hashes: list[str]
    model_identity: str
    size: int
    created: float = field(default_factory=time.time)
    last_use: float = field(default_factory=time.time)
    hits: int = 0
    checksum: str = ""  # "crc32:…" of the file when saved ("" in records written before checksums)


class WriteMarks:
    """``write_mark``/``unchanged_since`` of an index only this process writes: each write that can change a
    ``lookup``'s answer or the record it returns (``save_session``, ``update_record``, ``prune``) runs inside
    ``writing()``."""

    def __init__(self) -> None:
        self._writes_lock = threading.Lock()
        self._writes_running = 0
        self._writes_done = 0

    def write_mark(self) -> int | None:
        """Taken before a ``lookup``: None while such a write runs, else a mark that ``unchanged_since`` compares."""
        with self._writes_lock:
            return None if self._writes_running else self._writes_done

    def unchanged_since(self, mark: int | None) -> bool:
        """True when no such write began or ended since ``mark`` was taken."""
        with self._writes_lock:
            return mark is not None and not self._writes_running and self._writes_done == mark

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._writes_lock:
            self._writes_running += 1
        try:
            yield
        finally:
            with self._writes_lock:
                self._writes_running -= 1
                self._writes_done += 1


class SessionIndex(Protocol):
    """What the proxy keeps about sessions, responses and snapshots (``sqlite.SqliteIndex`` documents each table)."""

    salt: str  # the random salt owners' credentials are hashed with; the same across restarts
    # every call may wait on a network round trip (a server several nodes share): ``run`` never makes one on the
    # event loop; a local index (False) answers small calls in well under a millisecond
    remote: bool

    def close(self) -> None: ...
    def as_cluster(self) -> ClusterIndex | None:
        """This index as the one several nodes share, or None when it is this proxy's own."""
        ...

    # sessions
    def write_mark(self) -> int | None:
        """A mark taken before a ``lookup`` (None while a write that can change its answer runs). A backend that
        other processes write to returns None: it cannot know their writes, so the lookup is always repeated."""
        ...
    def unchanged_since(self, mark: int | None) -> bool:
        """True when no write that can change a ``lookup``'s answer began or ended since ``mark``."""
        ...
    def lookup(self, seed: str, messages: Sequence[Mapping[str, object]]
               ) -> tuple[SessionRecord | None, int, list[str]]: ...
    def get(self, sid: str) -> SessionRecord | None: ...
    def new_session(self, seed: str, explicit: bool, parent: SessionRecord | None = None, upto: int = 0,
                    owner: str | None = None) -> SessionRecord: ...
    def save_session(self, rec: SessionRecord, client_hashes: list[str], served: Sequence[dict[str, object]]) -> None: ...
    def update_record(self, rec: SessionRecord) -> None: ...
    def trace_log(self, sid: str) -> TraceLog | None:
        """The session's trace log (None: none written, or the session is gone)."""
        ...
    def update_trace_log(self, sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog | None:
        """Replace the session's trace log by ``update(current)`` (an empty log when none), atomically against
        other writers of it; it also counts as a use of the session. None, and nothing written, when the session
        is gone (pruned meanwhile). ``update`` may run more than once (a backend that retries on a conflict)."""
        ...
    def prune(self, *, older_than: float | None, max_sessions: int,
              keep: set[str] | frozenset[str] = frozenset()) -> list[str]: ...
    def last_uses(self) -> dict[str, float]: ...
    def count_sessions(self) -> int: ...
    def sessions(self) -> list[SessionRecord]: ...
    def volume(self) -> int: ...

    # responses (stages/chains.py)
    def response(self, rid: str) -> dict[str, object] | None: ...
    def last_response(self, sid: str) -> str | None: ...
    def put_response(self, rid: str, entry: Mapping[str, object]) -> bool: ...

    # snapshots (sessions/snapshots.py)
    def snapshot(self, sid: str) -> SnapshotRecord | None: ...
    def put_snapshot(self, rec: SnapshotRecord) -> None: ...
    def drop_snapshot(self, sid: str) -> SnapshotRecord | None: ...
    def snapshots(self) -> list[SnapshotRecord]: ...


class ClusterIndex(SessionIndex, Protocol):
    """A ``SessionIndex`` several proxy nodes share (``redis.RedisIndex``): besides the records, which node
    holds each session, a lease per session's turn (one node at a time, with expiry) and the nodes' heartbeats."""

    def describe(self) -> str: ...
    def holder(self, sid: str) -> str | None: ...
    def claim(self, sid: str, node: str, seen: str | None) -> str: ...
    def acquire_turn(self, sid: str, token: str, ttl_ms: int) -> bool: ...
    def renew_turn(self, sid: str, token: str, ttl_ms: int) -> bool: ...
    def release_turn(self, sid: str, token: str) -> bool: ...
    def turn_holder(self, sid: str) -> str | None: ...
    def heartbeat(self, node: str, url: str, ttl_ms: int) -> None: ...
    def node_url(self, node: str) -> str | None: ...
    def nodes(self) -> dict[str, str]: ...
    def leave(self, node: str) -> None: ...
    def holders(self) -> dict[str, str]: ...


async def run(index: SessionIndex, fn: Callable[..., T], *args: object, small: bool = False) -> T:
    """``fn(*args)``, a call of (or through) ``index`` made from the event loop: on the loop when ``small`` and
    the index is local, else in a worker thread (the module docstring)."""
    if small and not index.remote:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
