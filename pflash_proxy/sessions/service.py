"""``SessionService``: the session layer, in the stages' own terms, over three collaborators, each given only its
own settings group: the slot scheduler (``scheduler.SlotScheduler``: the slot table, the engine's liveness,
credential isolation, idle saves), the snapshot store (``snapshot_store.SnapshotStore``: every save and restore,
within one write budget) and the session index (``index``), with a ``ClusterNode`` when several nodes share the
index. It alone decides where an index call runs (``index.run``: from the index's declared ``remote``, and from the
size of the request's history).

Its faces:
- The turn (``begin`` -> ``Turn``), the session stage's: ``begin`` finds the request's session and leases its slot
  (or an anonymous slot, or every slot for a batch), makes the slot ready and returns the ``Turn``, which offers what
  may come next: ``observe`` the answer's cache report, ``reported`` (a whole answer's cache, for its headers),
  ``commit`` the served history, and ``close``, which releases what the turn holds, exactly once. ``owner``,
  ``expand_chain``/``record_response`` (the Responses chains) and ``update_trace_log`` (the inspector's traces) are
  the other stages'.
- The admin face (``SessionAdmin``): ``start``/``stop``, ``save_all``, ``prune``, ``slot_guard``,
  ``on_snapshot_timing``, ``stats`` (``SessionStats``) and ``view``, the read-only ``ServiceView`` (the inspector's).

A turn, from ``begin``:
- Namespace (``_seed``): the model identity, the owner (the hash of the request's credential) and the client's session
  name; a session id the client echoes continues that session's namespace when the session is its own credential's.
- Find and lease (``_find_and_lease``): the session whose served history is the longest prefix of the request, or a
  new one, or a fork of one the request diverges from; then its slot's lease. When a hit of the namespace is likely
  and the engine does not vouch for it, the slots' states are asked beside the lookup
  (``SlotScheduler.prefetch_slots``). The lease serialises a session's requests, but the first lookup happens before
  the wait, so it is repeated under the lease unless no write that can change its answer or the record it read ran
  since (``SessionIndex.write_mark``); when the answer changed, the lease is returned and the decision taken again,
  at most ``LOOKUP_ATTEMPTS`` times in all (then the last decision stands). A history under ``INLINE_BYTES`` in a
  local index is looked up on the loop. An index that fails here is counted, and the turn is served anonymously
  (``Turn.degraded``).
- Several nodes (``cluster.py``): a session another live node holds is not leased here (``Turn.forward`` names that
  node); otherwise the session's turn lease in the shared index is taken with the slot's, and this node becomes its
  holder (``Turn.taken_from``: the node it took the session over from, if any).
- Ready the slot (``_ready_slot``): a displaced session is saved (unless its snapshot is current), then this session
  is a ``hit`` (the slot still holds a prefix of its history: ``SlotScheduler.resident_hit``), ``restored`` (its
  snapshot, after any save of it still running) or a ``miss``, with the tokens expected from cache; then
  credentials are isolated (``--cache-isolation``) and the request's slot pin given (``Turn.pin``).
- After the answer, ``Turn.observe`` compares the tokens the answer's cache report (``SlotReport``) says came from
  the cache with the expectation (a shortfall marks the slot unknown, logs it and counts in ``cache_mismatches``),
  records what the slot now holds and says what the turn is reported as (``reported_cache``).
- ``Turn.commit`` starts writing the served history (on the loop for a short history in a local index, once the
  request has been sent to the engine, else in a worker thread) and says later whether it was kept.
- ``Turn.close`` ends the cluster turn lease and releases the slot (or keeps it until the engine's slot is idle),
  then saves with ``--save-every-turn``; a batch's leases are released unknown.
A failed index call is counted and logged (``store_failures``, logged once until the index works again), never
raised to the request; ``update_trace_log`` alone raises it to its caller uncounted.

What is kept true against the engine:
- Restarts (``liveness.py``) empty the table; before a ``hit`` is announced either the engine vouches that it is the
  process that answered when the slot's content was last learnt (``Engine.vouches(Slot.epoch)``), or the watch
  checks the engine's own record of that slot (``slot_lost``), else the table is emptied and the session's snapshot
  restored. A restart is noticed once (``Slot.notices``). Every save first asks the engine's slot states whether the
  slot is idle and still holds what the table learnt there (``UpstreamWatch.unsaveable``).
- ``stop`` (SIGTERM/SIGINT): snapshot every resident session, bounded by ``shutdown_save_timeout_s`` (none at all
  when the engine is gone, ``Engine.reachable``); with a shared index the node then removes its heartbeat, so other
  nodes take its sessions over.
- ``prune`` at start-up, every hour and every 64 history writes: sessions unused for ``--session-ttl-days``, beyond
  ``--max-sessions`` or beyond ``--max-index-mb`` of index on disk (oldest first) are forgotten with their snapshots
  (never one that holds a slot or is in flight).
- Idle saves (``--idle-save-s``, the scheduler's) and one write budget for every snapshot
  (``snapshot_store.WriteBudget``, ``--idle-save-mb-s``): a session displaced while too many writes are unpaid is not
  saved (``evicted_saves_skipped``); its next turn restores its previous snapshot and prefills the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from pflash_proxy.config import Settings
from pflash_proxy.contract import Message, SessionsView
from pflash_proxy.engine import Engine, EngineNotReady, EngineUnreachable
from pflash_proxy.sessions import chains
from pflash_proxy.sessions.chains import Item
from pflash_proxy.sessions.cluster import ClusterNode, TurnLease
from pflash_proxy.sessions.identity import credential, message_hash, namespace_seed
from pflash_proxy.sessions.background import Background
from pflash_proxy.sessions.index import (SessionIndex, SessionRecord, SnapshotRecord, StoreError, TraceLog,
                                         open_index, run)
from pflash_proxy.sessions.scheduler import SlotScheduler
from pflash_proxy.sessions.slots import (ANONYMOUS_KEY, NO_CREDENTIAL, SLOT_KEY, Lease, Slot, SlotReport,
                                         SlotsPrefetch)
from pflash_proxy.sessions.snapshot_store import SnapshotStore
from pflash_proxy.sessions.stats import SessionStats

if TYPE_CHECKING:
    from pflash_proxy.compress import RecallSource

log = logging.getLogger("pflash_proxy.sessions")

T = TypeVar("T")

# a request body below this is looked up in, and its served history written to, a local index on the event loop
# (hashing it and a few SQLite reads or one write: well under a millisecond, less than the hop to a worker
# thread and back)
INLINE_BYTES = 32 * 1024
LOOKUP_ATTEMPTS = 9  # lookups under a lease before the last decision stands
_SEEDS_MAX = 4096  # namespace answers kept (names and credentials are the clients': bounded)
CACHE_SLACK = 0.9  # the chat template may re-render the last few tokens of a turn; allow 10 % below
PREFIX_HIT_MIN = 32  # a "miss" that reused at least this many tokens reused someone's prefix (``hit-prefix``)
PRUNE_EVERY_S = 3600.0


@dataclass
class Found:
    """What ``_find_and_lease`` decided: the session, how many leading messages continue its served history, the
    request's message hashes, and either the slot's lease (and, with several nodes, the session's turn lease) or
    the node the turn is forwarded to."""

    record: SessionRecord
    matched: int
    hashes: list[str]
    lease: Lease | None
    turn: TurnLease | None = None
    forward: tuple[str, str] | None = None  # (node, URL)
    prefetched: SlotsPrefetch | None = None  # the slots' states asked beside the lookup (the turn readies its slot with them)


@dataclass(frozen=True)
class TurnAsk:
    """What ``SessionService.begin`` needs of a request: its route (``chat``: a conversation, found in or added to
    the sessions; ``batch``: several prompts, every slot; ``anonymous``: any other generating route, a slot of its
    own), its headers (the credential: whose sessions it reaches), the client's name for the session, its messages,
    its body's size (where the index is asked), the node that forwarded it (verified by the server) and the node a
    forward of this very turn did not reach (its sessions are taken over here)."""

    route: Literal["chat", "batch", "anonymous"]
    headers: Mapping[str, str]
    name: str | None = None
    messages: Sequence[Message] = ()
    body_bytes: int = 0
    forwarded_by: str | None = None
    unreachable: str | None = None


@dataclass(frozen=True)
class Observed:
    """What a turn's answer said of its slot's cache (``Turn.observe``): the tokens the engine reused, what the
    turn is reported as (``reported_cache``) and why, when a hit or restore was a miss after all."""

    cached: int
    reported: str
    reason: str | None


def reported_cache(announced: str, expected: int, cached: int) -> tuple[str, str | None]:
    """What a turn announced as ``announced`` (``hit``/``restored``/``miss``, ``expected`` tokens from cache) is
    reported as once the engine said it reused ``cached`` prompt tokens, and why when it is a miss after all:
    a hit or restore that reused clearly less is a ``miss``; a miss that reused a prefix already in the slot (a
    new session opening like the slot's last one) is a ``hit-prefix``."""
    if announced in ("hit", "restored") and cached < expected * CACHE_SLACK - 8:
        return "miss", f"announced {announced} (~{expected} tokens), llama-server reused {cached}"
    if announced == "miss" and cached >= PREFIX_HIT_MIN:
        return "hit-prefix", None
    return announced, None


def _lookup_key(rec: SessionRecord | None, matched: int) -> tuple[str, int, int, int]:
    """What a lookup decided on: the session, how much of the request it covers, its length and turn count."""
    return ("", 0, 0, 0) if rec is None else (rec.id, matched, len(rec.served), rec.turns)


def served_version(client: Message, stored: Mapping[str, object]) -> Message:
    """The client's message with only what the proxy rewrote (its content) taken from the served history.

    Identity hashes role, content, tool calls, tool id and name; any other field (``reasoning_content``,
    provider extras) comes from this client, never from whichever client first served the same visible history.
    """
    if client == stored or stored.get("content") == client.get("content"):
        return client
    return {**client, "content": stored.get("content")}


def message_hashes(messages: Sequence[Message], before: Sequence[Message], hashes: Sequence[str]) -> list[str]:
    """``message_hash`` of each message, taken from ``hashes`` where the message equals the one at its position
    in ``before`` (messages hashed earlier, most of which the later stages leave alone)."""
    return [hashes[i] if i < len(before) and (m is before[i] or m == before[i]) else message_hash(m)
            for i, m in enumerate(messages)]


class Turn:
    """One request's turn, from ``SessionService.begin`` to ``close``: what it holds (the slot's lease; every slot's
    for a batch, ``batch``; none when another node holds the session, ``forward``), what was found (``record``,
    ``matched``, ``served``) and how the slot was made ready (``cache``, ``expected``, ``cold``, ``pin``), and what the
    caller may do next: ``observe`` the answer, ``reported`` (a whole answer's cache), ``commit`` the served history,
    ``close``."""

    def __init__(self, service: SessionService, leases: list[Lease], *, batch: bool = False,
                 found: Found | None = None, degraded: str | None = None):
        self._service = service
        self._leases = leases
        self._closed = False
        self.batch = batch  # every slot, for a batch of prompts: released unknown to the table
        self.record: SessionRecord | None = found.record if found is not None else None  # None: anonymous
        self.matched = found.matched if found is not None else 0  # leading messages that continue its history
        self.hashes: list[str] = found.hashes if found is not None else []  # the client's messages' hashes
        self._cluster_turn = found.turn if found is not None else None
        self.forward = found.forward if found is not None else None  # (node, URL) of the node holding the session
        self.served: list[Message] = []  # what the engine is sent, message by message
        self._hashed: tuple[list[Message], list[str]] = ([], [])  # the served messages hashed before later stages
        self.cache, self.expected, self.cold = "miss", 0, False  # what the slot was made ready as
        self.pin: dict[str, object] = {}  # the fields that send the request to its slot
        self.node = service._node_id  # this node, when several share the index
        self.taken_from: str | None = None  # the node this one took the session over from
        self.queue_ms: float | None = None  # the wait for the slot (None: a batch)
        self.degraded = degraded  # why the turn has no session although it is a conversation's (the index failed)

    @property
    def slot(self) -> int | None:
        """The slot the request is pinned to (None: a batch, a forwarded turn)."""
        return self._leases[0].slot.id if self._leases and not self.batch else None

    @property
    def cache_reason(self) -> str | None:
        """Why the session is a miss although it had a snapshot."""
        return self._leases[0].reason if self._leases else None

    def observe(self, report: SlotReport) -> Observed | None:
        """Record what the slot holds after the answer (``SlotReport.of``); what the engine reused and what the turn
        is reported as (a prefix hit is counted), or None when the answer did not say (a batch, a forwarded turn,
        a rejected request, a cut stream)."""
        if self.batch or not self._leases:
            return None
        served_hashes = message_hashes(self.served, *self._hashed)
        cached = self._service._observe(self._leases[0], self.cache, self.expected, served_hashes, report)
        if cached is None:
            return None
        reported, reason = self._service._report(self.cache, self.expected, cached)
        return Observed(cached, reported, reason)

    def reported(self, cached: int) -> tuple[str, str | None]:
        """What a whole answer that reused ``cached`` tokens is reported as, and why (uncounted: ``observe``
        counts the turn)."""
        return reported_cache(self.cache, self.expected, cached)

    def commit(self, served: list[Message], body_bytes: int, recall: RecallSource | None = None
               ) -> Awaitable[bool]:
        """Start writing ``served`` (what is forwarded) as the session's history, with ``recall`` (the lines the
        compression omitted this turn, which a later turn may recall) added to the record's recall sources; the
        awaitable says whether it was kept (False: the index failed, counted). Only a turn with a session commits."""
        if self.record is None:
            raise ValueError("an anonymous turn has no history to commit")
        self.served = served
        if recall is not None:
            self.record.recall_sources = [*self.record.recall_sources, recall]
        return self._service._commit(self.record, self.hashes, served, body_bytes)

    async def close(self, engine_may_be_busy: bool = False) -> None:
        """Release what the turn holds, once (later calls do nothing): the cluster's turn lease, then the slot
        (``engine_may_be_busy``: the request went to the engine and ended before its answer did, so the slot stays
        leased until the engine is idle on it) and ``--save-every-turn``; a batch's slots are left unknown."""
        if self._closed:
            return
        self._closed = True
        svc = self._service
        try:
            await svc._end_turn(self._cluster_turn)
        finally:
            if self.batch:
                for lease in self._leases:
                    svc._scheduler.release_unknown(lease)
            elif self._leases:
                svc._finish(self._leases[0], self.record.id if self.record is not None else None,
                            engine_may_be_busy)


class SessionService:
    """The session layer: the turn and the admin faces of the module docstring. ``settings``: each
    collaborator is handed its own group; ``engine``: the engine behind the proxy, whose slots can be addressed;
    ``index``: a session index of the caller's (a test's fault-injecting one), else the one ``--index`` names."""

    def __init__(self, settings: Settings, engine: Engine, index: SessionIndex | None = None):
        if engine.slots is None:
            raise ValueError("sessions need an engine whose slots can be addressed (Engine.slots)")
        self._settings = settings.sessions
        self._engine = engine
        self._pin_fields = engine.slots.pin_fields
        self._index: SessionIndex = index if index is not None else open_index(settings.proxy.home,
                                                                               settings.cluster.index)
        # several nodes sharing the index (--index redis://): holders, turn leases, heartbeats (cluster.py)
        shared = self._index.as_cluster()
        self._cluster = ClusterNode(settings.cluster, shared, node_id=settings.effective_node_id,
                                    url=settings.effective_advertise_url,
                                    queue_timeout_s=settings.limits.queue_timeout_s) if shared is not None else None
        slot_dir = settings.effective_slot_save_path
        self._scheduler = SlotScheduler(settings.sessions, settings.limits, settings.upstream, slot_dir, engine)
        self._watch = self._scheduler.watch  # the engine's liveness, the scheduler's; the snapshot store reads it
        self._snapshots = SnapshotStore(settings.sessions, slot_dir, self._index, self._watch, engine,
                                        self._store_failed,
                                        temp_tag=self._cluster.tag if self._cluster is not None else "")
        self._seeds: dict[tuple[str, str | None, str | None], str] = {}  # namespace_seed's answers
        # hits, lost slots, restarts and idle saves are the scheduler's counters; saves and restores the store's
        self._counters = {"misses": 0, "cache_mismatches": 0, "sessions_pruned": 0, "store_failures": 0,
                          "prefix_hits": 0}
        self._store_down = False
        self._writes = 0
        self._pruner: asyncio.Task[None] | None = None
        self._bound: asyncio.Task[list[str]] | None = None
        self._background = Background()  # what it started and does not await

    # The admin face ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self._snapshots.start()
        if self._cluster is not None:
            await self._cluster.start()
        self._pruner = asyncio.create_task(self._prune_loop())
        self._scheduler.start(self._snapshots)
        try:
            await self._watch.ensure_ready(wait=False)  # down: say so now, never wait for it at start-up
        except (EngineUnreachable, EngineNotReady) as exc:
            log.warning("upstream not reachable at start-up (%s); will retry on the first request", exc)

    async def stop(self) -> None:
        """Snapshot every resident session (bounded by ``--shutdown-save-timeout-s``; none when the engine is gone),
        leave the cluster, close the index."""
        self._scheduler.stop()
        if self._pruner is not None:
            self._pruner.cancel()
        resident = [s for s in self._scheduler.table.slots if s.session and not s.anonymous
                    and not s.snapshot_current and s.tokens]
        if resident and self._watch.ready and not await self._engine.reachable(timeout_s=10):
            # a dead engine saves nothing: do not wait for it; the sessions keep their last snapshots (a slow
            # answer, a loaded machine, counts as alive: a shutdown never skips saves that could still be made)
            log.warning("llama-server does not answer: %d resident sessions not saved at shutdown (their last "
                        "snapshots, if any, stay)", len(resident))
        else:
            try:
                await asyncio.wait_for(self.save_all(), self._settings.shutdown_save_timeout_s)
            except asyncio.TimeoutError:
                log.error("shutdown snapshot save timed out after %.0fs", self._settings.shutdown_save_timeout_s)
        if self._cluster is not None:  # saved: other nodes may take this node's sessions over at once
            await self._cluster.stop()
        self._background.cancel()
        self._scheduler.close()
        self._index.close()

    async def ensure_ready(self) -> None:
        """Wait until the engine is described (its identity and slot count, read once per incarnation)."""
        await self._watch.ensure_ready()

    def view(self) -> SessionsView:
        """The read-only view of the sessions and slots (the inspector's)."""
        return ServiceView(self._scheduler, self._index, self._cluster)

    def stats(self) -> SessionStats:
        """Its counters and its collaborators' (``SessionStats.as_json``: the ``/pflash/stats`` object)."""
        return SessionStats(**self._counters, store_available=not self._store_down,
                            model_identity=self._watch.model_identity, scheduler=self._scheduler.stats(),
                            snapshots=self._snapshots.stats(), engine=self._engine.stats(),
                            cluster=self._cluster.stats() if self._cluster is not None else None)

    async def save_all(self) -> int:
        """Snapshot every resident session whose snapshot is not current; returns how many were written."""
        if not self._watch.ready:
            return 0
        sessions = [s.session for s in self._scheduler.table.slots if s.session and not s.anonymous]
        return sum([await self._snapshot_now(sid) for sid in sessions])

    @contextlib.asynccontextmanager
    async def slot_guard(self, slot_id: int) -> AsyncIterator[None]:
        """A client's slot action runs under a lease of that very slot, after which the table no longer claims to
        know its content."""
        lease = await self._lease_slot(slot_id)
        try:
            yield
        finally:
            self._scheduler.release_unknown(lease)

    def on_snapshot_timing(self, callback: Callable[[str, float], None] | None) -> None:
        """``callback(save|restore, seconds)`` after every snapshot save and restore (the metrics)."""
        self._snapshots.on_timing(callback)

    async def prune(self) -> list[str]:
        """Forget stale and surplus sessions and their snapshots (index work in a worker thread); the ids
        forgotten."""
        ttl = self._settings.session_ttl_days
        older_than = time.time() - ttl * 86400 if ttl > 0 else None
        keep = self._scheduler.table.in_use()
        limit = int(self._settings.max_index_mb * 2**20)
        index, max_sessions = self._index, self._settings.max_sessions

        def work() -> list[str]:
            gone = index.prune(older_than=older_than, max_sessions=max_sessions, keep=keep)
            while index.volume() > limit:  # the byte bound: drop a tenth of the sessions, oldest first
                n = index.count_sessions()
                more = index.prune(older_than=None, max_sessions=max(0, n - max(1, n // 10)), keep=keep)
                if not more:
                    break
                gone += more
            self._snapshots.delete(gone)
            return gone

        gone = await asyncio.get_running_loop().run_in_executor(None, work)
        if gone:
            self._counters["sessions_pruned"] += len(gone)
            log.info("pruned %d sessions (unused for %s days, beyond %d sessions or %g MB of index)", len(gone),
                     ttl or "∞", max_sessions, self._settings.max_index_mb)
        return gone

    async def _prune_loop(self) -> None:
        while True:
            try:
                await self.prune()
            except Exception:  # noqa: BLE001 - a failed sweep must not stop the next one
                log.exception("session pruning failed")
            await asyncio.sleep(PRUNE_EVERY_S)

    # The turn -----------------------------------------------------------------------------------------------
    async def begin(self, ask: TurnAsk, progress: Callable[[str], None] = lambda _: None) -> Turn:
        """The request's turn, its slot ready (module docstring): a conversation's session found or started and its
        slot leased (or the node holding it named: ``Turn.forward``), an anonymous slot for another route or when
        the index failed (``Turn.degraded``), every slot for a batch. ``progress`` hears what it waits for. What the
        turn holds is released if this fails or is cancelled; else ``Turn.close`` releases it."""
        await self._watch.ensure_ready()
        owner = self.owner(ask.headers)
        if ask.route == "batch":
            return await self._batch_turn(owner)
        degraded = None
        if ask.route == "chat":
            if ask.unreachable is not None and self._cluster is not None:  # the holder did not answer: take over
                self._cluster.peer_failed(ask.unreachable)
            try:
                return await self._session_turn(ask, owner, progress)
            except StoreError:  # the index is unreadable (counted): served without a session, unsaved
                degraded = "session index unavailable; served without a session"
        return await self._anonymous_turn(owner, progress, degraded)

    def owner(self, headers: Mapping[str, str]) -> str | None:
        """The hash of a request's credential (``identity.credential``): whose sessions and responses it reaches."""
        return credential(headers, self._index.salt)

    async def _session_turn(self, ask: TurnAsk, owner: str | None, progress: Callable[[str], None]) -> Turn:
        t_wait = time.monotonic()
        progress("waiting for a llama-server slot")
        messages = list(ask.messages)
        seed = await self._seed(ask.name, owner)
        found = await self._find_and_lease(seed, ask.name is not None, owner, messages, ask.body_bytes,
                                           ask.forwarded_by, may_forward=ask.unreachable is None)
        turn = Turn(self, [found.lease] if found.lease is not None else [], found=found)
        if found.lease is None:  # another live node holds the session (its slot is warm): the turn goes there
            return turn
        lease, record, matched = found.lease, found.record, found.matched
        try:
            if self._cluster is not None:
                turn.taken_from = await self._claim(record.id, ask.forwarded_by)
            turn.queue_ms = round((time.monotonic() - t_wait) * 1000, 2)
            served = [served_version(c, s) for c, s in zip(messages[:matched], record.served)] + messages[matched:]
            served_hashes = message_hashes(served, messages, found.hashes)  # a message served as sent: its hash
            turn.served, turn._hashed = served, (served, served_hashes)
            progress("restoring the session" if not lease.resident else "checking the slot")
            self._scheduler.note_seed(lease, seed)
            lease.prefetched = found.prefetched
            cache, expected = await self._ready_slot(lease, served_hashes)
            cold = await self._scheduler.isolate([lease], owner, replaced=cache != "miss")  # --cache-isolation
            if turn.taken_from is not None and self._cluster is not None:  # restored from the shared directory
                self._cluster.note_takeover(cache)
        except BaseException:
            await turn.close()
            raise
        turn.cache, turn.expected, turn.cold, turn.pin = cache, expected, cold, self._pin_fields(lease.slot.id)
        return turn

    async def _anonymous_turn(self, owner: str | None, progress: Callable[[str], None], degraded: str | None
                              ) -> Turn:
        """A slot of its own for a request without a session: what its lease displaced saved, credentials
        isolated (a miss)."""
        t_wait = time.monotonic()
        progress("waiting for a llama-server slot")
        lease = await self._scheduler.table.acquire(ANONYMOUS_KEY + uuid.uuid4().hex)
        turn = Turn(self, [lease], degraded=degraded)
        turn.queue_ms = round((time.monotonic() - t_wait) * 1000, 2)
        try:
            await self._ready_slot(lease, None)
            turn.cold = await self._scheduler.isolate([lease], owner, replaced=False)
        except BaseException:
            await turn.close()
            raise
        turn.pin = self._pin_fields(lease.slot.id)
        return turn

    async def _batch_turn(self, owner: str | None) -> Turn:
        """Every slot, in slot order (two batches never deadlock; displaced sessions are saved first), each left
        unknown to the table when released; ``Turn.cold``: send with the cache off."""
        leases: list[Lease] = []
        try:
            for slot in range(len(self._scheduler.table.slots)):
                leases.append(await self._lease_slot(slot))
            # --cache-isolation: the engine may run any prompt of the batch on any slot
            cold = await self._scheduler.isolate(leases, owner, replaced=False)
        except BaseException:
            for lease in leases:
                self._scheduler.release_unknown(lease)
            raise
        turn = Turn(self, leases, batch=True)
        turn.cold = cold
        return turn

    async def _seed(self, explicit: str | None, owner: str | None) -> str:
        """The lookup's namespace (``identity.namespace_seed``); a failed index is counted and raised."""
        if explicit and len(explicit) == 32 and all(c in "0123456789abcdef" for c in explicit):
            try:
                rec = await run(self._index, self._index.get, explicit)
            except StoreError as exc:
                self._store_failed("looking up the session", exc)
                raise
            if rec is not None and rec.owner == owner:
                return rec.seed
        key = (self._watch.model_identity, explicit, owner)
        seed = self._seeds.get(key)
        if seed is None:
            if len(self._seeds) >= _SEEDS_MAX:
                self._seeds.clear()
            seed = self._seeds[key] = namespace_seed(*key)
        return seed

    async def _find_and_lease(self, seed: str, explicit: bool, owner: str | None, messages: Sequence[Message],
                              body_bytes: int, forwarded_by: str | None = None, may_forward: bool = True) -> Found:
        """The session and its slot's lease (module docstring): ``body_bytes``, the request's size, decides where
        a local index is asked; ``may_forward``: False once a forward of this turn failed (the turn is then served
        here). A failed index is counted and raised."""
        prefetched = self._scheduler.prefetch_slots(seed)  # a likely hit's slot-state check, beside the lookup
        try:
            found = await self._lookup_and_lease(seed, explicit, owner, messages, body_bytes, forwarded_by,
                                                 may_forward)
        except StoreError as exc:
            self._store_failed("looking up the session", exc)
            raise
        found.prefetched = prefetched
        return found

    async def _lookup_and_lease(self, seed: str, explicit: bool, owner: str | None, messages: Sequence[Message],
                                body_bytes: int, forwarded_by: str | None, may_forward: bool) -> Found:
        index, cluster, table = self._index, self._cluster, self._scheduler.table
        small = body_bytes < INLINE_BYTES
        msgs = list(messages)

        async def lookup() -> tuple[SessionRecord | None, int, list[str]]:
            return await run(index, index.lookup, seed, msgs, small=small)
        for attempt in range(LOOKUP_ATTEMPTS):
            mark = index.write_mark()
            found, matched, hashes = await lookup()
            key = _lookup_key(found, matched)
            if found is not None and found.owner != owner:  # a seed is never shared across owners: belt and braces
                found, matched = None, 0
            if found is None:
                record = index.new_session(seed, explicit, owner=owner)
            elif matched < len(found.served):
                log.info("request diverges from session %s at message %d; forking", found.id[:8], matched)
                record = index.new_session(seed, explicit, parent=found, upto=matched, owner=owner)
            else:
                record = found
            if cluster is not None and record is found and may_forward:
                target = await cluster.place(record.id, forwarded_by)
                if target is not None:
                    return Found(record, matched, hashes, None, forward=target)
            # a new session (or a fork: one that shares only an opening, a system prompt, is one) goes where
            # llama-server can reuse that opening (slots.py step 1)
            share = (hashes, owner if owner is not None else NO_CREDENTIAL) if record is not found else None
            lease = await table.acquire(record.id, share=share)
            turn: TurnLease | None = None
            try:
                if cluster is not None:
                    turn = await cluster.begin_turn(record.id)
                if index.unchanged_since(mark):
                    return Found(record, matched, hashes, lease, turn)
                again, matched2, _ = await lookup()
            except BaseException:
                await self._end_turn(turn)
                table.release(lease)
                raise
            if _lookup_key(again, matched2) == key:
                # the same decision; the record as written since (by another node, or a recall source kept meanwhile)
                return Found(again if record is found and again is not None else record, matched, hashes, lease, turn)
            if attempt == LOOKUP_ATTEMPTS - 1:
                return Found(record, matched, hashes, lease, turn)
            await self._end_turn(turn)
            table.release(lease)  # another request of this session saved meanwhile: decide again
        raise AssertionError("unreachable")

    async def _end_turn(self, turn: TurnLease | None) -> None:
        if turn is not None and self._cluster is not None:
            await self._cluster.end_turn(turn)

    @property
    def _node_id(self) -> str | None:
        """This node's id when several nodes share the index, else None."""
        return self._cluster.node_id if self._cluster is not None else None

    async def _claim(self, sid: str, forwarded_by: str | None) -> str | None:
        """This node becomes the session's holder; the node it was taken over from (None: none, or the index
        failed, counted)."""
        if self._cluster is None:
            return None
        try:
            return await self._cluster.claim(sid, forwarded_by)
        except StoreError as exc:
            self._store_failed("claiming the session", exc)
            return None

    async def _ready_slot(self, lease: Lease, served_hashes: list[str] | None) -> tuple[str, int]:
        """Save what the lease displaced; then a hit, a restore or a miss (None: an anonymous lease, a miss)."""
        self._scheduler.stamp(lease)
        await self._snapshots.save_displaced(lease)
        if served_hashes is None:
            return "miss", 0
        hit = await self._scheduler.resident_hit(lease, served_hashes)
        if hit is not None:
            return "hit", hit
        restored = await self._snapshots.restore(lease, served_hashes)
        if restored is not None:
            return "restored", restored
        self._counters["misses"] += 1
        return "miss", 0

    async def _lease_slot(self, slot_id: int) -> Lease:
        """Lease slot ``slot_id`` itself; its session is saved first if it must be."""
        await self._watch.ensure_ready()
        lease = await self._scheduler.table.acquire(f"{SLOT_KEY}{slot_id}")
        await self._ready_slot(lease, None)
        return lease

    # After the answer -------------------------------------------------------------------------------------
    def _observe(self, lease: Lease, cache: str, expected: int, served_hashes: list[str], report: SlotReport
                ) -> int | None:
        """What the slot holds now, from the answer's report (``SlotReport.of``); the tokens the engine took from
        its cache (None: not told)."""
        slot = lease.slot
        if report.rejected:
            return None  # the server rejected the request; the slot keeps what it had
        if report.cached_tokens is None:
            slot.known = False  # cannot verify (client gone, stream cut): treat content as unknown
            return None
        cached = report.cached_tokens
        if expected and cached < expected * CACHE_SLACK - 8:
            self._counters["cache_mismatches"] += 1
            log.warning("slot %d: server reused %d cached tokens, the table expected ~%d (%s); slot content unknown",
                        slot.id, cached, expected, cache)
        slot.prompt_tokens = report.prompt_tokens
        slot.tokens = report.prompt_tokens + report.generated_tokens
        slot.served_hashes = served_hashes
        slot.known = True
        slot.epoch = lease.epoch  # what the server said in that epoch; a break since then is not vouched for
        slot.notices = lease.notices
        slot.snapshot_current = False
        return cached

    def _report(self, announced: str, expected: int, cached: int) -> tuple[str, str | None]:
        """What the turn is reported as (``reported_cache``); a prefix hit is counted."""
        reported, reason = reported_cache(announced, expected, cached)
        if reported == "hit-prefix":
            self._counters["prefix_hits"] += 1
        return reported, reason

    def _finish(self, lease: Lease, sid: str | None, engine_may_be_busy: bool) -> None:
        """Release the turn's lease (``engine_may_be_busy``: the request went to the engine and ended before its
        answer did, so the slot stays leased until the engine is idle on it); then ``--save-every-turn``."""
        if engine_may_be_busy:
            self._scheduler.release_when_idle(lease)
        else:
            self._scheduler.table.release(lease)
        if sid is not None and self._settings.save_every_turn:
            self._background.spawn(self._snapshot_now(sid))

    async def _snapshot_now(self, sid: str) -> bool:
        """Save ``sid``'s slot now (waiting for its running request, if any); True when a snapshot was written
        (the snapshot is then current).

        Only a resident session is leased, and only while it stays resident: a session that lost its slot while
        waiting has nothing to save, and a save never displaces another session (``resident_only``).
        """
        table = self._scheduler.table
        if table.resident(sid) is None:
            return False
        lease = await table.acquire(sid, resident_only=True)
        if lease is None:
            return False
        try:
            return (await self._snapshots.save_leased(lease)).record is not None
        finally:
            table.release(lease)

    # The index --------------------------------------------------------------------------------------------
    def _store_failed(self, what: str, exc: Exception) -> None:
        """Count an index failure; log it once until the index works again (``_store_ok``)."""
        self._counters["store_failures"] += 1
        if not self._store_down:
            self._store_down = True
            log.error("session index unavailable while %s (%s); requests are served without saving until it "
                      "recovers", what, exc)

    def _store_ok(self) -> None:
        if self._store_down:
            self._store_down = False
            log.warning("session index writable again; sessions are saved as before")

    def _commit(self, record: SessionRecord, client_hashes: list[str], served: list[Message], body_bytes: int
               ) -> Awaitable[bool]:
        """Start writing the served history now; the awaitable says whether it was kept (False: the index failed,
        counted). A short history in a local index is written on the loop, in a task that writes once the tasks
        ready when the caller waits have run (the request has left by then: ``_write_inline``); unless a write
        of this process (a long history's save, a prune) is running: SQLite would make the loop wait for its
        lock, so that one waits in a worker thread."""
        index = self._index
        write: asyncio.Future[None]
        if body_bytes < INLINE_BYTES and not index.remote:
            write = asyncio.ensure_future(self._write_inline(record, client_hashes, served))
        else:
            write = asyncio.get_running_loop().run_in_executor(None, index.save_session, record, client_hashes,
                                                               served)
        return self._committed(write)

    async def _write_inline(self, record: SessionRecord, client_hashes: list[str], served: list[Message]) -> None:
        index = self._index
        # The caller goes on to send the request and waits for its answer. The client's task that writes the
        # request was made after this one, so on Python 3.11 (no eager tasks) it would run after this write: let
        # the tasks ready now run first, and the write overlaps the engine's work instead of delaying it.
        await asyncio.sleep(0)
        if index.write_mark() is None:
            await asyncio.get_running_loop().run_in_executor(None, index.save_session, record, client_hashes,
                                                             served)
        else:
            index.save_session(record, client_hashes, served)

    async def _committed(self, write: Awaitable[None]) -> bool:
        try:
            await write
        except StoreError as exc:  # disk full, damaged index: the request is served, the history not kept
            self._store_failed("saving the served history", exc)
            return False
        self._store_ok()
        self._writes += 1  # every 64 history writes, the index's byte bound is checked in the background
        if self._writes % 64 == 0 and (self._bound is None or self._bound.done()):
            self._bound = self._background.spawn(self.prune())
        return True

    async def update_trace_log(self, sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog | None:
        """The session's trace log replaced by ``update(current)`` (``SessionIndex.update_trace_log``), in a worker
        thread; what the index raises is the caller's to handle (the inspector logs it, uncounted)."""
        return await run(self._index, self._index.update_trace_log, sid, update)

    async def expand_chain(self, rid: str, owner: str | None) -> list[Item] | None:
        """The items Responses answer ``rid`` stands for (``chains.expand``), in a worker thread; None when it was
        not recorded for ``owner`` or the index failed (counted)."""
        return await self._index_work(functools.partial(chains.expand, self._index, rid, owner),
                                      "looking up a previous response")

    async def record_response(self, rid: str, sid: str, owner: str | None, items: list[Item],
                              parent: tuple[str, int] | None) -> None:
        """Record Responses answer ``rid`` of session ``sid`` (``chains.record``), in a worker thread; a failed
        index is counted."""
        await self._index_work(functools.partial(chains.record, self._index, rid, sid, owner, items, parent),
                               "recording a response")

    async def _index_work(self, work: Callable[[], T], what: str) -> T | None:
        """``work()`` in a worker thread; None when the index failed (counted as ``what``)."""
        try:
            return await run(self._index, work)
        except StoreError as exc:
            self._store_failed(what, exc)
            return None


class SessionAdmin(Protocol):
    """The session service's admin face, the application's (``server/app.py`` holds it): starting and stopping
    it, saving every resident session, pruning, a client's slot action, the snapshot timings the metrics hear, the
    stats and the read-only view; ``owner`` says whose slots a request may see."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def save_all(self) -> int: ...
    async def prune(self) -> list[str]: ...
    def slot_guard(self, slot_id: int) -> contextlib.AbstractAsyncContextManager[None]: ...
    def on_snapshot_timing(self, callback: Callable[[str, float], None] | None) -> None: ...
    def stats(self) -> SessionStats: ...
    def view(self) -> SessionsView: ...
    def owner(self, headers: Mapping[str, str]) -> str | None: ...


class ServiceView:
    """``contract.SessionsView`` of a ``SessionService``: copies and index reads, nothing that changes it."""

    def __init__(self, scheduler: SlotScheduler, index: SessionIndex, cluster: ClusterNode | None):
        self._scheduler, self._index, self._cluster = scheduler, index, cluster

    @property
    def model_identity(self) -> str:
        return self._scheduler.watch.model_identity

    @property
    def identity_info(self) -> dict[str, object]:
        return dict(self._scheduler.watch.identity_info)

    @property
    def queued(self) -> int:
        return self._scheduler.table.queued

    def slots(self) -> list[Slot]:
        return [replace(s, served_hashes=list(s.served_hashes)) for s in self._scheduler.table.slots]

    def resident_slot(self, sid: str) -> int | None:
        slot = self._scheduler.table.resident(sid)
        return slot.id if slot is not None else None

    def last_uses(self) -> dict[str, float]:
        return self._index.last_uses()

    def session(self, sid: str) -> SessionRecord | None:
        return self._index.get(sid)

    def trace_log(self, sid: str) -> TraceLog | None:
        return self._index.trace_log(sid)

    def snapshot(self, sid: str) -> SnapshotRecord | None:
        return self._index.snapshot(sid)

    def holder(self, sid: str) -> str | None:
        return self._cluster.index.holder(sid) if self._cluster is not None else None
