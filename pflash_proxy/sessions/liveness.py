"""``UpstreamWatch``: whether the engine behind the proxy (``engine.Engine``) is the one the slot table describes.

1. ``ensure_ready``: once per engine incarnation, read the engine's description (``Engine.describe``: slot count,
   per-slot context, model) into a *model identity* (snapshots never restore across it), hand the slot count to
   the owner of the table (``on_ready``: it sizes the ``SlotTable`` or marks it empty), and, for an attached
   engine, log once what the proxy relies on that the engine cannot show (``Engine.setup_warning``).
2. Restart detection: the spawn supervisor tells the engine directly; for an attached engine a monitor probes
   its health every second, and a failure (``Engine.reachable``: refused, or an error status; a probe with no
   answer in 2 s is a loaded machine, not a failure) followed by recovery is reported the same way
   (``Engine.note_restart``), unless the restart was already reported while the engine was down (a request that
   met the engine back, ``slot_lost``): one restart is one notice (``restarts`` counts the notices heard).
   Every restart calls ``on_restart`` (the table is emptied) and the next request describes the engine again.
3. ``slot_lost``: before a cache ``hit`` is announced, the engine's own record of that slot (``Slots.states``)
   must agree with the table, so a restart quicker than the poll cannot be missed either, unless the engine
   vouches that no restart happened since the slot's content was learnt (``Engine.vouches``; llama-server: a
   kept-alive connection that a restart closes at once).
4. ``unsaveable``: before any save, the engine's record must show the slot idle and still holding what the table
   learnt there (``disagreement``), so a snapshot is never taken of a slot a restart emptied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pathlib import Path
from typing import TYPE_CHECKING

from pflash_proxy.engine import Engine, EngineNotReady, EngineRefused, EngineUnreachable, Slots, SlotState
from pflash_proxy.sessions.slots import Slot

if TYPE_CHECKING:
    from pflash_proxy.config import UpstreamOptions

log = logging.getLogger("pflash_proxy.sessions")

# what a slot-state check returns: whether the engine answered, and the states it reported (None: it does not)
StatesAnswer = tuple[bool, "list[SlotState] | None"]

# the reasons ``unsaveable`` gives that pass by themselves (the slot is busy, the engine could not be asked now)
BUSY = "the engine is processing a request on it"
NOT_ASKED = "the engine did not report its slots' states"
PASSING = (BUSY, NOT_ASKED)
# and those that say the engine lost the slot's content (a restart)
GONE = ("no task has run", "its task ids went back")


class UpstreamWatch:
    """The engine's watch, given the upstream settings group (whether the proxy spawned llama-server) and the
    slot folder (``Settings.effective_slot_save_path``, named in the setup warning)."""

    def __init__(self, upstream: UpstreamOptions, slot_save_path: Path, engine: Engine,
                 on_ready: Callable[[int], None], on_restart: Callable[[str], None]):
        self.settings = upstream  # whether the proxy spawned llama-server
        self.slot_save_path = slot_save_path
        self.engine = engine
        if engine.slots is None:
            raise ValueError("sessions need an engine whose slots can be addressed")
        self.slots: Slots = engine.slots
        self.model_identity = ""
        self.identity_info: dict[str, object] = {}
        self.n_slots = 1
        self.restarts = 0  # restart notices heard so far (step 2)
        self._on_ready = on_ready
        self._on_restart_cb = on_restart
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._monitor: asyncio.Task[None] | None = None
        self._warned = False
        self._slots_route: bool | None = None  # the engine reports slot states (None: not asked yet)
        engine.on_restart(self._on_restart)

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def slots_route(self) -> bool | None:
        """Whether the engine reports its slots' states (None: not asked yet)."""
        return self._slots_route

    def start(self) -> None:
        """Probe the health of an attached engine (a spawned one is watched by its supervisor); start what lets
        the engine vouch for its state either way (step 3)."""
        if not self.settings.spawn:
            self._monitor = asyncio.create_task(self._health_monitor())
        self.engine.start_watching()

    def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        self.engine.stop_watching()

    async def ensure_ready(self, wait: bool = True) -> None:
        """Describe the engine once (again after a restart); ``wait=False``: do not wait for an engine that is
        down or starting (``--upstream-wait-s``), fail at once."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            try:
                info = await self.engine.describe(wait=wait)
            except EngineRefused as exc:  # it answered, with an error: not ready for the proxy
                raise EngineNotReady(f"upstream /props unavailable ({exc.engine_status})") from exc
            details = dict(info.details)
            if self.model_identity and info.identity != self.model_identity:
                log.warning("upstream identity changed (%s → %s): all slots considered empty", self.identity_info,
                            details)
            self._on_ready(info.n_slots)
            self.n_slots = info.n_slots
            self.model_identity, self.identity_info = info.identity, details
            await self._check_setup()
            self._ready = True
            log.info("upstream has %d slots (n_ctx %s per slot), model identity %s", info.n_slots, info.n_ctx,
                     info.identity)

    async def _check_setup(self) -> None:
        """Warn once (an attached engine) about what the proxy relies on that the engine cannot show."""
        if self._warned or self.settings.spawn:
            return
        self._warned = True
        warning = await self.engine.setup_warning(str(self.slot_save_path))
        if warning is not None:
            log.warning("%s", warning)

    def _on_restart(self, reason: str) -> None:
        self.restarts += 1
        self._ready = False
        self._on_restart_cb(reason)

    async def _health_monitor(self) -> None:
        was_down = False
        notices = 0
        while True:
            await asyncio.sleep(1.0)
            # gone = refused or an error status; a probe with no answer in 2 s is a loaded machine, whose slots
            # still hold what they held (forgetting them would re-prefill every session)
            ok = await self.engine.reachable(timeout_s=2)
            if not ok and not was_down:
                was_down = True
                notices = self.restarts
                log.warning("upstream %s is not healthy", self.engine.address)
            elif ok and was_down:
                was_down = False
                # one restart is noticed once: a request that met the server back (``slot_lost``) may have already
                if self.restarts == notices:
                    self.engine.note_restart("upstream came back after being unreachable")

    async def states(self) -> StatesAnswer:
        """Every slot's state as the engine reports it: (False, None) when it could not be asked now."""
        try:
            return True, await self.slots.states()
        except (EngineUnreachable, EngineNotReady):
            return False, None

    async def slot_lost(self, slot: Slot, prefetched: Awaitable[StatesAnswer] | None = None) -> str | None:
        """Why the engine's own record of ``slot`` contradicts the table, or None when it agrees.

        A hit is announced only after this check (one ``Slots.states`` call, about a millisecond): a server
        that restarted between two probes of the health monitor (systemd restarts it in well under a second) has
        no task on the slot, or its last task there had another prompt length than the proxy's last request.
        Then the table is marked empty and the session's snapshot restored instead of re-prefilling everything.
        ``prefetched``: the answer of ``SlotScheduler.prefetch_slots``, asked while the session was looked up,
        given only when it covers the slot (no other lease of it, no restart noticed since it was asked), so the
        check costs no round trip of its own on the request's path; ``(False, None)`` when it failed.
        """
        if self._slots_route is False:
            return None
        ok, data = False, None
        if prefetched is not None:
            ok, data = await prefetched
        if not ok:
            ok, data = await self.states()
            if not ok:
                return None  # the request itself will fail or wait; nothing to conclude here
        if data is None:
            self._slots_route = False  # the engine reports no states: rely on the cache report after the answer
            log.info("the engine does not report its slots' states; restarts are detected by the health "
                     "monitor only")
            return None
        self._slots_route = True
        info = next((s for s in data if s.id == slot.id), None)
        why = disagreement(info, slot.id, slot.task_seen, slot.prompt_tokens)
        if why is not None or info is None or info.task is None:
            return why
        slot.task_seen = info.task
        return None

    async def unsaveable(self, slot_id: int, task_seen: int, prompt_tokens: int, epoch: int | None) -> str | None:
        """Why slot ``slot_id`` must not be saved now as the session the table last learnt there, or None.

        Asked right before every save (one ``Slots.states`` call): the engine's record of the slot must show it
        idle, with a task run on it by this very process (``task_seen``: its ids never go back) and the prompt
        length of the proxy's last request there (``prompt_tokens``); a restart the proxy has not noticed yet
        (the server came back empty, or a save waited for it) thus never writes an empty or foreign snapshot
        over a good one. An engine that reports no states is trusted only as far as it vouches for ``epoch``.
        """
        try:
            data = await self.slots.states()
        except (EngineUnreachable, EngineNotReady) as exc:
            return f"{NOT_ASKED} ({exc})"
        if data is None:
            if self.engine.vouches(epoch):
                return None
            return "the engine reports no slot states and nothing vouches that it kept the slot"
        info = next((s for s in data if s.id == slot_id), None)
        if info is not None and info.busy:
            return BUSY
        return disagreement(info, slot_id, task_seen, prompt_tokens)


def disagreement(info: SlotState | None, slot_id: int, task_seen: int, prompt_tokens: int) -> str | None:
    """Why the engine's record ``info`` of slot ``slot_id`` contradicts what the table learnt there (the highest
    task id seen, the last prompt's length), or None."""
    if info is None:
        return f"slot {slot_id} is gone"
    if info.task is None:
        return "no task has run on it since the engine started"
    if info.task < task_seen:
        return f"its task ids went back from {task_seen} to {info.task}"
    n = info.prompt_tokens
    # the engine's count differs from the cache report's by a few template tokens; another prompt, by more
    slack = max(16, prompt_tokens // 10)
    if n is not None and prompt_tokens and abs(n - prompt_tokens) > slack:
        return f"its last prompt had {n} tokens, the proxy's last one {prompt_tokens}"
    return None
