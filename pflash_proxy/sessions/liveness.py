"""``UpstreamWatch``: whether the llama-server behind the proxy is the one the slot table describes.

1. ``ensure_ready``: once per upstream incarnation, read ``/props`` (slot count, per-slot context, model path) into
   a *model identity* (snapshots never restore across it), hand the slot count to the owner of the table
   (``on_ready``: it sizes the ``SlotTable`` or marks it empty), and check the configuration (warn once, naming
   only the flags the proxy relies on that the attached server's API cannot show).
2. Restart detection: the spawn supervisor notifies the ``Upstream`` directly; for an attached server a monitor
   polls ``/health`` every second, and a failure followed by recovery is reported the same way, unless the restart
   was already reported while the server was down (a request that met the server back, ``slot_lost``): one
   restart is one notice. Every restart calls ``on_restart`` (the table is emptied) and the next request reads
   ``/props`` again.
3. ``slot_lost``: before a cache ``hit`` is announced, llama-server's own ``/slots`` record of that slot must agree
   with the table, so a restart quicker than the poll cannot be missed either, unless the upstream's sentinel
   (``llama/sentinel.py``: one connection to a loopback llama-server, held open since the slot's content was
   learnt) vouches that no restart happened: a restart closes that connection at once.
4. ``unsaveable``: before any save, ``/slots`` must show the slot idle and still holding what the table learnt
   there (``disagreement``), so a snapshot is never taken of a slot a restart emptied.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pflash_proxy.config import Settings
from pflash_proxy.errors import UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable
from pflash_proxy.llama.upstream import Upstream
from pflash_proxy.sessions.slots import Slot

log = logging.getLogger("pflash_proxy.sessions")


class UpstreamWatch:
    def __init__(self, settings: Settings, upstream: Upstream, on_ready: Callable[[int], None],
                 on_restart: Callable[[str], None]):
        self.settings = settings.upstream  # whether the proxy spawned llama-server
        self.slot_save_path = settings.effective_slot_save_path
        self.upstream = upstream
        self.model_identity = ""
        self.identity_info: dict[str, Any] = {}
        self.n_slots = 1
        self._on_ready = on_ready
        self._on_restart_cb = on_restart
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._monitor: asyncio.Task[None] | None = None
        self._warned = False
        self._slots_route: bool | None = None  # GET /slots answers (None: not asked yet)
        upstream.add_restart_listener(self._on_restart)

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def slots_route(self) -> bool | None:
        """Whether llama-server serves ``GET /slots`` (None: not asked yet)."""
        return self._slots_route

    def start(self) -> None:
        """Poll ``/health`` of an attached server (a spawned one is watched by its supervisor); hold the
        upstream's sentinel connection either way (step 3)."""
        if not self.settings.spawn:
            self._monitor = asyncio.create_task(self._health_monitor())
        self.upstream.sentinel.start()

    def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        self.upstream.sentinel.cancel()

    async def ensure_ready(self, wait: bool = True) -> None:
        """Read the server's slots and identity once (again after a restart); ``wait=False``: do not wait for a
        server that is down or starting (``--upstream-wait-s``), fail at once."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            props = await self.upstream.props(wait=wait)
            if not props:
                raise UpstreamNotReady("upstream /props unavailable")
            n_slots = int(props.get("total_slots") or 1)
            gen = props.get("default_generation_settings") or {}
            info = {"model_path": props.get("model_path"), "n_ctx": gen.get("n_ctx"), "total_slots": n_slots,
                    "model_alias": props.get("model_alias")}
            identity = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
            if self.model_identity and identity != self.model_identity:
                log.warning("upstream identity changed (%s → %s): all slots considered empty", self.identity_info, info)
            self._on_ready(n_slots)
            self.n_slots = n_slots
            self.model_identity, self.identity_info = identity, info
            await self._check_flags(props)
            self._ready = True
            log.info("upstream has %d slots (n_ctx %s per slot), model identity %s", n_slots, info["n_ctx"], identity)

    async def _check_flags(self, props: dict) -> None:
        """Warn once, naming only the flags the proxy relies on that the attached server's API cannot show.

        Shown, so never named: the slot count (``/props`` ``total_slots``, which sizes the table, and ``/slots``)
        and ``--slot-save-path``, probed with a save request carrying an invalid filename (400 = enabled, 501 =
        none), which the server rejects before it touches any slot. Not shown by b11434's ``/props`` or
        ``/slots``: ``--no-cache-idle-slots`` and ``-sps 0``, and ``--swa-full``, which matters only for a
        sliding-window model (read from the GGUF at ``model_path`` when this host can read it). Nothing is
        printed when nothing is left unverified.
        """
        if self._warned or self.settings.spawn:
            return
        self._warned = True
        notes = []
        unverified = ["--no-cache-idle-slots", "-sps 0"]
        try:
            status, _ = await self.upstream.call("POST", "/slots/0?action=save", {"filename": "../pflash-probe"},
                                                 timeout_s=5)
        except (UpstreamUnavailable, UpstreamTimeout):
            status = None
        if status == 501:
            notes.append("it has no --slot-save-path, so sessions cannot be snapshotted or restored")
        elif status != 400:
            unverified.append(f"--slot-save-path {self.slot_save_path}")
        if props.get("endpoint_slots") is False:
            notes.append("/slots is disabled, so a hit is checked only by cache_n after the answer")
        window = _sliding_window(props.get("model_path"))
        if window is None:
            unverified.append("--swa-full (for a sliding-window model)")
        elif window:
            unverified.append("--swa-full")
        if not notes and not unverified:
            return
        log.warning("llama-server at %s: %sthe proxy cannot verify from /props or /slots that it runs with %s; "
                    "without them idle slots can be cleared or mixed and every turn is re-prefilled (the proxy "
                    "checks cache_n after each response and counts mismatches in /pflash/stats)",
                    self.upstream.base_url, ("; ".join(notes) + "; ") if notes else "", " ".join(unverified))

    def _on_restart(self, reason: str) -> None:
        self._ready = False
        self._on_restart_cb(reason)

    async def _health_monitor(self) -> None:
        was_down = False
        notices = 0
        while True:
            await asyncio.sleep(1.0)
            ok = await self.upstream.health(timeout_s=2)
            if not ok and not was_down:
                was_down = True
                notices = self.upstream.restart_notices
                log.warning("upstream %s is not healthy", self.upstream.base_url)
            elif ok and was_down:
                was_down = False
                # one restart is noticed once: a request that met the server back (``slot_lost``) may have already
                if self.upstream.restart_notices == notices:
                    self.upstream.notify_restart("upstream came back after being unreachable")

    async def slot_lost(self, slot: Slot,
                        prefetched: Awaitable[tuple[bool, list[dict[str, Any]] | None]] | None = None) -> str | None:
        """Why llama-server's own record of ``slot`` contradicts the table, or None when it agrees.

        A hit is announced only after this check (one ``GET /slots``, about a millisecond): a llama-server that
        restarted between two polls of the health monitor (systemd restarts it in well under a second) has no
        task on the slot, or its last task there had another prompt length than the proxy's last request. Then
        the table is marked empty and the session's snapshot restored instead of re-prefilling everything.
        ``prefetched``: the answer of ``SessionManager.prefetch_slots``, asked while the session was looked up,
        given only when it covers the slot (no other lease of it, no restart noticed since it was asked), so the
        check costs no round trip of its own on the request's path; ``(False, None)`` when it failed.
        """
        if self._slots_route is False:
            return None
        ok, data = False, None
        if prefetched is not None:
            ok, data = await prefetched
        if not ok:
            try:
                data = await self.upstream.slots()
            except (UpstreamUnavailable, UpstreamNotReady, UpstreamTimeout):
                return None  # the request itself will fail or wait; nothing to conclude here
        if data is None:
            self._slots_route = False  # --no-slots: rely on cache_n checks after the response
            log.info("llama-server does not serve /slots; restarts are detected by the health monitor only")
            return None
        self._slots_route = True
        info = next((s for s in data if isinstance(s, dict) and s.get("id") == slot.id), None)
        why = disagreement(info, slot.id, slot.task_seen, slot.prompt_tokens)
        if why is not None or info is None:
            return why
        slot.task_seen = info["id_task"]
        return None

    async def unsaveable(self, slot_id: int, task_seen: int, prompt_tokens: int, epoch: int | None) -> str | None:
        """Why slot ``slot_id`` must not be saved now as the session the table last learnt there, or None.

        Asked right before every save (one ``GET /slots``): llama-server's record of the slot must show it idle,
        with a task run on it by this very process (``task_seen``: its ids never go back) and the prompt length of
        the proxy's last request there (``prompt_tokens``); a restart the proxy has not noticed yet (the server
        came back empty, or a save waited for it) thus never writes an empty or foreign snapshot over a good one.
        Without ``/slots`` only the sentinel (``epoch``) can vouch for it.
        """
        try:
            data = await self.upstream.slots()
        except (UpstreamUnavailable, UpstreamNotReady, UpstreamTimeout) as exc:
            return f"llama-server did not answer /slots ({exc})"
        if data is None:
            if self.upstream.sentinel.vouches(epoch):
                return None
            return "llama-server serves no /slots and nothing vouches that it kept the slot"
        info = next((s for s in data if isinstance(s, dict) and s.get("id") == slot_id), None)
        if info is not None and info.get("is_processing"):
            return "llama-server is processing a request on it"
        return disagreement(info, slot_id, task_seen, prompt_tokens)


def disagreement(info: dict[str, Any] | None, slot_id: int, task_seen: int, prompt_tokens: int) -> str | None:
    """Why llama-server's ``/slots`` record ``info`` of slot ``slot_id`` contradicts what the table learnt there
    (the highest task id seen, the last prompt's length), or None."""
    if info is None:
        return f"slot {slot_id} is gone"
    if not isinstance(info.get("id_task"), int) or info["id_task"] < 0:
        return "no task has run on it since llama-server started"
    if info["id_task"] < task_seen:
        return f"its task ids went back from {task_seen} to {info['id_task']}"
    n = info.get("n_prompt_tokens")
    # the server's count differs from cache_n + prompt_n by a few template tokens; another prompt, by more
    slack = max(16, prompt_tokens // 10)
    if isinstance(n, int) and prompt_tokens and abs(n - prompt_tokens) > slack:
        return f"its last prompt had {n} tokens, the proxy's last one {prompt_tokens}"
    return None


def _sliding_window(model_path: Any) -> bool | None:
    """Whether the upstream's model (its ``/props`` ``model_path``, read here when this host can) uses a sliding
    window; None when it cannot be read."""
    if not isinstance(model_path, str) or not model_path:
        return None
    try:
        from pflash_proxy.llama.spawn import gguf_facts

        return gguf_facts(Path(model_path)).sliding_window is not None
    except Exception:  # noqa: BLE001 - another host's path, not a GGUF, unreadable: unknown
        return None
