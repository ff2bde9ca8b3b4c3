"""``SessionService``: what the session stages ask of the session layer, in the stages' own terms.

The stages (``stages/sessions.py``, ``stages/chains.py``, ``stages/savings.py``) call this object only; it alone
reaches the manager's slot table, session index, snapshots and cluster node, and it alone decides where an index
call runs (``index.run``: from the index's declared ``remote``, and from the size of the request's history).

1. Readiness and namespaces: ``ensure_ready``; ``owner`` (the hash of a request's credential); ``seed`` (the
   lookup's namespace: the model identity, the owner and the client's session name; a session id the client
   echoes continues that session's namespace when the session is its own credential's).
2. Find and lease (``find_and_lease``): the session whose served history is the longest prefix of the request,
   or a new one, or a fork of one the request diverges from; then its slot's lease. The lease serialises a
   session's requests, but the first lookup happens before the wait, so it is repeated under the lease unless
   no write that can change its answer or the record it read ran since (``SessionIndex.write_mark``); when the
   answer is the same, the record read under the lease is the one used; when the answer changed, the lease is
   returned and the decision taken again, at most ``LOOKUP_ATTEMPTS`` times in all (then the last decision
   stands). A history under ``INLINE_BYTES`` in a local index is looked up on the loop.
3. Several nodes (``cluster.py``): a session another live node holds is not leased here (``Found.forward`` names
   that node); otherwise the session's turn lease in the shared index is taken with the slot's
   (``Found.turn``, freed by ``end_turn``) and ``claim`` makes this node the holder (the node it took the session
   over from, if any). ``forward_failed``: the holder did not answer, its sessions are taken over here.
4. Slots: ``prepare`` (save a displaced session, restore or verify this one, isolate credentials; the
   request's slot pin, ``pin``), anonymous leases (``lease_anonymous``/``prepare_anonymous``), every slot for a
   batch (``lease_all``), one slot for a client's slot action (``slot_guard``).
5. After the answer: ``observe`` (what the engine's cache report says the slot holds), ``report`` (what the turn
   is reported as), ``finish`` (release the lease, or keep it until the engine's slot is idle; the save of
   ``--save-every-turn``).
6. The index: ``commit`` starts writing the served history now (on the loop for a short history in a local
   index, once the request it commits has been sent to the engine, else in a worker thread) and says later
   whether it was kept; ``update_trace_log`` (the inspector's traces of a turn, after its answer) and
   ``index_work`` (the response chains' reads and writes) run in a worker thread. A failed index call is counted
   and logged (``store_failed``), never raised to the request; ``update_trace_log`` alone raises it to its caller,
   which logs it without counting it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pflash_proxy.config import Settings
from pflash_proxy.contract import SessionsView
from pflash_proxy.engine import CacheReport, Engine
from pflash_proxy.sessions.cluster import ClusterNode, Turn
from pflash_proxy.sessions.identity import namespace_seed
from pflash_proxy.sessions.index import SessionIndex, SessionRecord, StoreError, TraceLog, run
from pflash_proxy.sessions.manager import SessionManager, reported_cache
from pflash_proxy.sessions.slots import NO_CREDENTIAL, Lease, SlotReport, SlotsPrefetch

log = logging.getLogger("pflash_proxy.sessions")

T = TypeVar("T")
Message = dict[str, object]

# a request body below this is looked up in, and its served history written to, a local index on the event loop
# (hashing it and a few SQLite reads or one write: well under a millisecond, less than the hop to a worker
# thread and back)
INLINE_BYTES = 32 * 1024
LOOKUP_ATTEMPTS = 9  # lookups under a lease before the last decision stands (step 2)
_SEEDS_MAX = 4096  # namespace answers kept (names and credentials are the clients': bounded)


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


@dataclass
class Prepared:
    """A leased slot made ready: ``hit``/``restored``/``miss``, the tokens expected from the cache, and whether
    the request must be sent with the cache off (the slot could not be isolated from another credential)."""

    cache: str
    expected: int
    cold: bool


def _lookup_key(rec: SessionRecord | None, matched: int) -> tuple[str, int, int, int]:
    """What a lookup decided on: the session, how much of the request it covers, its length and turn count."""
    return ("", 0, 0, 0) if rec is None else (rec.id, matched, len(rec.served), rec.turns)


class SessionService:
    """The session layer's one face to the stages: the turns of the module docstring, over the manager it makes
    from ``settings`` and the ``engine`` (``index``: a session index of the caller's, else the one
    ``--index`` names)."""

    def __init__(self, settings: Settings, engine: Engine, index: SessionIndex | None = None):
        self.manager = SessionManager(settings, engine, index)
        self._seeds: dict[tuple[str, str | None, str | None], str] = {}  # namespace_seed's answers

    @property
    def _index(self) -> SessionIndex:
        return self.manager.store

    @property
    def _cluster(self) -> ClusterNode | None:
        return self.manager.cluster

    # Lifecycle and what the server reads ------------------------------------------------------------------
    async def start(self) -> None:
        await self.manager.start()

    async def stop(self) -> None:
        await self.manager.stop()

    def view(self) -> SessionsView:
        return self.manager.view()

    def stats(self) -> dict[str, object]:
        return self.manager.stats()

    async def save_all(self) -> int:
        return await self.manager.save_all_resident()

    def on_snapshot_timing(self, callback: Callable[[str, float], None] | None) -> None:
        """``callback(save|restore, seconds)`` after every snapshot save and restore (the metrics)."""
        self.manager.snapshots.on_timing = callback

    # 1. Readiness and namespaces -----------------------------------------------------------------------------
    async def ensure_ready(self) -> None:
        await self.manager.ensure_ready()

    def owner(self, headers: Mapping[str, str]) -> str | None:
        return self.manager.owner(headers)

    async def seed(self, explicit: str | None, owner: str | None) -> str:
        if explicit and len(explicit) == 32 and all(c in "0123456789abcdef" for c in explicit):
            rec = await run(self._index, self._index.get, explicit)
            if rec is not None and rec.owner == owner:
                return rec.seed
        key = (self.manager.model_identity, explicit, owner)
        seed = self._seeds.get(key)
        if seed is None:
            if len(self._seeds) >= _SEEDS_MAX:
                self._seeds.clear()
            seed = self._seeds[key] = namespace_seed(*key)
        return seed

    def prefetch_slots(self, seed: str) -> SlotsPrefetch | None:
        """The slots' states, asked beside the lookup when a hit of this namespace is likely."""
        return self.manager.scheduler.prefetch_slots(seed)

    # 2-3. Find and lease, across nodes -----------------------------------------------------------------------
    async def find_and_lease(self, seed: str, explicit: bool, owner: str | None, messages: Sequence[Message],
                             body_bytes: int, forwarded_by: str | None = None, may_forward: bool = True) -> Found:
        """Steps 2 and 3: ``body_bytes``, the request's size, decides where a local index is asked;
        ``may_forward``: False once a forward of this turn failed (the turn is then served here)."""
        index, cluster, table = self._index, self._cluster, self.manager.table
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
            self.manager.store_failed("claiming the session", exc)
            return None

    # 4. Slots ---------------------------------------------------------------------------------------------
    async def prepare(self, lease: Lease, seed: str, served_hashes: list[str], owner: str | None,
                      prefetched: SlotsPrefetch | None, taken_over: bool) -> Prepared:
        """The session's slot made ready for this turn (the manager's ``prepare_slot``, then isolation)."""
        mgr = self.manager
        mgr.scheduler.note_seed(lease, seed)
        lease.prefetched = prefetched
        cache, expected = await mgr.prepare_slot(lease, served_hashes)
        cold = await mgr.isolation.prepare(lease, owner, replaced=cache != "miss")  # --cache-isolation
        if taken_over and self._cluster is not None:  # restored from the shared directory, or cold
            self._cluster.note_takeover(cache)
        return Prepared(cache, expected, cold)

    def pin(self, lease: Lease) -> dict[str, object]:
        """The fields that send a request to ``lease``'s slot."""
        return self.manager.slots.pin_fields(lease.slot.id)

    async def lease_anonymous(self) -> Lease:
        """A lease of its own for a request without a session (completion routes, an unusable index)."""
        return await self.manager.table.acquire("anon-" + uuid.uuid4().hex)

    async def prepare_anonymous(self, lease: Lease, owner: str | None) -> bool:
        """Save what the anonymous lease displaced, isolate credentials; True: send with the cache off."""
        await self.manager.prepare_slot(lease, None)
        return await self.manager.isolation.prepare(lease, owner, replaced=False)

    async def lease_all(self, owner: str | None) -> tuple[list[Lease], bool]:
        """Every slot, in slot order (two batches never deadlock; displaced sessions are saved first), each left
        unknown to the table when released (``release_unknown``); True: send with the cache off."""
        mgr = self.manager
        leases: list[Lease] = []
        cold = False
        try:
            for slot in range(len(mgr.table.slots)):
                leases.append(await mgr.lease_slot(slot))
            for lease in leases:  # --cache-isolation: the engine may run any prompt of the batch on any slot
                cold = await mgr.isolation.prepare(lease, owner, replaced=False) or cold
        except BaseException:
            for lease in leases:
                mgr.scheduler.release_unknown(lease)
            raise
        return leases, cold

    def release_unknown(self, lease: Lease) -> None:
        self.manager.scheduler.release_unknown(lease)

    def slot_guard(self, slot_id: int) -> contextlib.AbstractAsyncContextManager[None]:
        """A client's slot action runs under a lease of that very slot, after which the table no longer claims to
        know its content."""
        return self._slot_lease(slot_id)

    @contextlib.asynccontextmanager
    async def _slot_lease(self, slot_id: int) -> AsyncIterator[None]:
        lease = await self.manager.lease_slot(slot_id)
        try:
            yield
        finally:
            self.manager.scheduler.release_unknown(lease)

    # 5. After the answer ----------------------------------------------------------------------------------
    def cache_report(self, answer: Mapping[str, object] | None) -> CacheReport | None:
        return self.manager.engine.cache_report(answer)

    def observe(self, lease: Lease, cache: str, expected: int, served_hashes: list[str], report: SlotReport
                ) -> int | None:
        """What the slot holds now, from the answer's report (``SlotReport.of``); the tokens the engine took from
        its cache (None: not told)."""
        return self.manager.observe(lease, cache, expected, served_hashes, report)

    def report(self, announced: str, expected: int, cached: int, *, count: bool = True) -> tuple[str, str | None]:
        """What the turn is reported as (``manager.reported_cache``); ``count``: a prefix hit is counted."""
        reported, reason = reported_cache(announced, expected, cached)
        if count and reported == "hit-prefix":
            self.manager.counters["prefix_hits"] += 1
        return reported, reason

    def finish(self, lease: Lease, sid: str | None, engine_may_be_busy: bool) -> None:
        """Release the turn's lease (``engine_may_be_busy``: the request went to the engine and ended before its
        answer did, so the slot stays leased until the engine is idle on it); then ``--save-every-turn``."""
        if engine_may_be_busy:
            self.manager.scheduler.release_when_idle(lease)
        else:
            self.manager.table.release(lease)
        if sid is not None and self.manager.settings.save_every_turn:
            self.manager.save_in_background(sid)

    # 6. The index -----------------------------------------------------------------------------------------
    def store_failed(self, what: str, exc: Exception) -> None:
        self.manager.store_failed(what, exc)

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
            self.manager.store_failed("saving the served history", exc)
            return False
        self.manager.store_ok()
        self.manager.note_write()
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
            self.manager.store_failed(what, exc)
            return None
