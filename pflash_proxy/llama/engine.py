"""``LlamaServerEngine``: llama-server behind the ``Engine`` and ``Slots`` protocols (``pflash_proxy.engine``).

Every call goes through the existing transport, ``Upstream.call`` (its pooled connection, its readiness gate, its
wait for a restarting server, the proxy's own ``--upstream-api-key``); this module only knows llama-server's API:

1. Counts: ``POST /v1/chat/completions/input_tokens`` (a chat body → ``input_tokens``, the template applied by the
   server) and ``POST /tokenize`` (``add_special`` for BOS; ``with_pieces`` for each token's text, which comes as a
   string, or as a list of byte values when the token is not valid UTF-8 on its own).
2. The cache report of an answer: ``timings`` (``cache_n``, ``prompt_n``, ``predicted_n``, ``prompt_ms``,
   ``predicted_ms``) on completion and chat answers and on the last event of a stream; otherwise the ``usage`` of
   llama-server's dialect routes: Anthropic (``cache_read_input_tokens``; ``input_tokens`` excludes the cached
   part), Responses (``input_tokens_details.cached_tokens``; ``input_tokens`` includes it) and OpenAI
   (``prompt_tokens_details.cached_tokens``). ``report_markers``: an event without ``"timings"`` or ``"usage"``
   carries no report.
3. ``describe``: ``GET /props`` (``total_slots``, the per-slot ``n_ctx``, ``model_path``, ``model_alias``); the
   identity is the first 16 hex digits of the SHA-256 of those four as sorted JSON, the value the session index
   has always stored beside each snapshot. A 503 (loading) or an answer that is no object: ``EngineNotReady``.
4. Slots: ``id_slot`` in the body pins a request; ``POST /slots/{id}?action=save|restore|erase`` with
   ``{"filename": ...}`` (``n_saved`` / ``n_restored`` in the answer); ``GET /slots`` (``is_processing``,
   ``id_task``, ``n_prompt_tokens`` per slot: the tokens the slot's cache holds, prompt and generated; b11434
   adds the last task's prompt text only when started with ``LLAMA_SERVER_SLOTS_DEBUG`` set, so a slot's state
   says how long its content is, never what it is); whether saving is enabled is asked with a save of an
   invalid file name, which llama-server refuses before it touches a slot (400: enabled, 501: no
   ``--slot-save-path``).
   llama-server runs a slot action on its main loop between batches and says how long it took
   (``timings.save_ms`` / ``timings.restore_ms``) and how many bytes it wrote or read (``n_written`` / ``n_read``):
   those are summed per action (``slot_actions`` in ``stats``), the time no batch of any slot ran.
5. Continuity: ``epoch``/``vouches`` are the transport's sentinel (``llama/sentinel.py``: one kept-alive
   connection to a loopback llama-server), started by ``start_watching``. ``reachable``: ``GET /health``, where
   only a refused connection or an error status means gone (no answer in time: a loaded machine).
6. ``setup_warning``: the flags the proxy relies on that the attached server's API cannot show. Shown, so never
   named: the slot count (``/props`` ``total_slots``) and ``--slot-save-path`` (the probe of step 4). Not shown
   by b11434's ``/props`` or ``/slots``: ``--no-cache-idle-slots`` and ``-sps 0``, and ``--swa-full``, which
   matters only for a sliding-window model (read from the GGUF at ``model_path`` when this host can read it);
   ``endpoint_slots: false`` in ``/props`` is said too (hits are then checked by ``cache_n`` only).
7. Errors: the transport's become the seam's (``UpstreamUnavailable`` → ``EngineUnreachable``, ``UpstreamTimeout``
   → ``EngineTimeout``, ``UpstreamNotReady`` → ``EngineNotReady``); an answer with an error status, or without the
   field asked for, is ``EngineRefused`` with that status and the start of its body.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from pflash_proxy.engine import (CacheReport, EngineInfo, EngineNotReady, EngineRefused, EngineTimeout,
                                 EngineUnreachable, Piece, SlotState)
from pflash_proxy.errors import UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable
from pflash_proxy.llama.sentinel import SentinelStats
from pflash_proxy.llama.upstream import Upstream

SLOT_FIELD = "id_slot"
REPORT_MARKERS = (b'"timings"', b'"usage"')  # step 2: the fields an answer's cache report is read from
_PROBE_NAME = "../pflash-probe"  # refused by llama-server's filename check before any slot is touched
_SLOT_ACTION_TIMEOUT_S = 120.0


async def _call(upstream: Upstream, method: str, path: str, payload: Mapping[str, object] | None = None, *,
                wait: bool = True, timeout_s: float | None = None) -> tuple[int, object]:
    """``Upstream.call`` with the transport's errors turned into the seam's."""
    try:
        status, data = await upstream.call(method, path, payload, wait=wait, timeout_s=timeout_s)
        return status, data
    except UpstreamTimeout as exc:
        raise EngineTimeout(exc.message) from exc
    except UpstreamNotReady as exc:
        raise EngineNotReady(exc.message) from exc
    except UpstreamUnavailable as exc:
        raise EngineUnreachable(exc.message) from exc


def _detail(data: object) -> str:
    """The message of a llama-server error body (``{"error": {"message": ...}}``), else the body's start."""
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
    return str(data)[:300]


def _int(value: object) -> int:
    """A count as llama-server writes it (a number; missing or null: 0); TypeError/ValueError otherwise."""
    if value is None:
        return 0
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"not a count: {value!r}")


def _reported(value: object) -> int | None:
    """A save's ``n_saved`` or a restore's ``n_restored``: None when the server does not say."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms(timings: Mapping[str, object], key: str) -> float | None:
    value = timings.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def cache_report(answer: Mapping[str, object] | None) -> CacheReport | None:
    """Step 2: what llama-server's final answer (or stream event) says of the prefix cache, or None."""
    if not isinstance(answer, Mapping):
        return None
    try:
        timings = answer.get("timings")
        if isinstance(timings, Mapping) and "cache_n" in timings:
            return CacheReport(_int(timings.get("cache_n")), _int(timings.get("prompt_n")),
                               _int(timings.get("predicted_n")), _ms(timings, "prompt_ms"),
                               _ms(timings, "predicted_ms"))
        usage = answer.get("usage")
        if not isinstance(usage, Mapping):
            inner = answer.get("response") or answer.get("message")
            usage = inner.get("usage") if isinstance(inner, Mapping) else None
        if not isinstance(usage, Mapping):
            return None
        if "cache_read_input_tokens" in usage:
            return CacheReport(_int(usage["cache_read_input_tokens"]), _int(usage.get("input_tokens")),
                               _int(usage.get("output_tokens")))
        for details_key, total_key, out_key in (("input_tokens_details", "input_tokens", "output_tokens"),
                                                ("prompt_tokens_details", "prompt_tokens", "completion_tokens")):
            details = usage.get(details_key)
            if isinstance(details, Mapping) and "cached_tokens" in details:
                cached = _int(details["cached_tokens"])
                return CacheReport(cached, max(0, _int(usage.get(total_key)) - cached), _int(usage.get(out_key)))
    except (TypeError, ValueError):
        return None
    return None


def identity_of(props: Mapping[str, object]) -> EngineInfo:
    """Step 3: the model a ``/props`` answer describes."""
    n_slots = _int(props.get("total_slots")) or 1
    gen = props.get("default_generation_settings")
    details = {"model_path": props.get("model_path"), "n_ctx": gen.get("n_ctx") if isinstance(gen, dict) else None,
               "total_slots": n_slots, "model_alias": props.get("model_alias")}
    identity = hashlib.sha256(json.dumps(details, sort_keys=True).encode()).hexdigest()[:16]
    n_ctx = details["n_ctx"]
    model = details["model_path"]
    return EngineInfo(identity=identity, n_slots=n_slots, n_ctx=n_ctx if isinstance(n_ctx, int) else None,
                      model=model if isinstance(model, str) else None, details=details)


def _piece(token: object) -> Piece:
    text = token.get("piece") if isinstance(token, dict) else None
    if isinstance(text, str):
        raw = text.encode("utf-8")
    elif isinstance(text, list) and all(isinstance(b, int) and 0 <= b < 256 for b in text):
        raw = bytes(text)  # a token that is not valid UTF-8 on its own
    else:
        raise EngineRefused("/tokenize with pieces", 200, f"a token without its piece: {str(token)[:80]}")
    tid = token.get("id") if isinstance(token, dict) else None
    return Piece(tid if isinstance(tid, int) else -1, raw)


@dataclass(frozen=True)
class SlotActionStats:
    """One slot action's successes (save or restore): how many, their time on llama-server's main loop, the bytes
    written or read."""

    n: int
    server_ms: float
    bytes: int


@dataclass(frozen=True)
class LlamaEngineStats:
    """The engine's counters: the sentinel's connection and the slot actions by action."""

    sentinel: SentinelStats
    slot_actions: dict[str, SlotActionStats]

    def as_json(self) -> dict[str, object]:
        return asdict(self)


class LlamaServerSlots:
    """Step 4: llama-server's slots (``Slots``)."""

    def __init__(self, upstream: Upstream):
        self.upstream = upstream
        # per action, what llama-server reported of the ones that succeeded: how many, their time on its main
        # loop (``timings.<action>_ms``) and the bytes written or read
        self.actions: dict[str, dict[str, float]] = {
            a: {"n": 0, "server_ms": 0.0, "bytes": 0} for a in ("save", "restore")}

    def _account(self, action: str, data: Mapping[str, object], bytes_key: str) -> None:
        timings = data.get("timings")
        ms = _ms(timings, f"{action}_ms") if isinstance(timings, Mapping) else None
        n = _reported(data.get(bytes_key))
        totals = self.actions[action]
        totals["n"] += 1
        totals["server_ms"] += ms or 0.0
        totals["bytes"] += n or 0

    def pin_fields(self, slot: int) -> dict[str, object]:
        return {SLOT_FIELD: slot}

    def pin(self, body: Mapping[str, object], slot: int) -> dict[str, object]:
        return {**body, SLOT_FIELD: slot}

    def unpin(self, body: Mapping[str, object]) -> dict[str, object]:
        return {k: v for k, v in body.items() if k != SLOT_FIELD}

    async def _action(self, slot: int, action: str, name: str | None) -> dict[str, object]:
        payload = {"filename": name} if name is not None else {}
        status, data = await _call(self.upstream, "POST", f"/slots/{int(slot)}?action={action}", payload,
                                   timeout_s=_SLOT_ACTION_TIMEOUT_S)
        if status != 200:
            raise EngineRefused(f"slot {slot} {action}", status, _detail(data))
        return data if isinstance(data, dict) else {}

    async def save(self, slot: int, name: str) -> int | None:
        data = await self._action(slot, "save", name)
        self._account("save", data, "n_written")
        return _reported(data.get("n_saved"))

    async def restore(self, slot: int, name: str) -> int | None:
        data = await self._action(slot, "restore", name)
        self._account("restore", data, "n_read")
        return _reported(data.get("n_restored"))

    async def erase(self, slot: int) -> None:
        await self._action(slot, "erase", None)

    async def states(self) -> list[SlotState] | None:
        status, data = await _call(self.upstream, "GET", "/slots")
        if status != 200 or not isinstance(data, list):
            return None  # --no-slots (501), or an answer of another kind
        out = []
        for s in data:
            if not isinstance(s, dict) or not isinstance(s.get("id"), int):
                continue
            task = s.get("id_task")
            n = s.get("n_prompt_tokens")
            out.append(SlotState(id=s["id"], busy=bool(s.get("is_processing")),
                                 task=task if isinstance(task, int) and task >= 0 else None,
                                 prompt_tokens=n if isinstance(n, int) else None))
        return out

    async def can_save(self) -> bool | None:
        try:
            status, _ = await _call(self.upstream, "POST", "/slots/0?action=save", {"filename": _PROBE_NAME},
                                    timeout_s=5)
        except EngineUnreachable:
            return None
        return True if status == 400 else False if status == 501 else None


class LlamaServerEngine:
    """llama-server as an ``Engine`` with ``Slots``, on one ``Upstream``."""

    def __init__(self, upstream: Upstream):
        self.upstream = upstream
        self._slots = LlamaServerSlots(upstream)
        self._props: dict[str, object] | None = None  # the last /props answer (``setup_warning`` reads it)
        # the last answer read and its report: the stages that read one turn's answer share one reading
        self._last_report: tuple[object, CacheReport | None] = (None, None)

    @property
    def slots(self) -> LlamaServerSlots:
        return self._slots

    @property
    def address(self) -> str:
        return self.upstream.base_url

    @property
    def report_markers(self) -> tuple[bytes, ...]:
        return REPORT_MARKERS

    async def count_prompt(self, chat_body: Mapping[str, object]) -> int:
        status, data = await _call(self.upstream, "POST", "/v1/chat/completions/input_tokens", chat_body)
        n = data.get("input_tokens") if isinstance(data, dict) else None
        if status != 200 or not isinstance(n, int):
            raise EngineRefused("counting the prompt's tokens", status, _detail(data))
        return n

    async def _tokenize(self, text: str, add_special: bool, with_pieces: bool) -> list[object]:
        status, data = await _call(self.upstream, "POST", "/tokenize",
                                   {"content": text, "add_special": add_special, "with_pieces": with_pieces})
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if status != 200 or not isinstance(tokens, list):
            raise EngineRefused("/tokenize", status, _detail(data))
        return tokens

    async def count_text(self, text: str, *, add_special: bool = False) -> int:
        return len(await self._tokenize(text, add_special, False))

    async def pieces(self, text: str) -> list[Piece]:
        return [_piece(t) for t in await self._tokenize(text, False, True)]

    def cache_report(self, answer: Mapping[str, object] | None) -> CacheReport | None:
        last, report = self._last_report
        if answer is None or answer is not last:
            report = cache_report(answer)
            self._last_report = (answer, report)
        return report

    async def describe(self, *, wait: bool = True) -> EngineInfo:
        status, data = await _call(self.upstream, "GET", "/props", wait=wait)
        if status == 200 and isinstance(data, dict):
            self._props = data
            return identity_of(data)
        if status in (200, 503):
            raise EngineNotReady(f"upstream /props unavailable ({status})")
        raise EngineRefused("/props", status, _detail(data))

    @property
    def not_ready_reason(self) -> str | None:
        return self.upstream.not_ready_reason

    async def wait_ready(self, timeout_s: float) -> None:
        try:
            await self.upstream.wait_ready(asyncio.get_running_loop().time() + timeout_s)
        except UpstreamNotReady as exc:
            raise EngineNotReady(exc.message) from exc

    async def healthy(self, timeout_s: float = 2.0) -> bool:
        return await self.upstream.health(timeout_s=timeout_s)

    async def reachable(self, timeout_s: float) -> bool:
        try:
            status, _ = await self.upstream.call("GET", "/health", timeout_s=timeout_s, check_ready=False)
        except UpstreamTimeout:
            return True
        except UpstreamUnavailable:
            return False
        return status == 200

    async def setup_warning(self, save_dir: str) -> str | None:
        """Step 6, from the ``/props`` answer ``describe`` read (asked now when it read none)."""
        props = self._props
        if props is None:
            try:
                status, data = await _call(self.upstream, "GET", "/props", wait=False)
            except (EngineUnreachable, EngineNotReady):
                status, data = 0, None
            props = data if status == 200 and isinstance(data, dict) else {}
        notes = []
        unverified = ["--no-cache-idle-slots", "-sps 0"]
        saving = await self._slots.can_save()
        if saving is False:
            notes.append("it has no --slot-save-path, so sessions cannot be snapshotted or restored")
        elif saving is None:
            unverified.append(f"--slot-save-path {save_dir}")
        if props.get("endpoint_slots") is False:
            notes.append("/slots is disabled, so a hit is checked only by cache_n after the answer")
        window = await asyncio.to_thread(_sliding_window, props.get("model_path"))  # a file read: off the loop
        if window is None:
            unverified.append("--swa-full (for a sliding-window model)")
        elif window:
            unverified.append("--swa-full")
        if not notes and not unverified:
            return None
        return (f"llama-server at {self.upstream.base_url}: {('; '.join(notes) + '; ') if notes else ''}the proxy "
                f"cannot verify from /props or /slots that it runs with {' '.join(unverified)}; without them idle "
                "slots can be cleared or mixed and every turn is re-prefilled (the proxy checks cache_n after each "
                "response and counts mismatches in /pflash/stats)")

    def on_restart(self, listener: Callable[[str], object]) -> None:
        self.upstream.add_restart_listener(listener)

    def note_restart(self, reason: str) -> None:
        self.upstream.notify_restart(reason)

    def epoch(self) -> int | None:
        return self.upstream.sentinel.current()

    def vouches(self, epoch: int | None) -> bool:
        return self.upstream.sentinel.vouches(epoch)

    def start_watching(self) -> None:
        self.upstream.sentinel.start()

    def stop_watching(self) -> None:
        self.upstream.sentinel.cancel()

    def stats(self) -> LlamaEngineStats:
        return LlamaEngineStats(self.upstream.sentinel.stats(),
                                {a: SlotActionStats(int(t["n"]), t["server_ms"], int(t["bytes"]))
                                 for a, t in self._slots.actions.items()})


def _sliding_window(model_path: object) -> bool | None:
    """Whether the model at ``model_path`` (``/props``, read here when this host can) uses a sliding window; None
    when it cannot be read."""
    if not isinstance(model_path, str) or not model_path:
        return None
    try:
        from pflash_proxy.llama.spawn import gguf_facts

        return gguf_facts(Path(model_path)).sliding_window is not None
    except Exception:  # noqa: BLE001 - another host's path, not a GGUF, unreadable: unknown
        return None
