"""``SlotTable``: which session each llama-server slot holds, and who may use it now.

1. A request *leases* a slot for its session.  The session's own slot if it is resident (a cache hit);
   otherwise a free slot, else the least-recently-used idle one (slots whose snapshot is current are cheaper
   to hand over and go first).  A new session (``share``: its message hashes and owner) goes instead to the idle
   slot whose session opened with the most of the same messages (a shared system prompt) and the same owner,
   free slots or not: llama-server then reuses that prefix rather than prefilling it, as its own slot choice
   does, and the displaced session is saved and restored later at no prefill.  The lease reports the session it
   displaced so the caller can save it.
2. One request per session at a time, and never two requests on one slot: a lease marks both busy.  Nothing
   is ever sent to a busy slot; requests that cannot be placed wait in the proxy, in arrival order (a waiter
   that is blocked only by its own session's running request does not hold up the others).
3. The wait is bounded: beyond ``max_queue`` waiting requests a new one is refused at once (``QueueFull``,
   429), and one that waited ``queue_timeout`` seconds gives up (``QueueTimeout``, 503); both say when to
   retry. The proxy's own background saves (``resident_only``) are never refused.
4. Leasing is synchronous bookkeeping (no awaits inside a decision), so no lock exists to be held while a
   response streams; waiting is one future per queued request.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, overload

from pflash_proxy.errors import QueueFull, QueueTimeout

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from pflash_proxy.engine import CacheReport, SlotState


ANONYMOUS_KEY = "anon-"  # the session key of a lease without a session (``Slot.anonymous``): nothing is saved under it
SLOT_KEY = ANONYMOUS_KEY + "slot-"  # + slot id: lease that very slot (anonymous)
# ``Slot.owner`` of content the proxy did not put there, and the owner key of requests without a credential
# (``isolation.py``)
UNKNOWN_OWNER = "?"
NO_CREDENTIAL = "-"


@dataclass
class Slot:
    id: int
    session: str | None = None
    tokens: int = 0  # tokens the server holds in this slot for `session` (prompt + generated)
    prompt_tokens: int = 0  # prompt tokens of the last request (the prefix the next turn should reuse)
    served_hashes: list[str] = field(default_factory=list)
    busy: bool = False
    known: bool = True  # False once the server's numbers disagreed with the table
    snapshot_current: bool = False
    last_used: float = 0.0
    task_seen: int = -1  # the highest llama-server task id seen on this slot (/slots): it only grows per process
    grants: int = 0  # leases granted on this slot so far (a /slots answer read before a lease tells whether any
    # other lease came between: ``SlotScheduler.prefetch_slots``)
    epoch: int | None = None  # the upstream sentinel's epoch when the content was last learnt from llama-server
    # (a response, a /slots check, a restore): while the sentinel vouches for it, a hit needs no /slots check
    notices: int = 0  # restart notices heard when the request (or restore) that put the content there was prepared
    # (``Lease.notices``): a check that finds the content gone counts a restart only if none was noticed since
    owner: str | None = UNKNOWN_OWNER  # whose requests put the content there (``isolation.py``); None: empty

    @property
    def anonymous(self) -> bool:
        """The slot holds what a request without a session left (an anonymous lease, a batch, a slot action)."""
        return self.session is not None and self.session.startswith(ANONYMOUS_KEY)


@dataclass
class Evicted:
    session: str
    tokens: int
    served_hashes: list[str]
    snapshot_current: bool
    known: bool
    prompt_tokens: int = 0
    task_seen: int = -1
    epoch: int | None = None  # what vouches for it (``Slot.epoch``): a save checks the slot first unless it holds
    notices: int = 0  # ``Slot.notices``


def is_prefix(prefix: list[str], full: list[str]) -> bool:
    """Whether the message hashes ``prefix`` open ``full``: a slot (or a snapshot) that served ``prefix`` holds the
    start of a turn that sends ``full``."""
    return len(prefix) <= len(full) and full[: len(prefix)] == prefix


def _evicted(slot: Slot) -> Evicted | None:
    """What ``slot`` held, as the lease that displaces its session reports it (the save of it checks it first)."""
    if slot.session is None:
        return None
    return Evicted(slot.session, slot.tokens, slot.served_hashes, slot.snapshot_current, slot.known,
                   slot.prompt_tokens, slot.task_seen, slot.epoch, slot.notices)


Share = tuple[list[str], str]  # a new session's message hashes and owner key (``SlotTable.acquire``, step 1)


def _sharing(idle: list[Slot], share: Share | None) -> Slot | None:
    """Step 1: the idle slot whose session's served messages begin with the longest run of ``share``'s (at
    least one), of the same owner; the least recently used among equals. None without one."""
    if share is None:
        return None
    hashes, owner = share
    best: Slot | None = None
    best_n = 0
    for slot in idle:
        if slot.session is None or slot.anonymous or not slot.known or slot.owner != owner:
            continue
        n = 0
        for a, b in zip(slot.served_hashes, hashes):
            if a != b:
                break
            n += 1
        if n > best_n or (n and n == best_n and best is not None and slot.last_used < best.last_used):
            best, best_n = slot, n
    return best


@dataclass
class Lease:
    slot: Slot
    session: str
    resident: bool  # the slot already held this session's prefix
    evicted: Evicted | None = None
    released: bool = False
    # the slots' states asked while the lease was sought (``SlotScheduler.prefetch_slots``)
    prefetched: SlotsPrefetch | None = None
    epoch: int | None = None  # the upstream sentinel's epoch when the slot was prepared (``Slot.epoch``)
    notices: int = 0  # restart notices heard when the slot was prepared (``Slot.notices``)
    reason: str | None = None  # why the session is a miss although it had a snapshot (``SessionService.prepare``)


class SlotTable:
    def __init__(self, n_slots: int, max_queue: int = 0, queue_timeout: float = 0.0):
        if n_slots < 1:
            raise ValueError("n_slots must be >= 1")
        self.max_queue, self.queue_timeout = max_queue, queue_timeout  # 0 = unbounded
        self.refused = {"queue_full": 0, "queue_timeout": 0}
        self.slots = [Slot(i) for i in range(n_slots)]
        self._busy_sessions: set[str] = set()
        self._queue: deque[tuple[str, asyncio.Future[Lease | None], bool]] = deque()  # (session, future, resident_only)
        self._shares: dict[str, Share] = {}  # a queued new session's ``share`` (step 1)
        self.waits = 0

    def resident(self, session: str) -> Slot | None:
        for slot in self.slots:
            if slot.session == session:
                return slot
        return None

    def in_use(self) -> set[str]:
        """Sessions that hold a slot, run a request or wait for one: never pruned."""
        return ({s.session for s in self.slots if s.session} | self._busy_sessions
                | {sid for sid, _, _ in self._queue})

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _try_lease(self, session: str, resident_only: bool = False, share: Share | None = None
                   ) -> Lease | None | bool:
        """A lease, None (wait), or False: ``resident_only`` and the session holds no slot any more."""
        if session in self._busy_sessions:
            return None
        if session.startswith(SLOT_KEY):  # a lease of one given slot (a client's slot action)
            slot = self.slots[int(session[len(SLOT_KEY):]) % len(self.slots)]
            if slot.busy:
                return None
            evicted = _evicted(slot)
            slot.session, slot.tokens, slot.prompt_tokens, slot.served_hashes = session, 0, 0, []
            slot.known, slot.snapshot_current, slot.busy = False, False, True
            slot.grants += 1
            self._busy_sessions.add(session)
            return Lease(slot, session, resident=False, evicted=evicted)
        held = self.resident(session)
        if held is not None and not held.busy:
            held.busy = True
            held.grants += 1
            self._busy_sessions.add(session)
            return Lease(held, session, resident=True)
        if resident_only:
            return None if held is not None else False
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        pick = _sharing(idle, share) or min(idle, key=lambda s: (s.session is not None, not s.snapshot_current,
                                                                 s.last_used, s.id))
        evicted = _evicted(pick)
        pick.session, pick.tokens, pick.prompt_tokens, pick.served_hashes = session, 0, 0, []
        pick.known, pick.snapshot_current, pick.busy = True, False, True
        pick.grants += 1
        self._busy_sessions.add(session)
        return Lease(pick, session, resident=False, evicted=evicted)

    def lease_now(self, session: str) -> Lease | None:
        """A lease on the slot ``session`` holds when that slot and the session are idle now, else None: it never
        waits and never displaces (the proxy's idle saves: a slot leased meanwhile is not idle)."""
        lease = self._try_lease(session, resident_only=True)
        return lease if isinstance(lease, Lease) else None

    @overload
    async def acquire(self, session: str, resident_only: Literal[False] = False, share: Share | None = None
                      ) -> Lease: ...
    @overload
    async def acquire(self, session: str, resident_only: bool, share: Share | None = None) -> Lease | None: ...

    async def acquire(self, session: str, resident_only: bool = False, share: Share | None = None) -> Lease | None:
        """A lease on the session's slot, or on another one (displacing its holder, ``Lease.evicted``).
        ``resident_only``: only the slot the session holds now; None once it holds none (never displaces).
        ``share``: a new session's message hashes and owner key (step 1)."""
        fut: asyncio.Future[Lease | None] = asyncio.get_running_loop().create_future()
        if share is not None:
            self._shares[session] = share
        self._queue.append((session, fut, resident_only))
        self._drain()
        if not fut.done():
            if not resident_only and self.max_queue and \
                    sum(1 for _, f, r in self._queue if not r and not f.done()) > self.max_queue:
                self._queue.remove((session, fut, resident_only))
                self.refused["queue_full"] += 1
                raise QueueFull(f"{self.max_queue} requests already wait for a llama-server slot; retry later",
                                retry_after=self._retry_after())
            self.waits += 1
        try:
            if resident_only or not self.queue_timeout or fut.done():
                return await fut
            try:
                return await asyncio.wait_for(asyncio.shield(fut), self.queue_timeout)
            except asyncio.TimeoutError:
                if fut.done() and not fut.cancelled():  # granted in the same instant: keep it
                    return fut.result()
                fut.cancel()
                try:
                    self._queue.remove((session, fut, resident_only))
                except ValueError:
                    pass
                self.refused["queue_timeout"] += 1
                raise QueueTimeout(f"no llama-server slot became free within {self.queue_timeout:g} s; retry later",
                                   retry_after=self._retry_after()) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                granted = fut.result()
                if granted is not None:  # None: a resident_only lease the session no longer had
                    self.release(granted)
            else:
                try:
                    self._queue.remove((session, fut, resident_only))
                except ValueError:
                    pass
            raise
        finally:
            self._shares.pop(session, None)

    def _retry_after(self) -> int:
        """Seconds a refused client should wait: a rough share of the queue per slot, 1 to 60."""
        return max(1, min(60, 2 * (1 + self.queued // max(len(self.slots), 1))))

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        lease.slot.busy = False
        lease.slot.last_used = time.monotonic()
        self._busy_sessions.discard(lease.session)
        self._drain()

    def _drain(self) -> None:
        for item in list(self._queue):
            session, fut, resident_only = item
            if fut.done():
                self._queue.remove(item)
                continue
            lease = self._try_lease(session, resident_only, self._shares.get(session))
            if lease is not None:
                self._queue.remove(item)
                fut.set_result(lease if isinstance(lease, Lease) else None)

    def forget(self, session: str) -> None:
        """The session's prefix is no longer in its slot (e.g. a failed restore wiped it)."""
        slot = self.resident(session)
        if slot is not None:
            slot.tokens = slot.prompt_tokens = 0
            slot.served_hashes = []

    def mark_all_empty(self) -> None:
        """The upstream lost its state (restart), or this process describes it for the first time: no session is
        resident any more. Whose content a slot holds is unknown (``UNKNOWN_OWNER``): the first description may
        find slots a previous run of the proxy filled, and a restart noticed from a slot's answer may be none
        (``isolation.py`` erases such a slot before another credential reads it)."""
        for slot in self.slots:
            slot.task_seen = -1
            slot.tokens = slot.prompt_tokens = 0
            slot.served_hashes = []
            slot.snapshot_current = False
            slot.owner = UNKNOWN_OWNER
            if not slot.busy:
                slot.session = None
            else:
                slot.known = False


class SlotsPrefetch:
    """The slots' states asked before the lease (``SlotScheduler.prefetch_slots``), with what the table was then:
    the grant count of every idle slot, the table itself and the restarts noticed so far."""

    def __init__(self, task: Awaitable[tuple[bool, list[SlotState] | None]], table: SlotTable,
                 grants: dict[int, int], restarts: int):
        self.task, self.table, self.grants, self.restarts = task, table, grants, restarts

    def covers(self, slot: Slot, table: SlotTable, restarts: int) -> bool:
        """The answer speaks for ``slot`` as it is under the current lease: the slot was idle when it was asked,
        exactly one lease (this one) was granted on it since, and no restart was noticed meanwhile."""
        return (table is self.table and restarts == self.restarts and slot.id in self.grants
                and slot.grants == self.grants[slot.id] + 1)


@dataclass(frozen=True)
class SlotReport:
    """What a turn's answer says of its slot's cache, in the session layer's own terms (``observe``):
    ``rejected``, the engine refused the request (the slot keeps what it had); ``cached_tokens`` None, the answer
    said nothing (the client left, the stream broke: the slot's content is unknown); otherwise the tokens taken
    from the cache, the whole prompt, and the tokens generated after it."""

    rejected: bool = False
    cached_tokens: int | None = None
    prompt_tokens: int = 0
    generated_tokens: int = 0

    @classmethod
    def of(cls, status: int, report: CacheReport | None) -> SlotReport:
        """From an answer's HTTP ``status`` and the engine's cache report of it (``Engine.cache_report``)."""
        if report is None:
            return cls(rejected=status != 200)
        return cls(False, report.cached_tokens, report.prompt_tokens, report.generated_tokens)
