"""``RedisIndex``: the ``SessionIndex`` (and ``ClusterIndex``) several proxy nodes share in one Redis database.

Keys, all under ``pflash:``; every value a ``codec`` record, validated when read (one that is not reads as absent:
whoever writes this Redis cannot run code in a node):

1. ``chain:<h>`` → session id, for each prefix of each served request (``identity.chain``);
2. ``session:<sid>`` → the ``SessionRecord``; ``served:<sid>:<i>`` → one served message; ``recall:<key>`` → one
   recall source (both written once); ``traces:<sid>`` → its ``TraceLog``, ``trace-part:<sid>:<key>`` → one trace's
   text or units; ``used`` (a sorted set) → each session's last use, so pruning reads no record;
3. ``snapshot:<sid>`` → the ``SnapshotRecord``; ``snapshots`` (a set) → the sessions that have one;
4. ``response:<rid>`` → one Responses answer; ``responses:<sid>`` (a list) → the ids a session recorded;
5. ``salt`` → the salt credentials are hashed with (``SET NX``: the first node writes it);
6. ``holder:<sid>`` → the node whose slot holds the session; ``turn:<sid>`` → the node running its turn (a lease
   with expiry, renewed and freed by compare-and-set scripts); ``node:<id>`` → a node's URL, with expiry (its
   heartbeat).

A write that must stay consistent is one ``MULTI``/``EXEC`` transaction (``WATCH``ed where it reads first) or one
Lua script. Redis's failures raise ``StoreError``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, ParamSpec, Protocol, TypeVar
from urllib.parse import urlparse

from pflash_proxy.sessions.identity import chain, message_hash
from pflash_proxy.sessions.index.base import SessionRecord, SnapshotRecord, StoreError, TraceLog, begin_save, prune_victims
from pflash_proxy.sessions.index.codec import PartWrites, RecordError, RecordParts, TraceParts, decode, encode
from pflash_proxy.sessions.index.codec import trace_log as stored_trace_log

T = TypeVar("T")
P = ParamSpec("P")
PREFIX = "pflash:"
log = logging.getLogger("pflash_proxy.sessions")

# KEYS[1]=lease key, ARGV[1]=token, ARGV[2]=ttl ms: extend only our own lease
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
# KEYS[1]=lease key, ARGV[1]=token: free only our own lease
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
# KEYS[1]=holder key, ARGV[1]=new node, ARGV[2]=the holder the caller saw ('' = none): set only if unchanged;
# returns the holder now
_CLAIM = ("local h = redis.call('GET', KEYS[1]) if (not h) or h == ARGV[2] or h == ARGV[1] then "
          "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1] end return h")
# KEYS[1]=chain key, ARGV[1]=sid: delete a chain entry only while it still points at the session
_DEL_IF = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def _guarded(fn: Callable[P, T]) -> Callable[P, T]:
    import functools

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kw: P.kwargs) -> T:
        import redis

        try:
            return fn(*args, **kw)
        except (redis.RedisError, OSError, RecordError) as exc:
            raise StoreError(f"session index (redis): {type(exc).__name__}: {exc}") from exc
    return wrapper


def _wrong_type(exc: Exception) -> bool:
    """Redis's error for a command on a key that holds another type (a list where a record belongs)."""
    return type(exc).__name__ == "ResponseError" and str(exc).startswith("WRONGTYPE")


def _own_snapshot(sid: str, rec: SnapshotRecord | None) -> SnapshotRecord | None:
    """``rec``, read under ``sid``'s key, when it is that session's; None (logged) when it names another session."""
    if rec is not None and rec.session != sid:
        log.warning("session index: snapshot:%s holds a record of session %r; treated as absent", sid[:40],
                    str(rec.session)[:40])
        return None
    return rec


def _text(v: object) -> str | None:
    """A string Redis returned (a session id, a node's name or URL, a key), or None (logged) when it is absent or
    its bytes are not UTF-8: whoever writes the shared Redis can store any bytes, and they read as absent."""
    if isinstance(v, bytes):
        try:
            return v.decode()
        except UnicodeDecodeError:
            log.warning("session index: a value or key that is not UTF-8 (%r...) is treated as absent", v[:40])
            return None
    return v if isinstance(v, str) else None


def _texts(pairs: Sequence[tuple[object, object]]) -> list[tuple[str, str]]:
    """The pairs (a key and its value) whose both sides read as text (``_text``)."""
    return [(a, b) for x, y in pairs if (a := _text(x)) is not None and (b := _text(y)) is not None]


def _scored(pairs: Sequence[tuple[object, float]]) -> list[tuple[str, float]]:
    """The members of a sorted set, with their scores, whose bytes read as text (``_text``)."""
    return [(a, float(t)) for m, t in pairs if (a := _text(m)) is not None]


class _Pipe(Protocol):
    """What this module calls on a redis-py pipeline (immediate while it ``WATCH``es, queued after ``multi``)."""

    def get(self, key: str) -> object: ...
    def exists(self, *keys: str) -> int: ...
    def lrange(self, key: str, start: int, end: int) -> list[bytes]: ...
    def multi(self) -> None: ...
    def set(self, key: str, value: bytes) -> object: ...
    def delete(self, *keys: str) -> object: ...
    def zadd(self, key: str, mapping: Mapping[str, float]) -> object: ...
    def zrem(self, key: str, *members: str) -> object: ...


class RedisIndex:
    """``SessionIndex`` and ``ClusterIndex`` in one Redis database (module docstring)."""

    remote = True  # every call is a round trip to the Redis server

    def __init__(self, url: str, *, prefix: str = PREFIX, timeout_s: float = 5.0):
        try:
            import redis
        except ImportError as exc:  # the optional dependency: the cluster extra
            from pflash_proxy.llama.extras import install_hint

            raise StoreError(f"--index redis:// needs the redis client ({install_hint('cluster')})") from exc
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss", "unix"):
            raise StoreError(f"--index {url!r}: not a redis:// URL")
        self.url = url
        self.p = prefix
        self.r: Any = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                      health_check_interval=30)
        self._renew = self.r.register_script(_RENEW)
        self._release = self.r.register_script(_RELEASE)
        self._claim = self.r.register_script(_CLAIM)
        self._del_if = self.r.register_script(_DEL_IF)
        self.parts = RecordParts()  # the records' served messages and recall sources under keys of their own
        self.salt = self._salt()

    def _get(self, key: str, via: _Pipe | None = None) -> object:
        """``GET key`` (on ``via``, a pipeline in its ``WATCH`` phase, where given); None (logged) when the key holds
        something that is not a string, as for any value that is not a record."""
        try:
            return (via or self.r).get(key)
        except Exception as exc:
            if not _wrong_type(exc):
                raise
            log.warning("session index: %s holds another Redis type, not a record; treated as absent", key[:80])
            return None

    @_guarded
    def _salt(self) -> str:
        self.r.set(self.p + "salt", secrets.token_hex(16), nx=True)
        return _text(self.r.get(self.p + "salt")) or ""

    def close(self) -> None:
        self.r.close()

    def as_cluster(self) -> RedisIndex:
        return self  # several nodes share it

    def describe(self) -> str:
        """Where the index is, without credentials."""
        u = urlparse(self.url)
        return f"{u.scheme}://{u.hostname}:{u.port or 6379}{u.path or '/0'}"

    # Sessions -----------------------------------------------------------------------------------------------
    @_guarded
    def lookup(self, seed: str, messages: Sequence[Mapping[str, object]]
               ) -> tuple[SessionRecord | None, int, list[str]]:
        """Longest served prefix: (session, number of leading messages it covers, client hashes)."""
        hashes = [message_hash(m) for m in messages]
        values = chain(seed, hashes)
        if not values:
            return None, 0, hashes
        sids = self.r.mget([f"{self.p}chain:{h}" for h in values])
        for i in range(len(values) - 1, -1, -1):
            sid = _text(sids[i])
            if sid is None:
                continue
            rec = self.get(sid)
            if rec is not None and rec.continued_by(hashes, i + 1):
                self.parts.load_recall(rec, self._read_many)
                return rec, i + 1, hashes
        return None, 0, hashes

    def _key(self, key: tuple[str, ...]) -> str:
        """An index key (``codec.Key``) as this index's Redis key."""
        return self.p + ":".join(key)

    def _read_many(self, keys: list[tuple[str, ...]]) -> list[object]:
        values: list[object] = self.r.mget([self._key(k) for k in keys])
        return values

    def write_mark(self) -> int | None:
        """Other nodes write this index too: no mark can vouch that a lookup would read the same again."""
        return None

    def unchanged_since(self, mark: int | None) -> bool:
        return False  # always look up again under the lease (and the session's turn lease)

    @_guarded
    def get(self, sid: str) -> SessionRecord | None:
        data = self._get(f"{self.p}session:{sid}")
        rec = decode("session", data, f"session:{sid[:40]}") if data else None
        return rec if rec is not None and rec.id == sid and self.parts.load_served(rec, self._read_many) else None

    def new_session(self, seed: str, explicit: bool, parent: SessionRecord | None = None, upto: int = 0,
                    owner: str | None = None) -> SessionRecord:
        return SessionRecord.new(seed, explicit, parent, upto, owner)

    @_guarded
    def save_session(self, rec: SessionRecord, client_hashes: list[str], served: Sequence[dict[str, object]]) -> None:
        written = begin_save(rec, client_hashes, served)
        pipe = self.r.pipeline(transaction=True)
        writes = self._put(pipe, rec)
        entries = {f"{self.p}chain:{h}": rec.id for h in written}
        if entries:
            pipe.mset(entries)
        pipe.execute()
        self.parts.committed(writes)

    @_guarded
    def update_record(self, rec: SessionRecord) -> None:
        pipe = self.r.pipeline(transaction=True)
        writes = self._put(pipe, rec)
        pipe.execute()
        self.parts.committed(writes)

    @_guarded
    def trace_log(self, sid: str) -> TraceLog | None:
        kept = stored_trace_log(self._get(f"{self.p}traces:{sid}"), f"traces:{sid[:40]}")
        return None if kept is None else TraceParts.joined(sid, kept, self._read_many)

    @_guarded
    def update_trace_log(self, sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog | None:
        """``WATCH`` the log, read it, ``update``, then ``MULTI``/``EXEC`` the write (the new texts and units under
        keys of their own, those the log no longer names deleted: ``TraceParts``) and the last use; retried
        (``update`` runs again) when another node wrote the log in between."""
        key = f"{self.p}traces:{sid}"

        def attempt(pipe: _Pipe) -> TraceLog | None:
            if not pipe.exists(f"{self.p}session:{sid}"):
                return None
            kept = stored_trace_log(pipe.get(key), f"traces:{sid[:40]}") or TraceLog()
            write = TraceParts.update(sid, kept, update)
            pipe.multi()
            for part_key, data in write.writes:
                pipe.set(self._key(part_key), data)
            if write.gone:
                pipe.delete(*(self._key(k) for k in write.gone))
            pipe.set(key, write.log)
            pipe.zadd(f"{self.p}used", {sid: time.time()})
            return write.new

        # the record is watched too: a prune between the check and the write would leave a log of a session gone
        result: TraceLog | None = self.r.transaction(attempt, key, f"{self.p}session:{sid}", value_from_callable=True)
        return result

    def _put(self, pipe: _Pipe, rec: SessionRecord) -> PartWrites:
        """Queue the record's writes on ``pipe`` (its new served messages and recall sources first); the caller
        hands what it returns to ``parts.committed`` once the pipe executed."""
        writes = self.parts.new(rec)
        for key, data in writes.values:
            pipe.set(self._key(key), data)
        pipe.set(f"{self.p}session:{rec.id}", encode("session", rec))
        pipe.zadd(f"{self.p}used", {rec.id: rec.last_use})
        return writes

    @_guarded
    def prune(self, *, older_than: float | None, max_sessions: int,
              keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """As ``SqliteIndex.prune``: sessions last used before ``older_than``, then the least recently used beyond
        ``max_sessions``, never one in ``keep``; with their chain entries, responses, holder and turn lease."""
        ranked = _scored(self.r.zrange(f"{self.p}used", 0, -1, withscores=True))
        victims = prune_victims(ranked, older_than, max_sessions, keep)
        for sid in victims:
            rec = self._prune_one(sid)
            if rec is not None:
                self.parts.forget(rec)
            for h in chain(rec.seed, rec.client_hashes) if rec is not None else ():
                self._del_if(keys=[f"{self.p}chain:{h}"], args=[sid])
        return victims

    def _prune_one(self, sid: str) -> SessionRecord | None:
        """Delete one session's keys in a transaction that ``WATCH``es its record, trace log and responses: a trace
        write or a save that lands between the read of the keys to delete and their deletion makes it read again,
        so none of the parts it wrote is left behind.  Returns the record that was deleted (None if there was none
        or it could not be read)."""
        session, traces, responses = (f"{self.p}{k}:{sid}" for k in ("session", "traces", "responses"))

        def attempt(pipe: _Pipe) -> SessionRecord | None:
            data = self._get(session, pipe)
            rec = decode("session", data, f"session:{sid[:40]}") if data else None  # its keys: nothing read
            parts = [self._key(k) for k in RecordParts.keys(rec)] if rec is not None else []
            kept = stored_trace_log(self._get(traces, pipe), f"traces:{sid[:40]}")
            parts += [self._key(k) for k in TraceParts.keys(sid, kept)] if kept is not None else []
            rids = [rid for r in pipe.lrange(responses, 0, -1) if (rid := _text(r)) is not None]
            pipe.multi()
            pipe.delete(session, responses, f"{self.p}holder:{sid}", traces, *parts)
            pipe.zrem(f"{self.p}used", sid)
            for rid in rids:
                pipe.delete(f"{self.p}response:{rid}")
            return rec

        rec: SessionRecord | None = self.r.transaction(attempt, session, traces, responses, value_from_callable=True)
        return rec

    @_guarded
    def last_uses(self) -> dict[str, float]:
        return dict(_scored(self.r.zrange(f"{self.p}used", 0, -1, withscores=True)))

    @_guarded
    def count_sessions(self) -> int:
        return int(self.r.zcard(f"{self.p}used"))

    @_guarded
    def sessions(self) -> list[SessionRecord]:
        ids = [sid for s in self.r.zrange(f"{self.p}used", 0, -1) if (sid := _text(s)) is not None]
        values = self.r.mget([f"{self.p}session:{sid}" for sid in ids]) if ids else []
        recs = (decode("session", v, f"session:{sid[:40]}") for sid, v in zip(ids, values) if v)
        return [rec for rec in recs if rec is not None and self.parts.load_served(rec, self._read_many)]

    @_guarded
    def volume(self) -> int:
        """Bytes Redis holds (the whole database's memory: give the index a Redis of its own)."""
        return int(self.r.info("memory").get("used_memory", 0))

    # Responses ----------------------------------------------------------------------------------------------
    @_guarded
    def response(self, rid: str) -> dict[str, object] | None:
        data = self._get(f"{self.p}response:{rid}")
        entry = decode("response", data, f"response:{rid[:40]}") if data else None
        return entry if isinstance(entry, dict) else None

    @_guarded
    def last_response(self, sid: str) -> str | None:
        try:
            return _text(self.r.lindex(f"{self.p}responses:{sid}", -1))
        except Exception as exc:
            if not _wrong_type(exc):
                raise
            return None

    @_guarded
    def put_response(self, rid: str, entry: Mapping[str, object]) -> bool:
        sid = entry["session"]
        if not self.r.exists(f"{self.p}session:{sid}"):
            return False
        pipe = self.r.pipeline(transaction=True)
        pipe.lrem(f"{self.p}responses:{sid}", 0, rid)
        pipe.rpush(f"{self.p}responses:{sid}", rid)
        pipe.set(f"{self.p}response:{rid}", encode("response", entry))
        pipe.execute()
        return True

    # Snapshots ----------------------------------------------------------------------------------------------
    @_guarded
    def snapshot(self, sid: str) -> SnapshotRecord | None:
        data = self._get(f"{self.p}snapshot:{sid}")
        return _own_snapshot(sid, decode("snapshot", data, f"snapshot:{sid[:40]}") if data else None)

    @_guarded
    def put_snapshot(self, rec: SnapshotRecord) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.set(f"{self.p}snapshot:{rec.session}", encode("snapshot", rec))
        pipe.sadd(f"{self.p}snapshots", rec.session)
        pipe.execute()

    @_guarded
    def drop_snapshot(self, sid: str) -> SnapshotRecord | None:
        pipe = self.r.pipeline(transaction=True)
        pipe.getdel(f"{self.p}snapshot:{sid}")
        pipe.srem(f"{self.p}snapshots", sid)
        data, _ = pipe.execute()
        return _own_snapshot(sid, decode("snapshot", data, f"snapshot:{sid[:40]}") if data else None)

    @_guarded
    def snapshots(self) -> list[SnapshotRecord]:
        ids = [sid for s in self.r.smembers(f"{self.p}snapshots") if (sid := _text(s)) is not None]
        values = self.r.mget([f"{self.p}snapshot:{sid}" for sid in ids]) if ids else []
        recs = (_own_snapshot(sid, decode("snapshot", v, f"snapshot:{sid[:40]}")) for sid, v in zip(ids, values) if v)
        return [rec for rec in recs if rec is not None]

    # Cluster: holders, turn leases, heartbeats ----------------------------------------------------------------
    @_guarded
    def holder(self, sid: str) -> str | None:
        return _text(self._get(f"{self.p}holder:{sid}"))

    @_guarded
    def claim(self, sid: str, node: str, seen: str | None) -> str:
        """Make ``node`` the session's holder if the holder is still ``seen`` (or there is none now, or only bytes
        that are not a node's name); returns the holder now (``node`` when the claim took, else the node that
        claimed it meanwhile)."""
        key = f"{self.p}holder:{sid}"
        expected: str | bytes = seen or ""
        if seen is None:  # absent, or bytes that read as absent (``_text``): those are replaced as absent is
            raw = self._get(key)
            if isinstance(raw, bytes) and _text(raw) is None:
                expected = raw
        return _text(self._claim(keys=[key], args=[node, expected])) or ""

    @_guarded
    def acquire_turn(self, sid: str, token: str, ttl_ms: int) -> bool:
        """The session's turn lease for ``token`` if no one holds it (``SET NX PX``)."""
        return bool(self.r.set(f"{self.p}turn:{sid}", token, nx=True, px=ttl_ms))

    @_guarded
    def renew_turn(self, sid: str, token: str, ttl_ms: int) -> bool:
        return bool(self._renew(keys=[f"{self.p}turn:{sid}"], args=[token, ttl_ms]))

    @_guarded
    def release_turn(self, sid: str, token: str) -> bool:
        return bool(self._release(keys=[f"{self.p}turn:{sid}"], args=[token]))

    @_guarded
    def turn_holder(self, sid: str) -> str | None:
        return _text(self._get(f"{self.p}turn:{sid}"))

    @_guarded
    def heartbeat(self, node: str, url: str, ttl_ms: int) -> None:
        self.r.set(f"{self.p}node:{node}", url, px=ttl_ms)

    @_guarded
    def node_url(self, node: str) -> str | None:
        """The node's advertised URL while its heartbeat lasts; None once it expired (the node is gone)."""
        return _text(self._get(f"{self.p}node:{node}"))

    @_guarded
    def nodes(self) -> dict[str, str]:
        keys = list(self.r.scan_iter(match=f"{self.p}node:*", count=100))
        values = self.r.mget(keys) if keys else []
        return {k[len(self.p) + 5:]: v for k, v in _texts(list(zip(keys, values))) if v}

    @_guarded
    def leave(self, node: str) -> None:
        """A node stopping cleanly: its heartbeat goes at once (its sessions' snapshots are saved by then)."""
        self.r.delete(f"{self.p}node:{node}")

    @_guarded
    def holders(self) -> dict[str, str]:
        """Every session's holder (``pflash-proxy ls``)."""
        keys = list(self.r.scan_iter(match=f"{self.p}holder:*", count=500))
        values = self.r.mget(keys) if keys else []
        return {k[len(self.p) + 7:]: v for k, v in _texts(list(zip(keys, values))) if v}
