"""``SessionManager``: the slot table, the session index and the snapshots, kept true against the engine behind the
proxy (``engine.Engine`` with ``Slots``: llama-server, or the in-process fake). It owns three collaborators: the
slot scheduler (``scheduler.SlotScheduler``: the table, hits, releases, idle saves), the snapshot store
(``snapshot_store.SnapshotStore``: every save and restore, within one write budget) and the session index.

1. ``ensure_ready``: the ``UpstreamWatch`` (``liveness.py``) reads the engine's identity and slot count once per
   engine incarnation; the scheduler sizes the ``SlotTable`` from it (or marks it empty).
2. ``prepare_slot``: save a displaced session (unless its snapshot is current), restore this session's
   snapshot when it is not resident (after any save of it that is still running: a session displaced a moment
   ago may come back while its slot is being saved); report ``hit``/``restored``/``miss`` and the tokens
   expected from cache. Every save first asks the engine's slot states (``Slots.states``) whether the slot is idle
   and still holds what the table learnt there (``UpstreamWatch.unsaveable``): a slot a restart emptied is never
   saved, and a save that cannot be verified, or that the engine answers with fewer tokens than
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
9. One write budget for every snapshot (``snapshot_store.WriteBudget``): on average at most ``--idle-save-mb-s`` MB written per
   second, each save counted by the size of the file it wrote, whatever made it (an idle save, a displaced
   session, ``--save-every-turn``, shutdown). An idle save waits until what was written before it is paid for; a
   session displaced from its slot while more than ``snapshot_store.EVICTION_BURST_S`` seconds of writes are unpaid is not
   saved (``evicted_saves_skipped``): its previous snapshot, if any, stays, and its next turn restores that and
   prefills the rest, so the request that displaced it never waits for the disk. Saves at every turn and at shutdown
   are counted, never held back. And a session whose content did not change since its last snapshot (the snapshot covers the same
   served messages, for the running model, and its file is there) is not written again, whatever the slot's
   ``snapshot_current`` says (``SnapshotStore._unchanged``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from pflash_proxy.config import Settings
from pflash_proxy.engine import Engine, EngineNotReady, EngineUnreachable, Slots
from pflash_proxy.sessions.cluster import ClusterNode
from pflash_proxy.sessions.identity import credential
from pflash_proxy.sessions.index import (SessionIndex, SessionRecord, SnapshotRecord, TraceLog, open_index)
from pflash_proxy.sessions.isolation import CacheIsolation
from pflash_proxy.sessions.liveness import UpstreamWatch
from pflash_proxy.sessions.slots import Lease, Slot, SlotReport, SlotTable
from pflash_proxy.sessions.scheduler import SlotScheduler
from pflash_proxy.sessions.snapshot_store import SnapshotStore
from pflash_proxy.sessions.snapshots import SnapshotManager

log = logging.getLogger("pflash_proxy.sessions")

T = TypeVar("T")

CACHE_SLACK = 0.9  # the chat template may re-render the last few tokens of a turn; allow 10 % below
PRUNE_EVERY_S = 3600.0


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
        # the engine's watch tells the scheduler when the engine was described anew or restarted (liveness.py)
        self.watch = UpstreamWatch(settings, engine, lambda n: self.scheduler.on_ready(n),
                                   lambda reason: self.scheduler.on_restart(reason))
        # every save and restore, within one write budget (snapshot_store.py)
        self.saves = SnapshotStore(self.settings, self.snapshots, self.store, self.watch, engine, self.store_failed)
        self.isolation = CacheIsolation(settings.sessions.cache_isolation, self.slots)  # --cache-isolation (isolation.py)
        # the slots: the table, hits, releases, idle saves (scheduler.py)
        self.scheduler = SlotScheduler(self.settings, self.limits, self.upstream_timeout_s, engine, self.watch,
                                       self.isolation)
        self._pruner: asyncio.Task[None] | None = None
        self._idle_saver: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()  # what ``_spawn`` started, of any result
        # the saves' and restores' counters are the snapshot store's (``SnapshotStore.counters``)
        # hits, lost slots, restarts and idle saves are the scheduler's (``SlotScheduler.counters``)
        self.counters = {"misses": 0, "cache_mismatches": 0, "sessions_pruned": 0, "store_failures": 0,
                         "prefix_hits": 0}
        self._store_down = False
        self._writes = 0
        self._bound: asyncio.Task[list[str]] | None = None

    @property
    def table(self) -> SlotTable:
        """The scheduler's slot table (a new one when the engine is described with another slot count)."""
        return self.scheduler.table

    @property
    def model_identity(self) -> str:
        return self.watch.model_identity

    @property
    def identity_info(self) -> dict[str, object]:
        return self.watch.identity_info

    async def ensure_ready(self, wait: bool = True) -> None:
        await self.watch.ensure_ready(wait)

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

    # Lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.snapshots.reconcile)
        if self.cluster is not None:
            await self.cluster.start()
        self._pruner = asyncio.create_task(self._prune_loop())
        if self.settings.idle_save_s > 0:
            self._idle_saver = asyncio.create_task(self.scheduler.idle_save_loop(self.saves))
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
        self.scheduler.stop()
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
            return (await self.saves.save_leased(lease)).record is not None
        finally:
            self.table.release(lease)

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
    async def prepare_slot(self, lease: Lease, served_hashes: list[str] | None) -> tuple[str, int]:
        lease.epoch = self.engine.epoch()  # before any call: a break from now on ends it
        lease.notices = self.watch.restarts  # a restart noticed meanwhile (the health monitor) is not noticed twice
        await self.saves.save_displaced(lease)
        if served_hashes is None:
            return "miss", 0
        hit = await self.scheduler.resident_hit(lease, served_hashes)
        if hit is not None:
            return "hit", hit
        if lease.resident:
            self.table.forget(lease.session)
        restored = await self.saves.restore(lease, served_hashes)
        if restored is not None:
            return "restored", restored
        self.counters["misses"] += 1
        return "miss", 0

    async def lease_slot(self, slot_id: int) -> Lease:
        """Lease slot ``slot_id`` itself (a client's slot action); its session is saved first if it must be."""
        from pflash_proxy.sessions.slots import SLOT_KEY

        await self.ensure_ready()
        lease = await self.table.acquire(f"{SLOT_KEY}{slot_id}")
        await self.prepare_slot(lease, None)
        return lease

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

    def save_in_background(self, sid: str) -> None:
        self._spawn(self._snapshot_now(sid))

    def stats(self) -> dict[str, object]:
        return {**self.counters, **self.scheduler.counters, **self.saves.stats(), **self.isolation.counters, "cache_isolation": self.isolation.mode,
                "cache_isolation_active": self.isolation.active, "store_available": not self._store_down, "slots": len(self.table.slots),
                "queued": self.table.queued, **{f"refused_{k}": v for k, v in self.table.refused.items()},
                "model_identity": self.model_identity,
                "table": self.table.describe(), **self.engine.stats(),
                **({"cluster": self.cluster.stats()} if self.cluster is not None else {})}


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
