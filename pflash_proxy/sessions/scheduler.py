"""``SlotScheduler``: the session service's slots: the table of what each of the engine's slots holds, kept true
across the engine's restarts, and what is scheduled on it (``service.py``'s module docstring gives the rules).

1. The table (``SlotTable``), sized when the engine is described (``on_ready``), emptied when it restarts
   (``on_restart``); the engine's watch (``UpstreamWatch``, made here: ``watch``) calls both. ``start``/``stop``:
   the watch and the idle saves.
2. ``resident_hit``: a leased slot that still holds a prefix of the request is a hit, vouched for by the engine or
   checked against its record of the slot (a resident session that is not a hit is forgotten by the table);
   ``prefetch_slots`` asks that record beside the lookup when a hit of the namespace (``note_seed``) is likely.
3. ``isolate``: the credential isolation of leased slots (``CacheIsolation``, ``--cache-isolation``).
4. Releases: ``release_when_idle`` (after the engine stopped working on the slot), ``release_unknown`` (a slot
   whose content the proxy no longer knows).
5. Idle saves (``idle_save_loop`` / ``idle_save_round``, ``--idle-save-s``), through the snapshot store it is
   handed (``SnapshotStore.save_leased``).

It is given only what it uses: the sessions' settings group (``--idle-save-s``, ``--cache-isolation``), the limits
group (the queue's bounds), the upstream group (the watch's, and how long ``release_when_idle`` waits), the slot
folder (the watch's setup warning names it) and the engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pflash_proxy.engine import Engine, Slots
from pflash_proxy.sessions.background import Background
from pflash_proxy.sessions.isolation import CacheIsolation
from pflash_proxy.sessions.liveness import UpstreamWatch
from pflash_proxy.sessions.stats import SchedulerStats, SlotRow
from pflash_proxy.sessions.slots import UNKNOWN_OWNER, Lease, Slot, SlotsPrefetch, SlotTable, is_prefix

if TYPE_CHECKING:
    from pflash_proxy.config import LimitOptions, SessionOptions, UpstreamOptions
    from pflash_proxy.sessions.snapshot_store import SnapshotStore

log = logging.getLogger("pflash_proxy.sessions")

# release_when_idle's slot-state interval: above llama-server's 1 s wait for a result, which any result restarts
IDLE_POLL_S = 1.5


class SlotScheduler:
    def __init__(self, settings: SessionOptions, limits: LimitOptions, upstream: UpstreamOptions,
                 slot_save_path: Path, engine: Engine):
        self.settings = settings  # --idle-save-s
        self.limits = limits  # the slot queue's bounds
        self.upstream_timeout_s = upstream.upstream_timeout_s  # how long release_when_idle waits for the slot
        self.engine = engine
        if engine.slots is None:
            raise ValueError("sessions need an engine whose slots can be addressed (Engine.slots)")
        self.slots: Slots = engine.slots
        self.table = self._new_table(1)
        # the engine's watch: it says when the engine was described anew or restarted (liveness.py)
        self.watch = UpstreamWatch(upstream, slot_save_path, engine, self.on_ready, self.on_restart)
        self._isolation = CacheIsolation(settings.cache_isolation, self.slots)  # --cache-isolation (isolation.py)
        self._idle_saver: asyncio.Task[None] | None = None
        # slot id -> (its grant count, when to try again) after an idle save of it wrote nothing: once per change,
        # unless what kept it from being written passes by itself (the engine busy on the slot)
        self._idle_tried: dict[int, tuple[int, float]] = {}
        self._slot_seeds: dict[int, tuple[str, str]] = {}  # slot id -> (session, its seed), as last leased
        self._background = Background()  # what it started and does not await
        self.counters = {"hits": 0, "hits_vouched": 0, "slots_lost": 0, "upstream_restarts": 0, "idle_saves": 0}

    def start(self, saves: SnapshotStore) -> None:
        """The idle saves through ``saves`` (with ``--idle-save-s``), then the engine's watch."""
        if self.settings.idle_save_s > 0:
            self._idle_saver = asyncio.create_task(self.idle_save_loop(saves))
        self.watch.start()

    def stop(self) -> None:
        """No more health probes nor idle saves (what runs in the background ends at ``close``)."""
        self.watch.stop()
        if self._idle_saver is not None:
            self._idle_saver.cancel()

    def close(self) -> None:
        self._background.cancel()

    def stamp(self, lease: Lease) -> None:
        """Mark the turn ``lease`` begins: the engine's epoch before any call (a break from now on ends it) and the
        restarts noticed so far (one noticed meanwhile, by the health monitor, is not noticed twice)."""
        lease.epoch = self.engine.epoch()
        lease.notices = self.watch.restarts

    async def isolate(self, leases: Sequence[Lease], owner: str | None, replaced: bool) -> bool:
        """``--cache-isolation`` on each leased slot (``CacheIsolation.prepare``); True: a slot could not be
        isolated from another credential, so the request is sent with the cache off."""
        cold = False
        for lease in leases:
            cold = await self._isolation.prepare(lease, owner, replaced=replaced) or cold
        return cold

    def stats(self) -> SchedulerStats:
        """The scheduler's counters, the isolation's, and the table's state."""
        table, iso = self.table, self._isolation
        return SchedulerStats(**self.counters, **iso.counters, cache_isolation=iso.mode,
                              cache_isolation_active=iso.active, slots=len(table.slots), queued=table.queued,
                              **{f"refused_{k}": v for k, v in table.refused.items()},
                              table=tuple(SlotRow(s.id, s.session[:8] if s.session else None, s.tokens, s.busy,
                                                  s.known, s.snapshot_current) for s in table.slots))

    def on_ready(self, n_slots: int) -> None:
        self._idle_tried.clear()
        if len(self.table.slots) != n_slots:
            self.table = self._new_table(n_slots)
        else:
            self.table.mark_all_empty()

    def on_restart(self, reason: str) -> None:
        self.counters["upstream_restarts"] += 1
        self._idle_tried.clear()
        self.table.mark_all_empty()

    def _new_table(self, n_slots: int) -> SlotTable:
        return SlotTable(n_slots, self.limits.max_queue, self.limits.queue_timeout_s)

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
        task = self._background.spawn(self.watch.states())
        return SlotsPrefetch(task, self.table, {s.id: s.grants for s in idle}, self.watch.restarts)

    async def resident_hit(self, lease: Lease, served_hashes: list[str]) -> int | None:
        """The tokens ``lease``'s slot already holds of ``served_hashes`` when it is a hit (the slot still holds a
        prefix of the request, vouched for by the engine or checked against its own record of the slot,
        ``UpstreamWatch.slot_lost``); None otherwise (a slot found lost is counted, and the restart noticed once;
        the table forgets a resident session that is not a hit)."""
        slot = lease.slot
        if lease.resident and slot.known and slot.served_hashes and is_prefix(slot.served_hashes, served_hashes):
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
                return slot.prompt_tokens
            self.counters["slots_lost"] += 1
            # not noticed since the content was put there (a turn that ran across a noticed restart may have
            # put the old process's there: that restart is not counted again, nor every slot emptied again)
            if self.watch.restarts == slot.notices:
                self.engine.note_restart(f"llama-server no longer holds slot {slot.id}'s prompt ({lost})")
        if lease.resident:
            self.table.forget(lease.session)
        return None

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
        self._background.spawn(self._release_when_idle(lease))

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

    async def idle_save_loop(self, saves: SnapshotStore) -> None:
        """Step 7: snapshot resident sessions idle for ``--idle-save-s`` whose snapshot is not current."""
        idle_s = self.settings.idle_save_s
        while True:
            await asyncio.sleep(min(1.0, idle_s / 2))
            try:
                await self.idle_save_round(idle_s, saves)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed round must not stop the next one
                log.exception("idle snapshot round failed")

    def _idle(self, slot: Slot, idle_s: float, now: float) -> bool:
        """``slot`` holds a session idle for ``idle_s`` whose content changed since its last snapshot, and no idle
        save of this content wrote nothing for a reason that does not pass by itself (``_idle_tried``)."""
        if not (slot.session and not slot.anonymous and slot.known and slot.tokens
                and not slot.busy and not slot.snapshot_current and now - slot.last_used >= idle_s):
            return False
        tried = self._idle_tried.get(slot.id)
        return tried is None or tried[0] != slot.grants or now >= tried[1]

    def idle_due(self, idle_s: float) -> list[Slot]:
        """Slots holding a session idle for ``idle_s`` whose content changed since its last snapshot (and since an
        idle save of it last wrote nothing), the longest idle first."""
        now = time.monotonic()
        return sorted((s for s in self.table.slots if self._idle(s, idle_s, now)), key=lambda s: s.last_used)

    async def idle_save_round(self, idle_s: float, saves: SnapshotStore) -> None:
        """One save at a time, each after what was written before it (by any save) is paid for at
        ``--idle-save-mb-s`` (``WriteBudget``), and of a slot still idle when it starts (it is leased without
        waiting, right after that check: a slot whose next turn began while the saves before it ran is left for a
        later round)."""
        if not self.watch.ready:
            return
        for slot in self.idle_due(idle_s):
            owed = saves.write_budget.owed_s()
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
                saved = await saves.save_leased(lease)
            finally:
                self.table.release(lease)
            if saved.record is None:  # once per change, unless what stopped it passes (then after another idle_s)
                self._idle_tried[slot.id] = (slot.grants, time.monotonic() + idle_s if saved.passing else math.inf)
                continue
            self._idle_tried.pop(slot.id, None)
            self.counters["idle_saves"] += 1
