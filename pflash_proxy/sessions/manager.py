"""``SessionManager``: the slot table, the session index and the snapshots, kept true against the engine behind the
proxy (``engine.Engine`` with ``Slots``: llama-server, or the in-process fake).

1. ``ensure_ready``: the ``UpstreamWatch`` (``liveness.py``) reads the engine's identity and slot count once per
   engine incarnation; the manager sizes the ``SlotTable`` from it (or marks it empty).
2. ``prepare_slot``: save a displaced session (unless its snapshot is current), restore this session's
   snapshot when it is not resident (after any save of it that is still running: a session displaced a moment
   ago may come back while its slot is being saved); report ``hit``/``restored``/``miss`` and the tokens
   expected from cache. Every save (``_save``) first asks the engine's slot states (``Slots.states``) whether the
   slot is idle and still holds what the table learnt there (``UpstreamWatch.unsaveable``): a slot a restart
   emptied is never saved, and a save that cannot be verified, or that the engine answers with fewer tokens than
   expected, leaves the session's previous snapshot as it was.
3. ``observe``: after each response, compare the tokens its cache report (``Engine.cache_report``) says came
   from the cache with the expectation; a shortfall marks the slot unknown, logs it, and counts in
   ``cache_mismatches``.  Then record what the slot now holds; the caller reports the engine's number, not the
   expectation, to the client.
4. Restarts (``liveness.py``) empty the table; before a ``hit`` is announced either the engine vouches that it
   is the process that answered when the slot's content was last learnt (``Engine.vouches(Slot.epoch)``; no
   slot-state call at all), or the watch checks the engine's own record of that slot (``slot_lost``), else the
   table is emptied and the session's snapshot restored. When a hit is likely and not vouched for, those states
   are asked before the lease, beside the session lookup (``prefetch_slots``), and used only if no other lease
   of the slot came between. A restart is noticed once: a check (before a hit, before a save) that finds a slot's
   content gone counts one only if none was noticed since the request that put that content there was prepared
   (``Slot.notices``; a turn that ran across a noticed restart may have left the old process's content).
5. ``stop`` (SIGTERM/SIGINT): snapshot every resident session, bounded by ``shutdown_save_timeout_s`` (none at all
   when the engine is gone, ``Engine.reachable``: nothing could be saved); with a
   shared index (``cluster.py``) the node then removes its heartbeat, so other nodes take its sessions over.
6. ``prune`` at start-up, every hour and every 64 history writes: sessions unused for ``--session-ttl-days``,
   beyond ``--max-sessions`` or beyond ``--max-index-mb`` of index on disk (oldest first) are forgotten with
   their snapshots (never one that holds a slot or is in flight).
7. Idle saves (``--idle-save-s``, 0 = off): a resident session idle that long whose snapshot is not current is
   snapshotted once per change, one save at a time and within the write budget (step 9), never while its slot is
   busy: each save leases the slot
   without waiting, right after checking it is still idle (a slot whose next turn began meanwhile is left for a
   later round, never saved the moment that turn ends), and the engine's state of the slot must show it idle.
   A save that wrote nothing is not tried again until the slot's next turn, unless what stopped it passes by
   itself (the engine busy on the slot, or not answering): then after another ``--idle-save-s``. So a crash of
   the engine costs a session at most the turn in flight, and the restart path restores the rest.
8. Index calls: where they run is decided by the index's declared ``remote`` (``index.run``): a local index's
   snapshot records are in memory and its files local, so they are read on the loop; a remote one is asked in a
   worker thread.
9. One write budget for every snapshot (``WriteBudget``): on average at most ``--idle-save-mb-s`` MB written per
   second, each save counted by the size of the file it wrote, whatever made it (an idle save, a displaced
   session, ``--save-every-turn``, shutdown). An idle save waits until what was written before it is paid for; a
   session displaced from its slot while more than ``EVICTION_BURST_S`` seconds of writes are unpaid is not
   saved (``evicted_saves_skipped``): its previous snapshot, if any, stays, and its next turn restores that and
   prefills the rest, so the request that displaced it never waits for the disk. Saves at every turn and at shutdown
   are counted, never held back. And a session whose content did not change since its last snapshot (the snapshot covers the same
   served messages, for the running model, and its file is there) is not written again, whatever the slot's
   ``snapshot_current`` says (``_unchanged``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pflash_proxy.config import Settings
from pflash_proxy.engine import Engine, EngineError, EngineNotReady, EngineUnreachable, Slots
from pflash_proxy.sessions.cluster import ClusterNode
from pflash_proxy.sessions.identity import credential
from pflash_proxy.sessions.index import (SessionIndex, SessionRecord, SnapshotRecord, StoreError, TraceLog, open_index,
                                        run)
from pflash_proxy.sessions.isolation import CacheIsolation
from pflash_proxy.sessions.liveness import GONE, PASSING, UpstreamWatch
from pflash_proxy.sessions.slots import UNKNOWN_OWNER, Lease, Slot, SlotReport, SlotsPrefetch, SlotTable
from pflash_proxy.sessions.snapshots import SnapshotManager, SnapshotRejected

log = logging.getLogger("pflash_proxy.sessions")

T = TypeVar("T")

CACHE_SLACK = 0.9  # the chat template may re-render the last few tokens of a turn; allow 10 % below
PRUNE_EVERY_S = 3600.0
# release_when_idle's slot-state interval: above llama-server's 1 s wait for a result, which any result restarts
IDLE_POLL_S = 1.5
SNAPSHOT_TOTALS_S = 5.0  # a shared index's snapshot totals in the stats are at most this old (plus one listing)
# a displaced session is saved only while the writes not yet paid for at --idle-save-mb-s are worth at most this
EVICTION_BURST_S = 2.0
SKIP_LOG_EVERY_S = 60.0  # a skipped eviction save is logged at most this often (counted every time)


class WriteBudget:
    """The snapshot writes' I/O budget (module docstring, step 9): bytes written, paid for at ``rate()`` bytes per
    second (read at each call: the setting may change). ``owed_s`` says how long until everything written so far is
    paid for."""

    def __init__(self, rate: Callable[[], float]):
        self.rate = rate
        self._owed = 0.0  # bytes not yet paid for
        self._at = time.monotonic()
        self.written = 0  # bytes counted so far (the stats')

    def owed_s(self) -> float:
        now = time.monotonic()
        rate = max(self.rate(), 1.0)
        self._owed = max(0.0, self._owed - (now - self._at) * rate)
        self._at = now
        return self._owed / rate

    def spend(self, n: int) -> None:
        self.owed_s()
        self._owed += n
        self.written += n


class SessionManager:
    def __init__(self, settings: Settings, engine: Engine, index: SessionIndex | None = None):
        self.settings = settings.sessions  # its own group; of the others, what the two lines below read
        self.limits = settings.limits  # the slot queue's bounds
        self.upstream_timeout_s = settings.upstream.upstream_timeout_s
        self.engine = engine
        if engine.slots is None:
            raise ValueError("sessions need an engine whose slots can be addressed (Engine.slots)")
        self.slots: Slots = engine.slots
        self.store: SessionIndex = index if index is not None else open_index(settings.proxy.home,
                                                                              settings.cluster.index)
        # several nodes sharing the index (--index redis://): holders, turn leases, heartbeats (cluster.py)
        shared = self.store.as_cluster()
        self.cluster = ClusterNode(settings, shared) if shared is not None else None
        self.snapshots = SnapshotManager(self.store, self.slots, settings.effective_slot_save_path,
                                         int(settings.sessions.max_cache_gb * 1024**3),
                                         temp_tag=self.cluster.tag if self.cluster is not None else "")
        self.table = self._new_table(1)
        self.watch = UpstreamWatch(settings, engine, self._on_ready, self._on_restart)
        self.isolation = CacheIsolation(settings.sessions.cache_isolation, self.slots)  # --cache-isolation (isolation.py)
        self._pruner: asyncio.Task[None] | None = None
        self._idle_saver: asyncio.Task[None] | None = None
        # slot id -> (its grant count, when to try again) after an idle save of it wrote nothing: once per change,
        # unless what kept it from being written passes by itself (the engine busy on the slot)
        self._idle_tried: dict[int, tuple[int, float]] = {}
        self._background: set[asyncio.Task[Any]] = set()  # what ``_spawn`` started, of any result
        self.write_budget = WriteBudget(lambda: self.settings.idle_save_mb_s * 1e6)  # every save (step 9)
        self._skip_logged = -SKIP_LOG_EVERY_S
        self.counters = {"hits": 0, "restored": 0, "misses": 0, "cache_mismatches": 0, "upstream_restarts": 0,
                         "evicted_saves": 0, "evicted_saves_skipped": 0, "saves_unchanged": 0, "save_failures": 0,
                         "sessions_pruned": 0, "store_failures": 0,
                         "slots_lost": 0, "hits_vouched": 0, "saves_refused": 0, "idle_saves": 0,
                         "prefix_hits": 0, "restores_empty": 0}
        self._store_down = False
        self._writes = 0
        self._bound: asyncio.Task[list[str]] | None = None
        self._slot_seeds: dict[int, tuple[str, str]] = {}  # slot id -> (session, its seed), as last leased
        # a shared index's snapshot count and bytes, as last listed in a worker thread (``_snapshot_totals``)
        self._totals: tuple[int, int] = (0, 0)
        self._totals_at = -SNAPSHOT_TOTALS_S
        self._totals_task: asyncio.Future[list[SnapshotRecord]] | None = None

    @property
    def model_identity(self) -> str:
        return self.watch.model_identity

    @property
    def identity_info(self) -> dict[str, object]:
        return self.watch.identity_info

    async def ensure_ready(self, wait: bool = True) -> None:
        await self.watch.ensure_ready(wait)

    def _on_ready(self, n_slots: int) -> None:
        self._idle_tried.clear()
        if len(self.table.slots) != n_slots:
            self.table = self._new_table(n_slots)
        else:
            self.table.mark_all_empty()

    def _on_restart(self, reason: str) -> None:
        self.counters["upstream_restarts"] += 1
        self._idle_tried.clear()
        self.table.mark_all_empty()

    def view(self) -> ManagerView:
        """The read-only view of the sessions and slots (the inspector's)."""
        return ManagerView(self)

    def owner(self, headers: Mapping[str, str]) -> str | None:
        """The hash of a request's credential (``identity.credential``): whose sessions and responses it reaches."""
        return credential(headers, self.store.salt)

    def store_failed(self, what: str, exc: Exception) -> None:
        """Count an index failure; log it once until the index works again (``store_ok``)."""
        self.counters["store_failures"] += 1
        if not self._store_down:
            self._store_down = True
            log.error("session index unavailable while %s (%s); requests are served without saving until it "
                      "recovers", what, exc)

    def note_write(self) -> None:
        """Every 64 history writes, check the index's byte bound in the background (``prune``)."""
        self._writes += 1
        if self._writes % 64 == 0 and (self._bound is None or self._bound.done()):
            self._bound = self._spawn(self.prune())

    def _spawn(self, work: Coroutine[object, object, T]) -> asyncio.Task[T]:
        """Run ``work`` in the background, kept until it ends (``stop`` cancels what is left)."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def store_ok(self) -> None:
        if self._store_down:
            self._store_down = False
            log.warning("session index writable again; sessions are saved as before")

    def _new_table(self, n_slots: int) -> SlotTable:
        return SlotTable(n_slots, self.limits.max_queue, self.limits.queue_timeout_s)

    # Lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.snapshots.reconcile)
        if self.cluster is not None:
            await self.cluster.start()
        self._pruner = asyncio.create_task(self._prune_loop())
        if self.settings.idle_save_s > 0:
            self._idle_saver = asyncio.create_task(self._idle_save_loop())
        self.watch.start()
        try:
            await self.ensure_ready(wait=False)  # down: say so now, never wait for it at start-up
        except (EngineUnreachable, EngineNotReady) as exc:
            log.warning("upstream not reachable at start-up (%s); will retry on the first request", exc)

    async def stop(self) -> None:
        self.watch.stop()
        for task in (self._pruner, self._idle_saver):
            if task is not None:
                task.cancel()
        resident = [s for s in self.table.slots if s.session and not s.session.startswith("anon-")
                    and not s.snapshot_current and s.tokens]
        if resident and self.watch.ready and not await self.engine.reachable(timeout_s=10):
            # a dead engine saves nothing: do not wait for it; the sessions keep their last snapshots (a slow
            # answer, a loaded machine, counts as alive: a shutdown never skips saves that could still be made)
            log.warning("llama-server does not answer: %d resident sessions not saved at shutdown (their last "
                        "snapshots, if any, stay)", len(resident))
        else:
            try:
                await asyncio.wait_for(self.save_all_resident(), self.settings.shutdown_save_timeout_s)
            except asyncio.TimeoutError:
                log.error("shutdown snapshot save timed out after %.0fs", self.settings.shutdown_save_timeout_s)
        if self.cluster is not None:  # saved: other nodes may take this node's sessions over at once
            await self.cluster.stop()
        for task in list(self._background):
            task.cancel()
        self.store.close()

    async def save_all_resident(self) -> int:
        """Snapshot every resident session whose snapshot is not current; returns how many were written."""
        if not self.watch.ready:
            return 0
        sessions = [s.session for s in self.table.slots if s.session and not s.session.startswith("anon-")]
        return sum([await self._snapshot_now(sid) for sid in sessions])

    async def _snapshot_now(self, sid: str) -> bool:
        """Save ``sid``'s slot now (waiting for its running request, if any); True when a snapshot was written
        (the snapshot is then current).

        Only a resident session is leased, and only while it stays resident: a session that lost its slot while
        waiting has nothing to save, and a save never displaces another session (``resident_only``).
        """
        if self.table.resident(sid) is None:
            return False
        lease = await self.table.acquire(sid, resident_only=True)
        if lease is None:
            return False
        try:
            return (await self._snapshot_leased(lease)).record is not None
        finally:
            self.table.release(lease)

    async def _snapshot_leased(self, lease: Lease) -> Saved:
        """Save the session that ``lease``'s slot holds, unless the slot holds nothing or its snapshot is current."""
        slot, sid = lease.slot, lease.session
        if not slot.tokens or (slot.snapshot_current and self.snapshots.on_disk(sid)):
            return Saved(None)
        saved = await self._save(slot.id, sid, slot.tokens, slot.served_hashes,
                                 (slot.task_seen, slot.prompt_tokens, slot.epoch, slot.notices))
        slot.snapshot_current = saved.record is not None
        return saved

    # Pruning -----------------------------------------------------------------------------------------------
    async def prune(self) -> list[str]:
        """Forget stale and surplus sessions and their snapshots (store work in the executor)."""
        ttl = self.settings.session_ttl_days
        older_than = time.time() - ttl * 86400 if ttl > 0 else None
        keep = self.table.in_use()

        limit = int(self.settings.max_index_mb * 2**20)

        def work() -> list[str]:
            gone = self.store.prune(older_than=older_than, max_sessions=self.settings.max_sessions, keep=keep)
            while self.store.volume() > limit:  # the byte bound: drop a tenth of the sessions, oldest first
                n = self.store.count_sessions()
                more = self.store.prune(older_than=None, max_sessions=max(0, n - max(1, n // 10)), keep=keep)
                if not more:
                    break
                gone += more
            for sid in gone:
                self.snapshots.delete(sid)
            return gone

        gone = await asyncio.get_running_loop().run_in_executor(None, work)
        if gone:
            self.counters["sessions_pruned"] += len(gone)
            log.info("pruned %d sessions (unused for %s days, beyond %d sessions or %g MB of index)", len(gone),
                     ttl or "∞", self.settings.max_sessions, self.settings.max_index_mb)
        return gone

    async def _prune_loop(self) -> None:
        while True:
            try:
                await self.prune()
            except Exception:  # noqa: BLE001 - a failed sweep must not stop the next one
                log.exception("session pruning failed")
            await asyncio.sleep(PRUNE_EVERY_S)

    # Per request -------------------------------------------------------------------------------------------
    def note_seed(self, lease: Lease, seed: str) -> None:
        """Remember the namespace of the session that ``lease`` holds (``prefetch_slots`` predicts hits by it)."""
        self._slot_seeds[lease.slot.id] = (lease.session, seed)

    def prefetch_slots(self, seed: str) -> SlotsPrefetch | None:
        """Ask the slots' states (``Slots.states``) now, while the session is looked up and leased, when a hit is likely: an idle slot
        holds a known prefix of a session of this very namespace (``seed``). ``slot_lost`` uses the answer only
        for a slot that nobody else leased since it was asked (``SlotsPrefetch.covers``); otherwise, or when it
        failed, it asks again."""
        if self.watch.slots_route is False or not self.watch.ready:
            return None
        idle = [s for s in self.table.slots if not s.busy]
        likely = [s for s in idle if s.known and s.served_hashes and s.session is not None
                  and self._slot_seeds.get(s.id) == (s.session, seed)]
        if not likely or all(self.engine.vouches(s.epoch) for s in likely):
            return None  # no hit likely, or the engine vouches for every likely one: no check will be asked
        task = self._spawn(self.watch.states())
        return SlotsPrefetch(task, self.table, {s.id: s.grants for s in idle}, self.watch.restarts)

    async def _snapshot_read(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``, a read of the snapshot index and directory: at once with a local index (its snapshot
        records are in memory, the files local); in a worker thread with a remote one (it answers over the
        network, and a directory nodes share may be a remote mount)."""
        return await run(self.store, fn, *args, small=True)

    async def prepare_slot(self, lease: Lease, served_hashes: list[str] | None) -> tuple[str, int]:
        lease.epoch = self.engine.epoch()  # before any call: a break from now on ends it
        lease.notices = self.watch.restarts  # a restart noticed meanwhile (the health monitor) is not noticed twice
        ev = lease.evicted
        if ev is not None and not ev.session.startswith("anon-") and ev.known and ev.tokens \
                and not (ev.snapshot_current and await self._snapshot_read(self.snapshots.on_disk, ev.session)):
            owed = self.write_budget.owed_s()
            if owed > EVICTION_BURST_S:  # over the write budget: the displaced session keeps its last snapshot
                self.counters["evicted_saves_skipped"] += 1
                if time.monotonic() - self._skip_logged >= SKIP_LOG_EVERY_S:
                    self._skip_logged = time.monotonic()
                    log.info("snapshot writes are %.1f s over --idle-save-mb-s: session %s, displaced from slot %d, "
                             "is not saved (its last snapshot stays; %d skipped so far)", owed, ev.session[:8],
                             lease.slot.id, self.counters["evicted_saves_skipped"])
            else:
                self.counters["evicted_saves"] += 1
                await self._save(lease.slot.id, ev.session, ev.tokens, ev.served_hashes,
                                 (ev.task_seen, ev.prompt_tokens, ev.epoch, ev.notices))
        if served_hashes is None:
            return "miss", 0
        slot = lease.slot
        if lease.resident and slot.known and slot.served_hashes and _is_prefix(slot.served_hashes, served_hashes):
            vouched = self.engine.vouches(slot.epoch)  # the same server process since it was learnt
            lost = None
            if not vouched:
                prefetched = lease.prefetched
                covered = prefetched.task if prefetched is not None and prefetched.covers(
                    slot, self.table, self.watch.restarts) else None
                lost = await self.watch.slot_lost(slot, covered)
            if lost is None:
                self.counters["hits"] += 1
                self.counters["hits_vouched"] += int(vouched)
                slot.epoch = lease.epoch
                return "hit", slot.prompt_tokens
            self.counters["slots_lost"] += 1
            # not noticed since the content was put there (a turn that ran across a noticed restart may have
            # put the old process's there: that restart is not counted again, nor every slot emptied again)
            if self.watch.restarts == slot.notices:
                self.engine.note_restart(f"llama-server no longer holds slot {slot.id}'s prompt ({lost})")
        if lease.resident:
            self.table.forget(lease.session)
        async with self.snapshots.lock(lease.session):  # after a save of this session still running (evicted)
            try:
                snap = await self._snapshot_read(self.snapshots.restorable, lease.session, self.model_identity)
            except StoreError as exc:
                self.store_failed("reading the snapshot index", exc)
                snap = None
            if snap is not None and _is_prefix(snap.served_hashes, served_hashes):
                try:
                    ok = await self.snapshots.restore(slot.id, snap)
                except EngineUnreachable as exc:
                    log.warning("restore failed: %s", exc)
                    ok = False
                if not ok:
                    lease.reason = "its snapshot could not be restored"
                if ok:
                    self.counters["restored"] += 1
                    slot.tokens, slot.prompt_tokens, slot.served_hashes = snap.tokens, snap.tokens, snap.served_hashes
                    slot.snapshot_current, slot.known, slot.epoch = True, True, lease.epoch
                    slot.notices = lease.notices
                    return "restored", snap.tokens
        self.counters["misses"] += 1
        return "miss", 0

    async def lease_slot(self, slot_id: int) -> Lease:
        """Lease slot ``slot_id`` itself (a client's slot action); its session is saved first if it must be."""
        from pflash_proxy.sessions.slots import SLOT_KEY

        await self.ensure_ready()
        lease = await self.table.acquire(f"{SLOT_KEY}{slot_id}")
        await self.prepare_slot(lease, None)
        return lease

    def release_when_idle(self, lease: Lease) -> None:
        """Release ``lease`` once the engine has stopped working on its slot (``Slots.states``).

        A request that ended before its response did (the client left, the stream broke) may leave llama-server
        busy on the slot: the proxy has closed its upstream connection (the handler is cancelled with the client),
        and llama-server cancels a streamed task at its next write, a non-streamed one when its HTTP thread, which
        waits for the task's result, times out after ``HTTP_POLLING_SECONDS`` (1 s) without any result arriving
        and finds the connection closed. Every result of ANY task (llama-server's slot listing included) wakes
        those waits and restarts the second, so the states are asked every ``IDLE_POLL_S`` (more than that
        second): polling faster kept the slot generating to its context limit. Until the engine shows the slot
        idle it stays leased, so nothing is sent to a busy slot. What the slot holds now was never confirmed by a
        response, so the table stops claiming it (``UpstreamWatch.slot_lost`` would otherwise take the longer prompt for a
        restarted server and empty every slot).
        """
        lease.slot.known = False
        self._spawn(self._release_when_idle(lease))

    async def _release_when_idle(self, lease: Lease) -> None:
        deadline = time.monotonic() + self.upstream_timeout_s
        try:
            while time.monotonic() < deadline:
                ok, states = await self.watch.states()
                if not ok:
                    return  # not reachable: nothing runs there now (restart detection does the rest)
                info = next((s for s in states or () if s.id == lease.slot.id), None)
                if info is None or not info.busy:
                    return
                await asyncio.sleep(IDLE_POLL_S)
        finally:
            self.table.release(lease)

    def release_unknown(self, lease: Lease) -> None:
        """Release a lease after which the slot's content is not known to the proxy (a client's slot action)."""
        lease.slot.known = False
        lease.slot.tokens = lease.slot.prompt_tokens = 0
        lease.slot.served_hashes = []
        lease.slot.owner = UNKNOWN_OWNER
        self.table.release(lease)

    async def _save(self, slot_id: int, sid: str, tokens: int, served_hashes: list[str],
                    learnt: tuple[int, int | None, int | None, int]) -> Saved:
        """Snapshot slot ``slot_id`` as session ``sid``, once the engine's slot states show it idle and still
        holding what the table learnt (``learnt``: the slot's ``task_seen``, ``prompt_tokens``, ``epoch`` and
        ``notices``: ``UpstreamWatch.unsaveable``); otherwise, and when the server saved fewer tokens than expected,
        nothing is written and the session's previous snapshot stays."""
        task_seen, _, epoch, notices = learnt
        unchanged = await self._unchanged(sid, served_hashes)
        if unchanged is not None:
            self.counters["saves_unchanged"] += 1
            return Saved(unchanged)
        # after a turn, the slot's state counts what its cache holds: the prompt and the generated tokens (less one)
        why = await self.watch.unsaveable(slot_id, task_seen, tokens, epoch)
        if why is not None:
            self.counters["saves_refused"] += 1
            log.warning("not saving session %s from slot %d: %s; its previous snapshot, if any, stays", sid[:8],
                        slot_id, why)
            # the server restarted, and nobody noticed it since the request that put the content there was
            # prepared (a turn that ran across a noticed restart may have left the old process's content there)
            if why.startswith(GONE) and self.watch.restarts == notices:
                self.engine.note_restart(f"llama-server no longer holds slot {slot_id}'s session ({why})")
            return Saved(None, passing=why.startswith(PASSING))
        try:
            record = await self.snapshots.save(slot_id, sid, tokens, served_hashes, self.model_identity)
            self.write_budget.spend(record.size)
            return Saved(record)
        except SnapshotRejected as exc:
            self.counters["saves_refused"] += 1
            log.warning("%s; the file is not kept, the previous snapshot, if any, stays", exc)
            return Saved(None)
        except (EngineError, OSError, StoreError) as exc:
            self.counters["save_failures"] += 1
            log.warning("could not save session %s from slot %d: %s", sid[:8], slot_id, exc)
            return Saved(None, passing=isinstance(exc, (EngineUnreachable, EngineNotReady)))

    async def _unchanged(self, sid: str, served_hashes: list[str]) -> SnapshotRecord | None:
        """``sid``'s snapshot when it already holds what a save would write: the same served messages, of the
        running model, its file in the folder (module docstring, step 9); None when a save must write."""
        try:
            rec = await self._snapshot_read(self.snapshots.store.snapshot, sid)
        except StoreError:
            return None
        if rec is None or rec.served_hashes != served_hashes or rec.model_identity != self.model_identity:
            return None
        return rec if await self._snapshot_read(self.snapshots.on_disk, sid) else None

    def observe(self, lease: Lease, cache: str, expected: int, served_hashes: list[str], report: SlotReport
                ) -> int | None:
        """Learn what the slot holds from the answer's ``report``; returns the tokens the engine took from its cache
        (None when not told)."""
        slot = lease.slot
        if report.rejected:
            return None  # the server rejected the request; the slot keeps what it had
        if report.cached_tokens is None:
            slot.known = False  # cannot verify (client gone, stream cut): treat content as unknown
            return None
        cached = report.cached_tokens
        if expected and cached < expected * CACHE_SLACK - 8:
            self.counters["cache_mismatches"] += 1
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

    async def _idle_save_loop(self) -> None:
        """Step 7: snapshot resident sessions idle for ``--idle-save-s`` whose snapshot is not current."""
        idle_s = self.settings.idle_save_s
        while True:
            await asyncio.sleep(min(1.0, idle_s / 2))
            try:
                await self._idle_save_round(idle_s)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed round must not stop the next one
                log.exception("idle snapshot round failed")

    def _idle(self, slot: Slot, idle_s: float, now: float) -> bool:
        """``slot`` holds a session idle for ``idle_s`` whose content changed since its last snapshot, and no idle
        save of this content wrote nothing for a reason that does not pass by itself (``_idle_tried``)."""
        if not (slot.session and not slot.session.startswith("anon-") and slot.known and slot.tokens
                and not slot.busy and not slot.snapshot_current and now - slot.last_used >= idle_s):
            return False
        tried = self._idle_tried.get(slot.id)
        return tried is None or tried[0] != slot.grants or now >= tried[1]

    def idle_due(self, idle_s: float) -> list[Slot]:
        """Slots holding a session idle for ``idle_s`` whose content changed since its last snapshot (and since an
        idle save of it last wrote nothing), the longest idle first."""
        now = time.monotonic()
        return sorted((s for s in self.table.slots if self._idle(s, idle_s, now)), key=lambda s: s.last_used)

    async def _idle_save_round(self, idle_s: float) -> None:
        """One save at a time, each after what was written before it (by any save) is paid for at
        ``--idle-save-mb-s`` (``WriteBudget``), and of a slot still idle when it starts (it is leased without
        waiting, right after that check: a slot whose next turn began while the saves before it ran is left for a
        later round)."""
        if not self.watch.ready:
            return
        for slot in self.idle_due(idle_s):
            owed = self.write_budget.owed_s()
            if owed > 0:  # the I/O budget: what was written before (by any save) is paid for first
                await asyncio.sleep(owed)
            if self.engine.epoch() is None and not await self.engine.healthy(timeout_s=2):
                return  # the engine is down: nothing can be saved (the restart path restores what was)
            if not self.watch.ready or not self._idle(slot, idle_s, time.monotonic()) or slot.session is None:
                continue  # leased, saved or emptied (a restart) since the round began
            lease = self.table.lease_now(slot.session)
            if lease is None:
                continue
            if lease.slot is not slot:  # another table's slot (the engine was described anew): not this one
                self.table.release(lease)
                continue
            try:
                saved = await self._snapshot_leased(lease)
            finally:
                self.table.release(lease)
            if saved.record is None:  # once per change, unless what stopped it passes (then after another idle_s)
                self._idle_tried[slot.id] = (slot.grants, time.monotonic() + idle_s if saved.passing else math.inf)
                continue
            self._idle_tried.pop(slot.id, None)
            self.counters["idle_saves"] += 1

    def save_in_background(self, sid: str) -> None:
        self._spawn(self._snapshot_now(sid))

    def _snapshot_totals(self) -> tuple[int, int]:
        """(snapshots, bytes) in the index. A local index keeps its snapshot records in memory; a remote one
        lists them over the network (every node's), so that listing runs in a worker thread at most every
        SNAPSHOT_TOTALS_S and the stats show the last one (a scrape never stalls the loop)."""
        if not self.store.remote:
            try:
                snaps = self.store.snapshots()
            except StoreError as exc:
                self.store_failed("listing snapshots", exc)
                snaps = []
            return len(snaps), sum(s.size for s in snaps)
        stale = time.monotonic() - self._totals_at >= SNAPSHOT_TOTALS_S
        if stale and self._totals_task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return self._totals
            self._totals_task = loop.run_in_executor(None, self.store.snapshots)
            self._totals_task.add_done_callback(self._totals_listed)
        return self._totals

    def _totals_listed(self, fut: asyncio.Future[list[SnapshotRecord]]) -> None:
        self._totals_task = None
        self._totals_at = time.monotonic()
        exc = fut.exception() if not fut.cancelled() else None
        if isinstance(exc, StoreError):
            self.store_failed("listing snapshots", exc)
        elif exc is None and not fut.cancelled():
            snaps = fut.result()
            self._totals = (len(snaps), sum(s.size for s in snaps))

    def stats(self) -> dict[str, object]:
        n_snaps, snap_bytes = self._snapshot_totals()
        return {**self.counters, **self.isolation.counters, "cache_isolation": self.isolation.mode,
                "cache_isolation_active": self.isolation.active, "store_available": not self._store_down, "slots": len(self.table.slots),
                "queued": self.table.queued, **{f"refused_{k}": v for k, v in self.table.refused.items()},
                "snapshots": n_snaps, "snapshot_bytes": snap_bytes,
                "snapshot_bytes_written": self.write_budget.written,
                "model_identity": self.model_identity, **{f"snap_{k}": v for k, v in self.snapshots.stats.items()},
                "table": self.table.describe(), **self.engine.stats(),
                **({"cluster": self.cluster.stats()} if self.cluster is not None else {})}


@dataclass
class Saved:
    """What a save did (``SessionManager._save``): the snapshot written (None: nothing was), and whether what kept
    it from being written passes by itself (the engine busy on the slot, or not answering now)."""

    record: SnapshotRecord | None
    passing: bool = False


PREFIX_HIT_MIN = 32  # a "miss" that reused at least this many tokens reused someone's prefix (``hit-prefix``)


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


def _is_prefix(prefix: list[str], full: list[str]) -> bool:
    return len(prefix) <= len(full) and full[: len(prefix)] == prefix


class ManagerView:
    """``contract.SessionsView`` of a ``SessionManager``: copies and index reads, nothing that changes it."""

    def __init__(self, manager: SessionManager):
        self._m = manager

    @property
    def model_identity(self) -> str:
        return self._m.model_identity

    @property
    def identity_info(self) -> dict[str, object]:
        return dict(self._m.identity_info)

    @property
    def queued(self) -> int:
        return self._m.table.queued

    def slots(self) -> list[Slot]:
        return [replace(s, served_hashes=list(s.served_hashes)) for s in self._m.table.slots]

    def resident_slot(self, sid: str) -> int | None:
        slot = self._m.table.resident(sid)
        return slot.id if slot is not None else None

    def last_uses(self) -> dict[str, float]:
        return self._m.store.last_uses()

    def session(self, sid: str) -> SessionRecord | None:
        return self._m.store.get(sid)

    def trace_log(self, sid: str) -> TraceLog | None:
        return self._m.store.trace_log(sid)

    def snapshot(self, sid: str) -> SnapshotRecord | None:
        return self._m.store.snapshot(sid)

    def holder(self, sid: str) -> str | None:
        cluster = self._m.cluster
        return cluster.index.holder(sid) if cluster is not None else None
