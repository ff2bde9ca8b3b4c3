"""``SessionService``: the session layer, in the stages' own terms: the turn API below, over three collaborators,
each given only its own settings group: the slot scheduler (``scheduler.SlotScheduler``: the slot table, the
engine's liveness, credential isolation, idle saves), the snapshot store (``snapshot_store.SnapshotStore``: every
save and restore, within one write budget) and the session index (``index``), with a ``ClusterNode`` when several
nodes share the index. The stages call this object only; it alone decides where an index call runs
(``index.run``: from the index's declared ``remote``, and from the size of the request's history).

The turn:

1. Readiness and namespaces: ``ensure_ready`` (the engine's watch, ``liveness.py``, reads the engine's identity and
   slot count once per engine incarnation; the scheduler sizes its table from it); ``owner`` (the hash of a
   request's credential); ``seed`` (the lookup's namespace: the model identity, the owner and the client's session
   name; a session id the client echoes continues that session's namespace when the session is its own
   credential's).
2. Find and lease (``find_and_lease``): the session whose served history is the longest prefix of the request,
   or a new one, or a fork of one the request diverges from; then its slot's lease. When a hit of the namespace is
   likely and the engine does not vouch for it, the slots' states are asked beside the lookup
   (``SlotScheduler.prefetch_slots``, ``Found.prefetched``). The lease serialises a session's requests, but the
   first lookup happens before the wait, so it is repeated under the lease unless no write that can change its
   answer or the record it read ran since (``SessionIndex.write_mark``); when the answer is the same, the record
   read under the lease is the one used; when the answer changed, the lease is returned and the decision taken
   again, at most ``LOOKUP_ATTEMPTS`` times in all (then the last decision stands). A history under
   ``INLINE_BYTES`` in a local index is looked up on the loop.
3. Several nodes (``cluster.py``): a session another live node holds is not leased here (``Found.forward`` names
   that node); otherwise the session's turn lease in the shared index is taken with the slot's
   (``Found.turn``, freed by ``end_turn``) and ``claim`` makes this node the holder (the node it took the session
   over from, if any). ``forward_failed``: the holder did not answer, its sessions are taken over here.
4. Slots: ``prepare`` saves a displaced session (unless its snapshot is current), then this session is a
   ``hit`` (the slot still holds a prefix of its history: ``SlotScheduler.resident_hit``), ``restored`` (its
   snapshot, after any save of it still running: a session displaced a moment ago may come back while its slot is
   being saved) or a ``miss``, with the tokens expected from cache; then credentials are isolated
   (``--cache-isolation``) and the request's slot pin given (``Prepared.pin``). Anonymous leases
   (``lease_anonymous``/``prepare_anonymous``), every slot for a batch (``lease_all``), one slot for a client's
   slot action (``slot_guard``).
5. After the answer: ``observe`` compares the tokens the answer's cache report (``SlotReport``) says came from
   the cache with the expectation; a shortfall marks the slot unknown, logs it, and counts in
   ``cache_mismatches``; then records what the slot now holds. ``report`` says what the turn is reported as
   (``reported_cache``: the engine's number, not the expectation); ``finish`` releases the lease (or keeps it until
   the engine's slot is idle), then saves with ``--save-every-turn``.
6. The index: ``commit`` starts writing the served history now (on the loop for a short history in a local
   index, once the request it commits has been sent to the engine, else in a worker thread) and says later
   whether it was kept; ``update_trace_log`` (the inspector's traces of a turn, after its answer) and
   ``index_work`` (the response chains' reads and writes) run in a worker thread. A failed index call is counted
   and logged (``store_failures``, logged once until the index works again), never raised to the request
   (``seed`` and ``find_and_lease`` count it and raise it, so the stage serves the request without a session);
   ``update_trace_log`` alone raises it to its caller uncounted.

What is kept true against the engine:

7. Restarts (``liveness.py``) empty the table; before a ``hit`` is announced either the engine vouches that it
   is the process that answered when the slot's content was last learnt (``Engine.vouches(Slot.epoch)``; no
   slot-state call at all), or the watch checks the engine's own record of that slot (``slot_lost``), else the
   table is emptied and the session's snapshot restored. A restart is noticed once: a check (before a hit, before
   a save) that finds a slot's content gone counts one only if none was noticed since the request that put that
   content there was prepared (``Slot.notices``; a turn that ran across a noticed restart may have left the old
   process's content). Every save first asks the engine's slot states whether the slot is idle and still holds
   what the table learnt there (``UpstreamWatch.unsaveable``): a slot a restart emptied is never saved, and a save
   that cannot be verified, or that the engine answers with fewer tokens than expected, leaves the session's
   previous snapshot as it was.
8. ``stop`` (SIGTERM/SIGINT): snapshot every resident session, bounded by ``shutdown_save_timeout_s`` (none at all
   when the engine is gone, ``Engine.reachable``: nothing could be saved); with a shared index the node then
   removes its heartbeat, so other nodes take its sessions over.
9. ``prune`` at start-up, every hour and every 64 history writes: sessions unused for ``--session-ttl-days``,
   beyond ``--max-sessions`` or beyond ``--max-index-mb`` of index on disk (oldest first) are forgotten with
   their snapshots (never one that holds a slot or is in flight).
10. Idle saves (``--idle-save-s``, 0 = off; the scheduler's): a resident session idle that long whose snapshot is
   not current is snapshotted once per change, one save at a time and within the write budget, never while its
   slot is busy: each save leases the slot without waiting, right after checking it is still idle (a slot whose
   next turn began meanwhile is left for a later round, never saved the moment that turn ends), and the engine's
   state of the slot must show it idle. A save that wrote nothing is not tried again until the slot's next turn,
   unless what stopped it passes by itself (the engine busy on the slot, or not answering): then after another
   ``--idle-save-s``. So a crash of the engine costs a session at most the turn in flight.
11. One write budget for every snapshot (``snapshot_store.WriteBudget``): on average at most ``--idle-save-mb-s``
   MB written per second, each save counted by the size of the file it wrote, whatever made it (an idle save, a
   displaced session, ``--save-every-turn``, shutdown). An idle save waits until what was written before it is
   paid for; a session displaced from its slot while more than ``snapshot_store.EVICTION_BURST_S`` seconds of
   writes are unpaid is not saved (``evicted_saves_skipped``): its previous snapshot, if any, stays, and its next
   turn restores that and prefills the rest, so the request that displaced it never waits for the disk. Saves at
   every turn and at shutdown are counted, never held back. A session whose content did not change since its last
   snapshot (the same served messages, for the running model, its file there) is not written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from pflash_proxy.config import Settings
from pflash_proxy.contract import SessionsView
from pflash_proxy.engine import Engine, EngineNotReady, EngineUnreachable
from pflash_proxy.sessions.cluster import ClusterNode, Turn
from pflash_proxy.sessions.identity import credential, namespace_seed
from pflash_proxy.sessions.background import Background
from pflash_proxy.sessions.index import (SessionIndex, SessionRecord, SnapshotRecord, StoreError, TraceLog,
                                         open_index, run)
from pflash_proxy.sessions.scheduler import SlotScheduler
from pflash_proxy.sessions.slots import NO_CREDENTIAL, SLOT_KEY, Lease, Slot, SlotReport, SlotsPrefetch
from pflash_proxy.sessions.snapshot_store import SnapshotStore

log = logging.getLogger("pflash_proxy.sessions")

T = TypeVar("T")
Message = dict[str, object]

# a request body below this is looked up in, and its served history written to, a local index on the event loop
# (hashing it and a few SQLite reads or one write: well under a millisecond, less than the hop to a worker
# thread and back)
INLINE_BYTES = 32 * 1024
LOOKUP_ATTEMPTS = 9  # lookups under a lease before the last decision stands (step 2)
_SEEDS_MAX = 4096  # namespace answers kept (names and credentials are the clients': bounded)
CACHE_SLACK = 0.9  # the chat template may re-render the last few tokens of a turn; allow 10 % below
PREFIX_HIT_MIN = 32  # a "miss" that reused at least this many tokens reused someone's prefix (``hit-prefix``)
PRUNE_EVERY_S = 3600.0


@dataclass
class Found:
    """What ``find_and_lease`` decided: the session, how many leading messages continue its served history, the
    request's message hashes, and either the slot's lease (and, with several nodes, the session's turn lease) or
    the node the turn is forwarded to."""

    record: SessionRecord
    matched: int
    hashes: list[str]
    lease: Lease | None
    turn: Turn | None = None
    forward: tuple[str, str] | None = None  # (node, URL)
    prefetched: SlotsPrefetch | None = None  # the slots' states asked beside the lookup (``prepare`` takes them)


@dataclass
class Prepared:
    """A leased slot made ready: ``hit``/``restored``/``miss``, the tokens expected from the cache, whether the
    request must be sent with the cache off (the slot could not be isolated from another credential), and the
    fields that send the request to the slot (``Slots.pin_fields``)."""

    cache: str
    expected: int
    cold: bool
    pin: dict[str, object]


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


class SessionService:
    """The session layer's one face to the stages: the turns of the module docstring. ``settings``: each
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

    # Lifecycle and what the server reads ------------------------------------------------------------------
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
        """Step 8."""
        self._scheduler.stop()
        if self._pruner is not None:
            self._pruner.cancel()
        resident = [s for s in self._scheduler.table.slots if s.session and not s.session.startswith("anon-")
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

    def view(self) -> SessionsView:
        """The read-only view of the sessions and slots (the inspector's)."""
        return ServiceView(self._scheduler, self._index, self._cluster)

    def stats(self) -> dict[str, object]:
        return {**self._counters, **self._scheduler.stats(), **self._snapshots.stats(),
                "store_available": not self._store_down, "model_identity": self._watch.model_identity,
                **self._engine.stats().as_json(), **({"cluster": self._cluster.stats()} if self._cluster is not None else {})}

    async def save_all(self) -> int:
        """Snapshot every resident session whose snapshot is not current; returns how many were written."""
        if not self._watch.ready:
            return 0
        sessions = [s.session for s in self._scheduler.table.slots
                    if s.session and not s.session.startswith("anon-")]
        return sum([await self._snapshot_now(sid) for sid in sessions])

    def on_snapshot_timing(self, callback: Callable[[str, float], None] | None) -> None:
        """``callback(save|restore, seconds)`` after every snapshot save and restore (the metrics)."""
        self._snapshots.on_timing(callback)

    async def prune(self) -> list[str]:
        """Step 9: forget stale and surplus sessions and their snapshots (index work in a worker thread); the ids
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

    # 1. Readiness and namespaces -----------------------------------------------------------------------------
    async def ensure_ready(self) -> None:
        await self._watch.ensure_ready()

    def owner(self, headers: Mapping[str, str]) -> str | None:
        """The hash of a request's credential (``identity.credential``): whose sessions and responses it reaches."""
        return credential(headers, self._index.salt)

    async def seed(self, explicit: str | None, owner: str | None) -> str:
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

    # 2-3. Find and lease, across nodes -----------------------------------------------------------------------
    async def find_and_lease(self, seed: str, explicit: bool, owner: str | None, messages: Sequence[Message],
                             body_bytes: int, forwarded_by: str | None = None, may_forward: bool = True) -> Found:
        """Steps 2 and 3: ``body_bytes``, the request's size, decides where a local index is asked;
        ``may_forward``: False once a forward of this turn failed (the turn is then served here). A failed index
        is counted and raised."""
        prefetched = self._scheduler.prefetch_slots(seed)  # a likely hit's slot-state check, beside the lookup
        try:
            found = await self._find_and_lease(seed, explicit, owner, messages, body_bytes, forwarded_by,
                                               may_forward)
        except StoreError as exc:
            self._store_failed("looking up the session", exc)
            raise
        found.prefetched = prefetched
        return found

    async def _find_and_lease(self, seed: str, explicit: bool, owner: str | None, messages: Sequence[Message],
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
            turn: Turn | None = None
            try:
                if cluster is not None:
                    turn = await cluster.begin_turn(record.id)
                if index.unchanged_since(mark):
                    return Found(record, matched, hashes, lease, turn)
                again, matched2, _ = await lookup()
            except BaseException:
                await self.end_turn(turn)
                table.release(lease)
                raise
            if _lookup_key(again, matched2) == key:
                # the same decision; the record as written since (by another node, or a recall source kept meanwhile)
                return Found(again if record is found and again is not None else record, matched, hashes, lease, turn)
            if attempt == LOOKUP_ATTEMPTS - 1:
                return Found(record, matched, hashes, lease, turn)
            await self.end_turn(turn)
            table.release(lease)  # another request of this session saved meanwhile: decide again
        raise AssertionError("unreachable")

    async def end_turn(self, turn: Turn | None) -> None:
        if turn is not None and self._cluster is not None:
            await self._cluster.end_turn(turn)

    @property
    def node_id(self) -> str | None:
        """This node's id when several nodes share the index, else None."""
        return self._cluster.node_id if self._cluster is not None else None

    def forward_failed(self, node: str) -> None:
        if self._cluster is not None:
            self._cluster.peer_failed(node)

    async def claim(self, sid: str, forwarded_by: str | None) -> str | None:
        """This node becomes the session's holder; the node it was taken over from (None: none, or the index
        failed, counted)."""
        if self._cluster is None:
            return None
        try:
            return await self._cluster.claim(sid, forwarded_by)
        except StoreError as exc:
            self._store_failed("claiming the session", exc)
            return None

    # 4. Slots ---------------------------------------------------------------------------------------------
    async def prepare(self, lease: Lease, seed: str, served_hashes: list[str], owner: str | None,
                      prefetched: SlotsPrefetch | None, taken_over: bool) -> Prepared:
        """The session's slot made ready for this turn (step 4), then isolated from other credentials."""
        self._scheduler.note_seed(lease, seed)
        lease.prefetched = prefetched
        cache, expected = await self._ready_slot(lease, served_hashes)
        cold = await self._scheduler.isolate([lease], owner, replaced=cache != "miss")  # --cache-isolation
        if taken_over and self._cluster is not None:  # restored from the shared directory, or cold
            self._cluster.note_takeover(cache)
        return Prepared(cache, expected, cold, self._pin_fields(lease.slot.id))

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

    async def lease_anonymous(self) -> Lease:
        """A lease of its own for a request without a session (completion routes, an unusable index)."""
        return await self._scheduler.table.acquire("anon-" + uuid.uuid4().hex)

    async def prepare_anonymous(self, lease: Lease, owner: str | None) -> Prepared:
        """Save what the anonymous lease displaced, isolate credentials (a miss; ``cold``: send with the cache
        off)."""
        await self._ready_slot(lease, None)
        cold = await self._scheduler.isolate([lease], owner, replaced=False)
        return Prepared("miss", 0, cold, self._pin_fields(lease.slot.id))

    async def lease_all(self, owner: str | None) -> tuple[list[Lease], bool]:
        """Every slot, in slot order (two batches never deadlock; displaced sessions are saved first), each left
        unknown to the table when released (``release_unknown``); True: send with the cache off."""
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
        return leases, cold

    def release_unknown(self, lease: Lease) -> None:
        """Release a batch's lease: the table no longer claims to know what its slot holds."""
        self._scheduler.release_unknown(lease)

    @contextlib.asynccontextmanager
    async def slot_guard(self, slot_id: int) -> AsyncIterator[None]:
        """A client's slot action runs under a lease of that very slot, after which the table no longer claims to
        know its content."""
        lease = await self._lease_slot(slot_id)
        try:
            yield
        finally:
            self._scheduler.release_unknown(lease)

    async def _lease_slot(self, slot_id: int) -> Lease:
        """Lease slot ``slot_id`` itself; its session is saved first if it must be."""
        await self.ensure_ready()
        lease = await self._scheduler.table.acquire(f"{SLOT_KEY}{slot_id}")
        await self._ready_slot(lease, None)
        return lease

    # 5. After the answer ----------------------------------------------------------------------------------
    def observe(self, lease: Lease, cache: str, expected: int, served_hashes: list[str], report: SlotReport
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

    def report(self, announced: str, expected: int, cached: int, *, count: bool = True) -> tuple[str, str | None]:
        """What the turn is reported as (``reported_cache``); ``count``: a prefix hit is counted."""
        reported, reason = reported_cache(announced, expected, cached)
        if count and reported == "hit-prefix":
            self._counters["prefix_hits"] += 1
        return reported, reason

    def finish(self, lease: Lease, sid: str | None, engine_may_be_busy: bool) -> None:
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

    # 6. The index -----------------------------------------------------------------------------------------
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

    def commit(self, record: SessionRecord, client_hashes: list[str], served: list[Message], body_bytes: int
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

    async def index_work(self, work: Callable[[SessionIndex], T], what: str) -> T | None:
        """``work(index)`` in a worker thread; None when the index failed (counted as ``what``)."""
        try:
            return await run(self._index, work, self._index)
        except StoreError as exc:
            self._store_failed(what, exc)
            return None


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
