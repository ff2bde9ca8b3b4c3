"""The stored format of every index value: UTF-8 JSON ``{"schema", "kind", "value"}``, validated when read.

``encode(kind, value)`` writes one (``RecordError`` for a value it cannot hold); ``decode(kind, data)`` returns the
record, or None (logged) for anything else: not JSON, another schema or kind, a wrong shape, a pickle. Nothing read
runs code: a recall source's typed objects (tuples, sets, numeric arrays, the compressor's dataclasses) are written
with tags (``{"$t": [...]}``, ``{"$nd": ...}``, ``{"$dc": name, "f": {...}}`` ...), and a dataclass is rebuilt only
when its name is one of ``_dataclasses()``. Schema 2 keeps a session's messages and recall sources under keys of
their own (``RecordParts``), and a trace's text and units (``TraceParts``); schema 1 (all inline) is still read.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from pflash_proxy.jsontypes import JSONObject, JSONValue
from pflash_proxy.sessions.index.base import SessionRecord, SnapshotRecord, TraceLog
from pflash_proxy.sessions.lru import ValueCache, footprint

if TYPE_CHECKING:
    from pflash_proxy.compress.recall import RecallSource

log = logging.getLogger("pflash_proxy.sessions")

SCHEMA = 2
READABLE = (1, 2)  # schema 1: a session's served history and recall sources inline (read as they are)
KINDS = ("session", "snapshot", "response", "ids", "traces", "recall", "message", "trace-part")
_NUMERIC_KINDS = "biuf"  # numpy dtype kinds an array may have: bool, signed, unsigned, float
_MAX_TAG_DEPTH = 64  # the compressor's objects nest a handful of levels


class RecordError(ValueError):
    """A stored value that is not a record of the expected kind (read as absent)."""


# 1. Encoding ----------------------------------------------------------------------------------------------------
def _plain(x: object) -> JSONValue:
    """``json.dumps``' fallback for the few non-JSON values plain fields may hold."""
    if isinstance(x, np.generic):
        scalar: JSONValue = x.item()  # numpy's scalars are numbers, booleans or strings
        return scalar
    if isinstance(x, np.ndarray):
        nested: JSONValue = x.tolist()  # the numeric arrays the records hold: lists of numbers
        return nested
    if isinstance(x, (set, frozenset)):
        return sorted(x, key=repr)
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    raise TypeError(f"{type(x).__name__} is not stored in a session record")


def _tagged(x: object, depth: int = 0) -> JSONValue:
    if depth > _MAX_TAG_DEPTH:
        raise TypeError("a recall source nests too deeply to store")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, np.generic):
        scalar: JSONValue = x.item()
        return scalar
    d = depth + 1
    if isinstance(x, list):
        return [_tagged(v, d) for v in x]
    if isinstance(x, tuple):
        return {"$t": [_tagged(v, d) for v in x]}
    if isinstance(x, (set, frozenset)):
        return {"$fs" if isinstance(x, frozenset) else "$s": [_tagged(v, d) for v in x]}
    if isinstance(x, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in x):
            return {k: _tagged(v, d) for k, v in x.items()}
        return {"$d": [[_tagged(k, d), _tagged(v, d)] for k, v in x.items()]}
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"an array of dtype {x.dtype} is not stored")
        return {"$nd": x.dtype.str, "shape": list(x.shape),
                "data": base64.b64encode(np.ascontiguousarray(x).tobytes()).decode()}
    if isinstance(x, bytes):
        return {"$b": base64.b64encode(x).decode()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"$dc": _name(type(x)), "f": {f.name: _tagged(getattr(x, f.name), d) for f in dataclasses.fields(x)}}
    raise TypeError(f"{type(x).__name__} is not stored in a recall source")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _session_value(rec: SessionRecord) -> dict[str, object]:
    value = rec.stored()
    value["served"] = rec.served[rec.served_stored:]  # the messages not stored under keys of their own
    value["served_keyed"] = rec.served_stored
    sources = []
    for i, source in enumerate(rec.recall_sources[rec.recall_stored:], rec.recall_stored):
        try:
            sources.append(_tagged(source))
        except TypeError as exc:  # a scorer's representation this format cannot hold: that recall source is lost
            log.warning("session %s: recall source %d is not stored (%s)", rec.id[:8], i, exc)
    value["recall_sources"] = sources
    return value


def encode(kind: str, value: Any) -> bytes:
    """``value`` as stored bytes (module docstring, 1)."""
    if kind == "session":
        value = _session_value(value)
    elif kind == "message":
        if not isinstance(value, dict):
            raise RecordError("a served message is an object")
    elif kind == "recall":
        try:
            value = _tagged(value)
        except TypeError as exc:  # a scorer's representation this format cannot hold
            raise RecordError(f"a recall source that cannot be stored: {exc}") from exc
    elif kind == "snapshot":
        value = dataclasses.asdict(value)
    elif kind == "traces":
        value = {"traces": value.traces, "totals": value.totals}  # plain already: no deep copy
    elif kind == "trace-part":
        if not isinstance(value, (str, dict)):
            raise RecordError("a trace part is a string or an object")
    elif kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}")
    doc = {"schema": SCHEMA, "kind": kind, "value": value}
    try:
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=_plain).encode("utf-8",
                                                                                                "surrogatepass")
    except (TypeError, ValueError, RecursionError) as exc:  # the index's StoreError: served without it
        raise RecordError(f"a {kind} record that cannot be stored: {exc}") from exc


# 2. Decoding ----------------------------------------------------------------------------------------------------
_DATACLASSES: dict[str, type] | None = None
_RECALL_SOURCE = "pflash_proxy.compress.recall.RecallSource"


def _dataclasses() -> dict[str, type]:
    """The dataclasses a recall source may hold (the compressor's scorers' plain-data representations)."""
    global _DATACLASSES
    if _DATACLASSES is None:
        from pflash_proxy.compress import links, recall, scores

        classes: list[type] = [recall.RecallSource, scores.UnitReps, scores._LexicalIndex, scores._Links,
                               links.ReferenceLinks]
        _DATACLASSES = {_name(c): c for c in classes}
    return _DATACLASSES


def _untagged(x: object, depth: int = 0) -> object:
    if depth > _MAX_TAG_DEPTH:
        raise RecordError("nested too deeply")
    d = depth + 1
    if isinstance(x, list):
        return [_untagged(v, d) for v in x]
    if not isinstance(x, dict):
        return x
    if "$t" in x:
        return tuple(_untagged(v, d) for v in _list(x["$t"]))
    if "$fs" in x:
        return frozenset(_untagged(v, d) for v in _list(x["$fs"]))
    if "$s" in x:
        return {_untagged(v, d) for v in _list(x["$s"])}
    if "$d" in x:
        return {_untagged(k, d): _untagged(v, d) for k, v in (_pair(p) for p in _list(x["$d"]))}
    if "$nd" in x:
        dtype = np.dtype(str(x["$nd"]))
        if dtype.kind not in _NUMERIC_KINDS:
            raise RecordError(f"array dtype {dtype}")
        shape = tuple(int(n) for n in _list(x["shape"]))
        return np.frombuffer(base64.b64decode(str(x["data"]), validate=True), dtype=dtype).reshape(shape).copy()
    if "$b" in x:
        return base64.b64decode(str(x["$b"]), validate=True)
    if "$dc" in x:
        cls = _dataclasses().get(str(x["$dc"]))
        if cls is None:
            raise RecordError(f"unknown stored class {str(x['$dc'])[:80]!r}")
        fields = x.get("f")
        if not isinstance(fields, dict):
            raise RecordError("a stored dataclass without fields")
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        if not set(fields) <= names:
            raise RecordError(f"unknown fields of {cls.__name__}")
        return cls(**{k: _untagged(v, d) for k, v in fields.items()})
    return {k: _untagged(v, d) for k, v in x.items()}


def _list(x: object) -> list[Any]:
    if not isinstance(x, list):
        raise RecordError("a tagged value without its list")
    return x


def _pair(x: object) -> tuple[object, object]:
    if not isinstance(x, list) or len(x) != 2:
        raise RecordError("a map entry that is not a pair")
    return x[0], x[1]


class _SessionValue(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields of a newer version are kept (from_stored drops unknown ones)

    id: str
    seed: str
    client_hashes: list[str] = []
    served: list[dict[str, Any]] = []
    served_keyed: int = 0
    explicit: bool = False
    owner: str | None = None
    created: float = 0.0
    last_use: float = 0.0
    turns: int = 0
    recall_sources: list[Any] = []
    recall_keys: list[str] = []
    traces: list[Any] = []
    trace_totals: dict[str, int] = {}


class _ResponseValue(BaseModel):
    model_config = ConfigDict(extra="allow")

    session: str


class _TraceLogValue(BaseModel):
    traces: list[dict[str, Any]] = []
    totals: dict[str, int] = {}


_SNAPSHOT = TypeAdapter(SnapshotRecord)
_IDS = TypeAdapter(list[str])
_MESSAGE = TypeAdapter(dict[str, object])


def _session(value: object) -> SessionRecord:
    checked = _SessionValue.model_validate(value)
    data = dict(checked.__dict__)  # the declared fields, then the others (``from_stored`` reads an ``extra``)
    data.update(checked.model_extra or {})
    sources = []
    for i, raw in enumerate(data["recall_sources"]):
        try:
            source = _untagged(raw)
        except (RecordError, TypeError, ValueError, KeyError) as exc:  # that source alone is lost
            log.warning("session %s: recall source %d is unreadable (%s); dropped", data["id"][:8], i, exc)
            continue
        if isinstance(source, _dataclasses()[_RECALL_SOURCE]):
            sources.append(source)
    data["recall_sources"] = sources
    return SessionRecord.from_stored(data)


Key = tuple[str, ...]  # a value's key in an index: the embedded one uses the tuple, Redis its parts joined by ":"


@dataclasses.dataclass
class PartWrites:
    """What one save writes besides the record (``RecordParts.new``), in the record's own transaction."""

    values: list[tuple[Key, bytes]]  # the new served messages and recall sources, encoded, under their keys
    served: list[tuple[str, dict[str, object], int]]  # what the served-message cache takes once they committed


class RecordParts:
    """A session record's served messages (``("served", id, "<position>")``) and recall sources (``("recall", key)``)
    under keys of their own, for every backend. They never change once written, so the ones read or written are
    kept in two ``lru.ValueCache``s bounded by the bytes they keep alive.

    ``new(rec)`` encodes a save's new parts (the backend writes them in the record's transaction, then calls
    ``committed``); ``load_served``/``load_recall`` put the stored parts in front of a record's inline ones (a
    message gone makes the record absent: False; a source gone costs that source); ``keys``/``forget``: what a prune
    deletes and drops.
    """

    def __init__(self, served_bytes: int = 128 << 20, recall_bytes: int = 64 << 20):
        self.served: ValueCache[dict[str, object]] = ValueCache(served_bytes)  # by "<id>:<position>"
        self.recall: ValueCache[RecallSource] = ValueCache(recall_bytes)  # by recall key

    def new(self, rec: SessionRecord) -> PartWrites:
        out = PartWrites([], [])
        for i, message in rec.new_served():
            data = encode("message", message)
            out.values.append((("served", rec.id, str(i)), data))
            key = f"{rec.id}:{i}"
            out.served.append((key, message, footprint(key) + footprint(message)))
        for key, source in rec.new_recall_sources():
            try:
                data = encode("recall", source)
            except RecordError as exc:
                log.warning("session %s: recall source %s is not stored (%s)", rec.id[:8], key[:8], exc)
                continue
            out.values.append((("recall", key), data))
            self.recall.put(key, source, footprint(key) + footprint(source))
        return out

    def committed(self, writes: PartWrites) -> None:
        for key, message, size in writes.served:
            self.served.put(key, message, size)

    def load_served(self, rec: SessionRecord, read: Callable[[list[Key]], Sequence[object]]) -> bool:
        if not rec.served_keyed:
            return True
        found: dict[int, dict[str, object]] = {}
        for i in range(rec.served_keyed):
            hit = self.served.get(f"{rec.id}:{i}")
            if hit is not None:
                found[i] = hit
        missing = [i for i in range(rec.served_keyed) if i not in found]
        if missing:
            for i, data in zip(missing, read([("served", rec.id, str(i)) for i in missing])):
                message = decode("message", data, f"served message {i} of session {rec.id[:40]}") if data else None
                if not isinstance(message, dict):
                    log.warning("session %s: served message %d is %s; the session is read as absent", rec.id[:8], i,
                                "gone" if not data else "unreadable")
                    return False
                found[i] = message
                key = f"{rec.id}:{i}"
                self.served.put(key, message, footprint(key) + footprint(message))
        rec.served = [*(found[i] for i in range(rec.served_keyed)), *rec.served]
        rec.served_stored = rec.served_keyed
        return True

    def load_recall(self, rec: SessionRecord, read: Callable[[list[Key]], Sequence[object]]) -> None:
        if not rec.recall_keys:
            return
        found = {k: s for k in rec.recall_keys if (s := self.recall.get(k)) is not None}
        missing = [k for k in rec.recall_keys if k not in found]
        if missing:
            for key, data in zip(missing, read([("recall", k) for k in missing])):
                if not data:
                    log.warning("session %s: recall source %s is gone; dropped", rec.id[:8], key[:8])
                    continue
                source = decode("recall", data, f"recall source {key[:40]}")
                if source is not None:
                    found[key] = source
                    self.recall.put(key, source, footprint(key) + footprint(source))
        stored = [found[k] for k in rec.recall_keys if k in found]
        rec.recall_sources = [*stored, *rec.recall_sources[rec.recall_stored:]]
        rec.recall_stored = len(stored)

    @staticmethod
    def keys(rec: SessionRecord) -> list[Key]:
        return [*(("served", rec.id, str(i)) for i in range(rec.served_keyed)),
                *(("recall", key) for key in rec.recall_keys)]

    def forget(self, rec: SessionRecord) -> None:
        self.recall.discard(rec.recall_keys)
        self.served.discard([f"{rec.id}:{i}" for i in range(rec.served_keyed)])


_PARTS = {"text": str, "units": dict}  # a trace's fields stored under keys of their own, and their types


def _named(field_: str) -> str:
    """The field of a stored trace that names the key its part ``field_`` is stored under."""
    return f"{field_}_key"


TEXT_KEY, TEXT_CHARS = _named("text"), "text_chars"  # a stored trace's text: its key, its length


def text_chars(trace: Mapping[str, object]) -> int:
    """The length of a trace's text, inline or under a key of its own (``TraceParts``); 0 when it has none."""
    text = trace.get("text")
    if isinstance(text, str):
        return len(text)
    n = trace.get(TEXT_CHARS)
    return n if isinstance(n, int) and isinstance(trace.get(TEXT_KEY), str) else 0


def drop_text(trace: JSONObject) -> None:
    """The trace without its text (inline or under a key: the index deletes a key no trace names any more)."""
    trace["text"] = None
    trace["text_dropped"] = True
    trace.pop(TEXT_KEY, None)
    trace.pop(TEXT_CHARS, None)


@dataclasses.dataclass
class TraceWrite:
    """One trace write (``TraceParts.update``): what the index stores, in one transaction, and returns."""

    new: TraceLog  # the log the change made, as its caller gave it (the new parts inline)
    log: bytes  # that log as stored, encoded
    writes: list[tuple[Key, bytes]]  # the new parts, encoded, under their keys
    gone: set[Key]  # the part keys the stored log named and the new one does not


class TraceParts:
    """A trace's original text and units under keys of their own (``("trace-part", sid, key)``), written once, for
    every backend; the stored trace names them (``text_key``, ``units_key``) and keeps ``text_chars``.

    ``update(sid, kept, change)``: one trace write (``TraceWrite``) for the backend to run in one transaction;
    ``keys(sid, kept)``: the part keys a stored log names; ``joined(sid, kept, read)``: the log with each part in
    its field (a part gone or unreadable reads as a dropped text, or no units).
    """

    @staticmethod
    def update(sid: str, kept: TraceLog, change: Callable[[TraceLog], TraceLog]) -> TraceWrite:
        named = TraceParts.keys(sid, kept)  # before ``change``, which drops texts in place
        new = change(kept)
        stored, writes = TraceParts._stored(sid, new)
        return TraceWrite(new, encode("traces", stored), writes, named - TraceParts.keys(sid, stored))

    @staticmethod
    def _stored(sid: str, kept: TraceLog) -> tuple[TraceLog, list[tuple[Key, bytes]]]:
        traces: list[JSONObject] = []
        writes: list[tuple[Key, bytes]] = []
        for trace in kept.traces:
            parts = {f: v for f, kind in _PARTS.items() if isinstance(v := trace.get(f), kind) and v}
            if parts:
                trace = {k: v for k, v in trace.items() if k not in parts}
                for field_, value in parts.items():
                    key = uuid.uuid4().hex
                    writes.append((("trace-part", sid, key), encode("trace-part", value)))
                    trace[_named(field_)] = key
                    if field_ == "text":
                        trace[TEXT_CHARS] = len(str(value))
            traces.append(trace)
        return TraceLog(traces, kept.totals), writes

    @staticmethod
    def keys(sid: str, kept: TraceLog) -> set[Key]:
        return {("trace-part", sid, key) for t in kept.traces for f in _PARTS
                if isinstance(key := t.get(_named(f)), str)}

    @staticmethod
    def joined(sid: str, kept: TraceLog, read: Callable[[list[Key]], Sequence[object]]) -> TraceLog:
        named = [(i, f, key) for i, t in enumerate(kept.traces) for f in _PARTS
                 if isinstance(key := t.get(_named(f)), str)]
        if not named:
            return kept
        traces = list(kept.traces)
        for (i, field_, key), data in zip(named, read([("trace-part", sid, key) for _, _, key in named])):
            trace = traces[i] = {k: v for k, v in traces[i].items() if k not in (_named(field_), TEXT_CHARS)}
            value = decode("trace-part", data, f"trace {field_} {key[:40]} of {sid[:40]}") if data else None
            if isinstance(value, _PARTS[field_]):
                trace[field_] = value
                continue
            if not data:
                log.warning("inspector trace %s %s of session %s is gone", field_, key[:8], sid[:8])
            trace[field_] = None
            if field_ == "text":
                trace["text_dropped"] = True
        return TraceLog(traces, kept.totals)


def trace_log(data: object, where: str) -> TraceLog | None:
    """The ``TraceLog`` stored as ``data`` (None when nothing is stored or it is not readable: ``decode``)."""
    found: TraceLog | None = decode("traces", data, where) if data else None
    return found


def decode(kind: str, data: object, where: str = "") -> Any:
    """The record of ``kind`` stored as ``data`` (bytes or str), or None (logged) when it is not one: not JSON,
    another schema or kind, a value of the wrong shape, or a value written by an older version (a pickle)."""
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data).decode("utf-8", "surrogatepass")
        if not isinstance(data, str):
            raise RecordError(f"a stored {type(data).__name__}, not JSON")
        doc = json.loads(data)
        if kind == "snapshot" and isinstance(doc, dict) and "schema" not in doc:
            doc = {"schema": SCHEMA, "kind": kind, "value": doc}  # the plain JSON of versions before the envelope
        if not isinstance(doc, dict) or doc.get("schema") not in READABLE or doc.get("kind") != kind:
            raise RecordError(f"not a {kind} record of schema {' or '.join(map(str, READABLE))}")
        value = doc.get("value")
        if kind == "session":
            return _session(value)
        if kind == "snapshot":
            return _SNAPSHOT.validate_python(value)
        if kind == "response":
            _ResponseValue.model_validate(value)
            return value
        if kind == "ids":
            return _IDS.validate_python(value)
        if kind == "traces":
            checked = _TraceLogValue.model_validate(value)
            return TraceLog(checked.traces, checked.totals)
        if kind == "message":
            return _MESSAGE.validate_python(value)
        if kind == "trace-part":
            if not isinstance(value, (str, dict)):
                raise RecordError("not a string or an object")
            return value
        if kind == "recall":
            source = _untagged(value)
            if not isinstance(source, _dataclasses()[_RECALL_SOURCE]):
                raise RecordError("not a recall source")
            return source
        raise RecordError(f"unknown record kind {kind!r}")
    except (RecordError, ValidationError, ValueError, TypeError, KeyError, RecursionError) as exc:
        log.warning("session index: %s is not a readable %s record (%s: %s); treated as absent",
                    where or "a value", kind, type(exc).__name__, str(exc)[:200])
        return None


def snapshot_records(rows: Iterable[tuple[str, object]]) -> dict[str, SnapshotRecord]:
    """The snapshot records of an index's ``(session id, stored value)`` rows, by session: a value that does not
    decode is absent, and so is a record under another session's id (never written so by an index), logged."""
    snaps: dict[str, SnapshotRecord] = {}
    for sid, data in rows:
        rec = decode("snapshot", data, f"snapshot {str(sid)[:40]}") if data else None
        if rec is None:
            continue
        if rec.session == sid:
            snaps[sid] = rec
        else:
            log.warning("session index: the snapshot record under %s names session %r; treated as absent",
                        str(sid)[:40], str(rec.session)[:40])
    return snaps
