"""``FakeEngine``: an in-process ``Engine`` with ``Slots``, for sans-IO tests and fault injection.

It behaves like a server with a prefix cache per slot, at no cost and with no sockets:

- Tokens: a whitespace tokenizer (leading blanks are one token, then each word with the blanks after it), so a
  text's pieces joined are the text; ``add_special`` adds one BOS token. A chat body renders as
  ``<role>\\n<text>\\n`` per message after a BOS token; its tools count one token per word of their JSON.
- ``complete(body)`` stands in for a completion: the prompt goes to the slot the body is pinned to (``pin``)
  or slot 0, the tokens shared with what the slot holds come from the cache (all but the last when the whole prompt
  matches, as llama.cpp does), one token is generated, and the answer carries the report ``cache_report`` reads
  (under ``fake_report``: the fake's own wire format, no real server's). A body with ``cache_prompt: false``
  reuses nothing of the slot, as llama-server does (what cache isolation sends when it cannot erase a slot).
- Slots are token lists; ``save``/``restore`` copy them to and from named files, in memory (``files``) or, with
  ``save_dir``, as files of JSON in that directory (what a proxy that checks, renames and
  checksums its snapshot files needs), refused
  like a real server would: saving disabled (``can_save=False``: 501), an invalid name (``/`` or ``..``: 400),
  a missing or too long file (400; the slot is then empty, as a failed restore leaves it).
- Faults: ``fail(op, error, times=1)`` makes the next ``times`` calls of ``op`` (a method name) raise ``error``;
  ``set_ready(False, reason)`` makes calls raise ``EngineNotReady`` (after waiting ``wait_s`` for readiness;
  ``healthy`` answers False instead);
  ``restart(reason)`` empties every slot, ends the epoch and tells the ``on_restart`` listeners; ``busy`` holds
  the ids of slots that report themselves busy; ``report_states=False`` answers ``states()`` with None.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pflash_proxy.engine import (CacheReport, EngineError, EngineInfo, EngineNotReady, EngineRefused, Piece,
                                 SlotState)

PIN_FIELD = "fake_slot"
REPORT_FIELD = "fake_report"
BOS = "<bos>"
_TOKEN = re.compile(r"^\s+|\S+\s*")


def words(text: str) -> list[str]:
    """The tokens of ``text``; joined, they are ``text``."""
    return _TOKEN.findall(text)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def render(chat_body: Mapping[str, object]) -> list[str]:
    """The prompt tokens of a chat body."""
    messages = chat_body.get("messages")
    if not isinstance(messages, list):
        raise EngineRefused("counting the prompt's tokens", 400, "'messages' must be a list")
    tokens = [BOS]
    for m in messages:
        if not isinstance(m, dict):
            raise EngineRefused("counting the prompt's tokens", 400, "a message must be an object")
        tokens += words(f"<{m.get('role', 'user')}>\n{_text(m.get('content'))}\n")
    tools = chat_body.get("tools")
    if tools:
        tokens += words(json.dumps(tools))
    return tokens


@dataclass(frozen=True)
class FakeEngineStats:
    """The fake's counters: its epoch (it ends with each simulated restart) and how often each operation was
    called."""

    epoch: int
    calls: dict[str, int]

    def as_json(self) -> dict[str, object]:
        return {"epoch": self.epoch, "calls": dict(self.calls)}


@dataclass
class FakeSlot:
    tokens: list[str] = field(default_factory=list)
    task: int | None = None
    prompt_tokens: int | None = None


class FakeSlots:
    """The fake's slots (``Slots``)."""

    def __init__(self, engine: FakeEngine, n_slots: int, save_dir: Path | None = None):
        self.engine = engine
        self.slots = [FakeSlot() for _ in range(n_slots)]
        self.files: dict[str, list[str]] = {}
        self.save_dir = save_dir
        self.saving = True
        self.busy: set[int] = set()
        self.report_states = True

    def pin_fields(self, slot: int) -> dict[str, object]:
        return {PIN_FIELD: slot}

    def pin(self, body: Mapping[str, object], slot: int) -> dict[str, object]:
        return {**body, PIN_FIELD: slot}

    def unpin(self, body: Mapping[str, object]) -> dict[str, object]:
        return {k: v for k, v in body.items() if k != PIN_FIELD}

    def _slot(self, slot: int) -> FakeSlot:
        return self.slots[slot % len(self.slots)]  # wraps like llama-server's id_slot

    @staticmethod
    def _check_name(name: str) -> None:
        if not name or "/" in name or ".." in name:
            raise EngineRefused("slot action", 400, "Invalid filename")

    async def save(self, slot: int, name: str) -> int:
        await self.engine._enter("save")
        if not self.saving:
            raise EngineRefused(f"slot {slot} save", 501, "This server does not support slots action.")
        self._check_name(name)
        tokens = list(self._slot(slot).tokens)
        if self.save_dir is not None:
            (self.save_dir / name).write_text(json.dumps(tokens))
        else:
            self.files[name] = tokens
        return len(tokens)

    def _read(self, name: str) -> list[str] | None:
        if self.save_dir is None:
            return self.files.get(name)
        try:
            tokens = json.loads((self.save_dir / name).read_text())
        except (OSError, ValueError):
            return None
        return [str(t) for t in tokens] if isinstance(tokens, list) else None

    async def restore(self, slot: int, name: str) -> int:
        await self.engine._enter("restore")
        if not self.saving:
            raise EngineRefused(f"slot {slot} restore", 501, "This server does not support slots action.")
        self._check_name(name)
        target = self._slot(slot)
        tokens = self._read(name)
        if tokens is None or len(tokens) > self.engine.n_ctx:
            target.tokens, target.prompt_tokens = [], None  # a failed restore leaves the slot empty
            raise EngineRefused(f"slot {slot} restore", 400, "Failed to restore slot")
        target.tokens = list(tokens)
        return len(tokens)

    async def erase(self, slot: int) -> None:
        await self.engine._enter("erase")
        target = self._slot(slot)
        target.tokens, target.prompt_tokens = [], None

    async def states(self) -> list[SlotState] | None:
        await self.engine._enter("states")
        if not self.report_states:
            return None
        return [SlotState(id=i, busy=i in self.busy, task=s.task, prompt_tokens=s.prompt_tokens)
                for i, s in enumerate(self.slots)]

    async def can_save(self) -> bool | None:
        await self.engine._enter("can_save")
        return self.saving


class FakeEngine:
    """An in-memory engine with ``n_slots`` slots of ``n_ctx`` tokens each (``Engine`` and ``Slots``)."""

    def __init__(self, n_slots: int = 2, n_ctx: int = 4096, *, model: str = "fake-model", wait_s: float = 0.0,
                 save_dir: Path | None = None):
        self.n_ctx, self.model, self.wait_s = n_ctx, model, wait_s
        self._slots = FakeSlots(self, n_slots, save_dir)
        self._faults: dict[str, list[EngineError]] = {}
        self._reason: str | None = None
        self._ready = asyncio.Event()
        self._ready.set()
        self._listeners: list[Callable[[str], object]] = []
        self._epoch = 0
        self._tasks = 0
        self.calls: dict[str, int] = {}  # how often each operation was called
        self.watching = False  # vouches only while watching, like llama-server's sentinel connection

    # Faults -------------------------------------------------------------------------------------------------
    def fail(self, op: str, error: EngineError, times: int = 1) -> None:
        self._faults.setdefault(op, []).extend([error] * times)

    def set_ready(self, ready: bool, reason: str = "the engine is starting") -> None:
        self._reason = None if ready else reason
        (self._ready.set if ready else self._ready.clear)()

    def restart(self, reason: str = "restarted") -> None:
        for s in self._slots.slots:
            s.tokens, s.task, s.prompt_tokens = [], None, None
        self.note_restart(reason)

    async def _enter(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        queued = self._faults.get(op)
        if queued:
            raise queued.pop(0)
        if self._reason is not None:
            await self.wait_ready(self.wait_s)

    # Engine ---------------------------------------------------------------------------------------------------
    @property
    def slots(self) -> FakeSlots:
        return self._slots

    @property
    def address(self) -> str:
        return f"fake://{self.model}"

    @property
    def report_markers(self) -> tuple[bytes, ...]:
        return (f'"{REPORT_FIELD}"'.encode(),)

    async def count_prompt(self, chat_body: Mapping[str, object]) -> int:
        await self._enter("count_prompt")
        return len(render(chat_body))

    async def count_text(self, text: str, *, add_special: bool = False) -> int:
        await self._enter("count_text")
        return len(words(text)) + int(add_special)

    async def pieces(self, text: str) -> list[Piece]:
        await self._enter("pieces")
        return [Piece(i, w.encode("utf-8")) for i, w in enumerate(words(text))]

    def cache_report(self, answer: Mapping[str, object] | None) -> CacheReport | None:
        report = answer.get(REPORT_FIELD) if isinstance(answer, Mapping) else None
        if not isinstance(report, Mapping):
            return None
        cached, new, generated = report.get("cached"), report.get("new"), report.get("generated")
        if not (isinstance(cached, int) and isinstance(new, int) and isinstance(generated, int)):
            return None
        return CacheReport(cached, new, generated, 0.0, 0.0)

    async def describe(self, *, wait: bool = True) -> EngineInfo:
        await self._enter("describe")
        details = {"model": self.model, "n_ctx": self.n_ctx, "n_slots": len(self._slots.slots)}
        identity = hashlib.sha256(json.dumps(details, sort_keys=True).encode()).hexdigest()[:16]
        return EngineInfo(identity=identity, n_slots=len(self._slots.slots), n_ctx=self.n_ctx, model=self.model,
                          details=details)

    @property
    def not_ready_reason(self) -> str | None:
        return self._reason

    async def wait_ready(self, timeout_s: float) -> None:
        if self._reason is None:
            return
        try:
            await asyncio.wait_for(self._ready.wait(), max(0.0, timeout_s))
        except asyncio.TimeoutError:
            raise EngineNotReady(f"upstream not ready: {self._reason}") from None

    async def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            await self._enter("healthy")
        except EngineError:
            return False
        return True

    async def reachable(self, timeout_s: float) -> bool:
        return await self.healthy(timeout_s)

    async def setup_warning(self, save_dir: str) -> str | None:
        return None

    def on_restart(self, listener: Callable[[str], object]) -> None:
        self._listeners.append(listener)

    def note_restart(self, reason: str) -> None:
        self._epoch += 1
        for fn in self._listeners:
            fn(reason)

    def epoch(self) -> int | None:
        return self._epoch if self.watching else None

    def vouches(self, epoch: int | None) -> bool:
        return self.watching and epoch is not None and epoch == self._epoch

    def start_watching(self) -> None:
        self.watching = True

    def stop_watching(self) -> None:
        self.watching = False

    def stats(self) -> FakeEngineStats:
        return FakeEngineStats(self._epoch, dict(self.calls))

    # A completion -------------------------------------------------------------------------------------------
    async def complete(self, body: Mapping[str, object]) -> dict[str, object]:
        """Serve a chat body on its slot: the answer's ``fake_report`` says what came from the slot's cache."""
        await self._enter("complete")
        prompt = render(body)
        pinned = body.get(PIN_FIELD)
        slot = self._slots._slot(pinned if isinstance(pinned, int) else 0)
        if len(prompt) > self.n_ctx:
            raise EngineRefused("a completion", 400, "the request exceeds the available context size")
        shared = 0
        for a, b in zip(slot.tokens if body.get("cache_prompt") is not False else [], prompt):
            if a != b:
                break
            shared += 1
        cached = min(shared, len(prompt) - 1)
        self._tasks += 1
        slot.tokens, slot.task, slot.prompt_tokens = prompt + ["ok"], self._tasks, len(prompt)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "length"}],
                REPORT_FIELD: {"cached": cached, "new": len(prompt) - cached, "generated": 1}}
