"""``SnapshotStore``: the session service's snapshot half: every save of a slot and every restore into one, kept true
against the engine and within one write budget (``service.py``'s module docstring gives the rules).

1. ``save`` (a slot as a session): not at all when the session's snapshot already holds what a save would write
   (``_unchanged``); otherwise once the engine's slot states show the slot idle and still holding what the table
   learnt there (``UpstreamWatch.unsaveable``: a slot a restart emptied is never saved); a save the engine answers
   with fewer tokens than expected leaves the previous snapshot as it was. ``save_leased``: the session a lease's
   slot holds, unless its snapshot is current.
2. ``save_displaced``: the session a new lease displaced from its slot, unless more than ``EVICTION_BURST_S``
   seconds of writes are unpaid at ``--idle-save-mb-s`` (then it keeps its previous snapshot, counted in
   ``evicted_saves_skipped``).
3. ``restore``: a session's snapshot into its leased slot, after any save of that session still running, when the
   snapshot is of the running model and a prefix of the request's history.
4. ``totals``: the snapshot count and bytes for the stats (a remote index is listed in a worker thread at most every
   ``SNAPSHOT_TOTALS_S``).

5. ``start`` (the snapshot folder reconciled with the index), ``delete`` (a pruned session's snapshots),
   ``on_timing`` (the metrics' callback after each save and restore).

It is given only what it uses: the sessions' settings group (``--idle-save-mb-s``, ``--max-cache-gb``), the slot
folder, the index, the engine's watch (``UpstreamWatch``) and the engine; it makes the snapshot files and records
(``SnapshotManager``). The slot table is the scheduler's and reaches it only through the lease it is handed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pflash_proxy.engine import Engine, EngineError, EngineNotReady, EngineUnreachable
from pflash_proxy.sessions.index import SessionIndex, SnapshotRecord, StoreError, run
from pflash_proxy.sessions.liveness import GONE, PASSING, UpstreamWatch
from pflash_proxy.sessions.slots import ANONYMOUS_KEY, Lease, is_prefix
from pflash_proxy.sessions.stats import SnapshotStats
from pflash_proxy.sessions.snapshots import SnapshotManager, SnapshotRejected

if TYPE_CHECKING:
    from pflash_proxy.config import SessionOptions

log = logging.getLogger("pflash_proxy.sessions")

T = TypeVar("T")

SNAPSHOT_TOTALS_S = 5.0  # a shared index's snapshot totals in the stats are at most this old (plus one listing)
# a displaced session is saved only while the writes not yet paid for at --idle-save-mb-s are worth at most this
EVICTION_BURST_S = 2.0
SKIP_LOG_EVERY_S = 60.0  # a skipped eviction save is logged at most this often (counted every time)


class WriteBudget:
    """The snapshot writes' I/O budget (``--idle-save-mb-s``, every save whatever made it): bytes written, paid
    for at ``rate()`` bytes per second (read at each call: the setting may change). ``owed_s`` says how long until
    everything written so far is paid for."""

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


@dataclass
class Saved:
    """What a save did (``SnapshotStore.save``): the snapshot written (None: nothing was), and whether what kept it
    from being written passes by itself (the engine busy on the slot, or not answering now)."""

    record: SnapshotRecord | None
    passing: bool = False


class SnapshotStore:
    def __init__(self, settings: SessionOptions, slot_save_path: Path, index: SessionIndex, watch: UpstreamWatch,
                 engine: Engine, store_failed: Callable[[str, Exception], None], *, temp_tag: str = ""):
        self.settings = settings  # --idle-save-mb-s (read at each save: the setting may change)
        if engine.slots is None:
            raise ValueError("sessions need an engine whose slots can be addressed (Engine.slots)")
        # ``temp_tag``: this node's name in a temporary snapshot file's (several nodes share the folder)
        self.files = SnapshotManager(index, engine.slots, slot_save_path, int(settings.max_cache_gb * 1024**3),
                                     temp_tag=temp_tag)
        self.index = index
        self.watch = watch
        self.engine = engine
        self._store_failed = store_failed  # the service's count-and-log of an index failure
        self.write_budget = WriteBudget(lambda: self.settings.idle_save_mb_s * 1e6)  # every save
        self._skip_logged = -SKIP_LOG_EVERY_S
        self.counters = {"restored": 0, "evicted_saves": 0, "evicted_saves_skipped": 0, "saves_unchanged": 0,
                         "save_failures": 0, "saves_refused": 0, "restores_empty": 0}
        # a shared index's snapshot count and bytes, as last listed in a worker thread (``totals``)
        self._totals: tuple[int, int] = (0, 0)
        self._totals_at = -SNAPSHOT_TOTALS_S
        self._totals_task: asyncio.Future[list[SnapshotRecord]] | None = None

    async def start(self) -> None:
        """The snapshot folder reconciled with the index (``SnapshotManager.reconcile``), in a worker thread."""
        await asyncio.get_running_loop().run_in_executor(None, self.files.reconcile)

    def on_timing(self, callback: Callable[[str, float], None] | None) -> None:
        """``callback(save|restore, seconds)`` after every snapshot save and restore (the metrics)."""
        self.files.on_timing = callback

    def delete(self, sids: Iterable[str]) -> None:
        """The snapshots of sessions the index forgot (a prune; blocking: a worker thread's)."""
        for sid in sids:
            self.files.delete(sid)

    async def read(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``, a read of the snapshot index and directory: at once with a local index (its snapshot
        records are in memory, the files local); in a worker thread with a remote one (it answers over the
        network, and a directory nodes share may be a remote mount)."""
        return await run(self.index, fn, *args, small=True)

    # 1. Saves ----------------------------------------------------------------------------------------------
    async def save(self, slot_id: int, sid: str, tokens: int, served_hashes: list[str],
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
            record = await self.files.save(slot_id, sid, tokens, served_hashes, self.watch.model_identity)
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
        running model, its file in the folder: it is not written again); None when a save must write."""
        try:
            rec = await self.read(self.files.store.snapshot, sid)
        except StoreError:
            return None
        if rec is None or rec.served_hashes != served_hashes or rec.model_identity != self.watch.model_identity:
            return None
        return rec if await self.read(self.files.on_disk, sid) else None

    async def save_leased(self, lease: Lease) -> Saved:
        """Save the session that ``lease``'s slot holds, unless the slot holds nothing or its snapshot is current."""
        slot, sid = lease.slot, lease.session
        if not slot.tokens or (slot.snapshot_current and self.files.on_disk(sid)):
            return Saved(None)
        saved = await self.save(slot.id, sid, slot.tokens, slot.served_hashes,
                                (slot.task_seen, slot.prompt_tokens, slot.epoch, slot.notices))
        slot.snapshot_current = saved.record is not None
        return saved

    # 2. A displaced session --------------------------------------------------------------------------------
    async def save_displaced(self, lease: Lease) -> None:
        """Save the session ``lease`` displaced from its slot (``Lease.evicted``), unless it is anonymous, holds
        nothing known, is current on disk, or the write budget is more than ``EVICTION_BURST_S`` behind."""
        ev = lease.evicted
        if ev is None or ev.session.startswith(ANONYMOUS_KEY) or not ev.known or not ev.tokens \
                or (ev.snapshot_current and await self.read(self.files.on_disk, ev.session)):
            return
        owed = self.write_budget.owed_s()
        if owed > EVICTION_BURST_S:  # over the write budget: the displaced session keeps its last snapshot
            self.counters["evicted_saves_skipped"] += 1
            if time.monotonic() - self._skip_logged >= SKIP_LOG_EVERY_S:
                self._skip_logged = time.monotonic()
                log.info("snapshot writes are %.1f s over --idle-save-mb-s: session %s, displaced from slot %d, "
                         "is not saved (its last snapshot stays; %d skipped so far)", owed, ev.session[:8],
                         lease.slot.id, self.counters["evicted_saves_skipped"])
            return
        self.counters["evicted_saves"] += 1
        await self.save(lease.slot.id, ev.session, ev.tokens, ev.served_hashes,
                        (ev.task_seen, ev.prompt_tokens, ev.epoch, ev.notices))

    # 3. Restores -------------------------------------------------------------------------------------------
    async def restore(self, lease: Lease, served_hashes: list[str]) -> int | None:
        """Restore ``lease``'s session into its slot from a snapshot that is a prefix of ``served_hashes`` (after any
        save of that session still running); the tokens restored, None when there was none to restore or it failed
        (``lease.reason`` then says so)."""
        slot = lease.slot
        async with self.files.lock(lease.session):  # after a save of this session still running (evicted)
            try:
                snap = await self.read(self.files.restorable, lease.session, self.watch.model_identity)
            except StoreError as exc:
                self._store_failed("reading the snapshot index", exc)
                snap = None
            if snap is None or not is_prefix(snap.served_hashes, served_hashes):
                return None
            try:
                ok = await self.files.restore(slot.id, snap)
            except EngineUnreachable as exc:
                log.warning("restore failed: %s", exc)
                ok = False
            if not ok:
                lease.reason = "its snapshot could not be restored"
                return None
            self.counters["restored"] += 1
            slot.tokens, slot.prompt_tokens, slot.served_hashes = snap.tokens, snap.tokens, snap.served_hashes
            slot.snapshot_current, slot.known, slot.epoch = True, True, lease.epoch
            slot.notices = lease.notices
            return snap.tokens

    # 4. Totals and stats -----------------------------------------------------------------------------------
    def totals(self) -> tuple[int, int]:
        """(snapshots, bytes) in the index. A local index keeps its snapshot records in memory; a remote one
        lists them over the network (every node's), so that listing runs in a worker thread at most every
        SNAPSHOT_TOTALS_S and the stats show the last one (a scrape never stalls the loop)."""
        if not self.index.remote:
            try:
                snaps = self.index.snapshots()
            except StoreError as exc:
                self._store_failed("listing snapshots", exc)
                snaps = []
            return len(snaps), sum(s.size for s in snaps)
        stale = time.monotonic() - self._totals_at >= SNAPSHOT_TOTALS_S
        if stale and self._totals_task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return self._totals
            self._totals_task = loop.run_in_executor(None, self.index.snapshots)
            self._totals_task.add_done_callback(self._totals_listed)
        return self._totals

    def _totals_listed(self, fut: asyncio.Future[list[SnapshotRecord]]) -> None:
        self._totals_task = None
        self._totals_at = time.monotonic()
        exc = fut.exception() if not fut.cancelled() else None
        if isinstance(exc, StoreError):
            self._store_failed("listing snapshots", exc)
        elif exc is None and not fut.cancelled():
            snaps = fut.result()
            self._totals = (len(snaps), sum(s.size for s in snaps))

    def stats(self) -> SnapshotStats:
        n_snaps, snap_bytes = self.totals()
        f = self.files.stats
        return SnapshotStats(**self.counters, snapshots=n_snaps, snapshot_bytes=snap_bytes,
                             snapshot_bytes_written=self.write_budget.written, snap_saves=int(f["saves"]),
                             snap_restores=int(f["restores"]), snap_restore_failures=int(f["restore_failures"]),
                             snap_damaged=int(f["damaged"]), snap_evictions=int(f["evictions"]),
                             snap_stray_temp_removed=int(f["stray_temp_removed"]),
                             snap_save_ms_total=f["save_ms_total"], snap_restore_ms_total=f["restore_ms_total"],
                             snap_refused_records=int(f["refused_records"]))
