"""The seam between the proxy and the inference server behind it: ``Engine`` and its optional ``Slots`` capability.

The proxy's own calls to the server (token counts, the prefix cache's report, readiness, restarts, slot snapshots)
go through these protocols, the way an HTTP client's calls go through one transport interface; relaying the
clients' own requests stays with the transport (``llama.upstream.Upstream``). ``llama.engine.LlamaServerEngine``
implements both protocols for llama-server; ``engine.fake.FakeEngine`` implements them in memory for sans-IO tests
and fault injection. Nothing in this package knows a server's wire format: the names here are the proxy's.

- ``Engine``: count a prompt (a chat-completions body → its input tokens, as the server's chat template renders
  it), count a text, tokenize a text with each token's bytes (``pieces``; ``counts_per_line`` turns them into
  per-line counts), read what the prefix cache served from an answer (``cache_report``), describe the loaded model
  (``describe``: slot count, per-slot context, an identity that changes with the model), readiness
  (``not_ready_reason``, ``wait_ready``, ``healthy``) and restarts (``on_restart`` listeners, ``note_restart``;
  ``epoch``/``vouches``: whether the engine provably kept its state since a point in time, from what
  ``start_watching`` starts); ``reachable`` (whether the engine is there at all, for a shutdown that must not
  wait on one that is gone); ``setup_warning`` (what the proxy relies on that the engine cannot show, said once
  at start-up); ``address`` and ``stats`` for logs, ``report_markers`` for the relay.
- ``Slots`` (``Engine.slots``; None when the engine has no addressable slots): pin a request body to a slot,
  save a slot's state under a file name and restore it (the tokens written or loaded; None when the engine does
  not say), erase a slot, and what each slot holds and whether it is busy (``states``; None when the engine
  does not say).
- Errors: one hierarchy, each also the ``ProxyError`` the server answers with, so a caller that does not catch
  them still gives the client a correct status: ``EngineUnreachable`` (502: refused, reset, DNS;
  ``EngineTimeout``, 504, no answer in time), ``EngineRefused`` (502: the server answered, with an error status;
  carries that status and its message), ``EngineNotReady`` (503: starting, restarting, loading its model).

This package imports nothing of the project but ``errors`` (tests/test_layout.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pflash_proxy.errors import ProxyError, UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable

__all__ = [
    "CacheReport", "Engine", "EngineError", "EngineInfo", "EngineNotReady", "EngineRefused", "EngineTimeout",
    "EngineUnreachable", "Piece", "SlotState", "Slots", "counts_per_line",
]


# Errors ----------------------------------------------------------------------------------------------------------
class EngineError(ProxyError):
    """A failure of a call the proxy itself made to the engine."""

    status = 502
    code = "upstream_error"


class EngineUnreachable(EngineError, UpstreamUnavailable):
    """The engine could not be reached (refused, reset before an answer, DNS)."""

    status = 502
    code = "upstream_unreachable"


class EngineTimeout(EngineUnreachable, UpstreamTimeout):
    """The engine did not answer in time."""

    status = 504
    code = "upstream_timeout"


class EngineNotReady(EngineError, UpstreamNotReady):
    """The engine is starting, restarting or loading its model."""

    status = 503
    code = "upstream_not_ready"


class EngineRefused(EngineError):
    """The engine answered, with an error: ``engine_status`` (its HTTP status, or another code of its own) and
    ``detail`` (its message). The client gets 502: the proxy's own call failed, not the client's request."""

    status = 502
    code = "upstream_refused"

    def __init__(self, what: str, engine_status: int, detail: str = ""):
        self.what, self.engine_status, self.detail = what, engine_status, detail[:300]
        super().__init__(f"{what} was refused by the engine ({engine_status}){': ' + self.detail if detail else ''}")


# What the engine reports -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """One token of a tokenized text: its id and the bytes it stands for (a piece may be part of a UTF-8 character)."""

    id: int
    text: bytes


@dataclass(frozen=True)
class CacheReport:
    """What one answer says of its prompt: tokens taken from the prefix cache, tokens evaluated anew, tokens
    generated, and the milliseconds of prompt evaluation and generation when the engine reports them."""

    cached_tokens: int
    new_tokens: int
    generated_tokens: int = 0
    prompt_ms: float | None = None
    generate_ms: float | None = None

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt: what came from the cache plus what was evaluated."""
        return self.cached_tokens + self.new_tokens


@dataclass(frozen=True)
class EngineInfo:
    """The loaded model as the engine describes it. ``identity`` changes whenever a snapshot saved before could
    not be restored as it was (another model, another context size or slot count); snapshots never restore across
    it."""

    identity: str
    n_slots: int
    n_ctx: int | None  # per slot
    model: str | None
    details: Mapping[str, object]  # what the identity was computed from, for logs and /pflash/stats


@dataclass(frozen=True)
class SlotState:
    """One slot as the engine reports it: whether it works on a task now, the latest task it ran (task ids only
    grow within one server process; None when none ran since it started), and that task's prompt length."""

    id: int
    busy: bool
    task: int | None
    prompt_tokens: int | None


class EngineStats(Protocol):
    """An engine's own counters (a frozen dataclass of its implementation): ``as_json`` is their JSON."""

    def as_json(self) -> dict[str, object]: ...


# The protocols ---------------------------------------------------------------------------------------------------
@runtime_checkable
class Slots(Protocol):
    """Addressable slots whose state can be pinned, saved, restored and erased.

    A slot action sent to a busy slot may wait inside the engine for the slot: callers lease a slot first. A
    failed restore may leave the slot empty. ``save``/``restore`` raise ``EngineRefused`` when the engine refuses
    (saving disabled, an invalid name, a file of another shape)."""

    def pin(self, body: Mapping[str, object], slot: int) -> dict[str, object]:
        """``body`` with the fields that send it to ``slot`` (a new dict; ``pin_fields`` alone for splicing)."""
        ...

    def pin_fields(self, slot: int) -> dict[str, object]:
        """The fields to add to a request body to send it to ``slot``."""
        ...

    def unpin(self, body: Mapping[str, object]) -> dict[str, object]:
        """``body`` without any slot pin a client put in it."""
        ...

    async def save(self, slot: int, name: str) -> int | None:
        """Write ``slot``'s state to the file ``name`` in the engine's save directory; the tokens written (None:
        the engine does not say)."""
        ...

    async def restore(self, slot: int, name: str) -> int | None:
        """Load the file ``name`` into ``slot``; the tokens restored (None: the engine does not say)."""
        ...

    async def erase(self, slot: int) -> None:
        """Empty ``slot``."""
        ...

    async def states(self) -> list[SlotState] | None:
        """Every slot's state, or None when the engine does not report them."""
        ...

    async def can_save(self) -> bool | None:
        """Whether saving is enabled (None: the engine could not be asked), without touching any slot."""
        ...


@runtime_checkable
class Engine(Protocol):
    """The inference server as the proxy's own code sees it (``llama.engine.LlamaServerEngine``,
    ``engine.fake.FakeEngine``)."""

    @property
    def slots(self) -> Slots | None:
        """The slot capability, or None when requests cannot be pinned."""
        ...

    @property
    def address(self) -> str:
        """Where the engine is, for logs and ``/pflash/stats``."""
        ...

    @property
    def report_markers(self) -> tuple[bytes, ...]:
        """Byte strings of which an answer's JSON (or a stream event) holds at least one when it carries the
        cache report: the relay keeps the last such event without parsing the others."""
        ...

    async def count_prompt(self, chat_body: Mapping[str, object]) -> int:
        """The exact number of input tokens of a chat-completions body (messages, tools, template)."""
        ...

    async def count_text(self, text: str, *, add_special: bool = False) -> int:
        """The tokens of ``text`` alone (with the model's BOS/EOS when ``add_special``)."""
        ...

    async def pieces(self, text: str) -> list[Piece]:
        """The tokens of ``text`` with the bytes of each, in order; their bytes joined are ``text``'s UTF-8."""
        ...

    def cache_report(self, answer: Mapping[str, object] | None) -> CacheReport | None:
        """What a final answer (a whole JSON body, or the last event of a stream) says of the prefix cache, or None
        when it says nothing."""
        ...

    async def describe(self, *, wait: bool = True) -> EngineInfo:
        """The loaded model; ``EngineNotReady`` when the engine cannot say now (``wait=False``: do not wait for a
        starting engine)."""
        ...

    @property
    def not_ready_reason(self) -> str | None:
        """None while the engine takes traffic; otherwise why it does not."""
        ...

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once the engine takes traffic; ``EngineNotReady`` after ``timeout_s``."""
        ...

    async def healthy(self, timeout_s: float = 2.0) -> bool:
        """One health probe that never raises."""
        ...

    async def reachable(self, timeout_s: float) -> bool:
        """False only when the engine is gone (it refuses connections, or its health probe answers with an
        error); a probe that gets no answer within ``timeout_s`` counts as reachable (a loaded machine)."""
        ...

    async def setup_warning(self, save_dir: str) -> str | None:
        """One line for the log naming what the proxy relies on that the engine cannot show it (settings it does
        not report; ``save_dir``: where the proxy expects its slot files), or None when nothing is left
        unverified."""
        ...

    def on_restart(self, listener: Callable[[str], object]) -> None:
        """Call ``listener(reason)`` whenever the engine is known to have lost its state."""
        ...

    def note_restart(self, reason: str) -> None:
        """Tell the listeners that the engine lost its state (a check found it so)."""
        ...

    def epoch(self) -> int | None:
        """A token to keep beside what was just learnt of a slot, or None when nothing can vouch for it later."""
        ...

    def vouches(self, epoch: int | None) -> bool:
        """Whether the engine provably kept its state since ``epoch`` was taken (no restart could have come
        between): a slot learnt then needs no check with ``Slots.states``."""
        ...

    def start_watching(self) -> None:
        """Start what ``vouches`` relies on (llama-server: the sentinel's kept-alive connection)."""
        ...

    def stop_watching(self) -> None:
        """Stop it again (idempotent)."""
        ...

    def stats(self) -> EngineStats:
        """The engine's own counters (``/pflash/stats`` beside the sessions')."""
        ...


def counts_per_line(lines: Sequence[str], pieces: Sequence[Piece]) -> list[int]:
    """How many tokens start on each of ``lines`` (which joined are the tokenized text): a token that spans a line
    end counts on the line it starts on; a text's trailing tokens past the last line end count on the last line."""
    counts = [0] * len(lines)
    if not lines:
        return counts
    ends, pos = [], 0
    for line in lines:
        pos += len(line.encode("utf-8"))
        ends.append(pos)
    offset, li = 0, 0
    for piece in pieces:
        while li < len(lines) - 1 and offset >= ends[li]:
            li += 1
        counts[li] += 1
        offset += len(piece.text)
    return counts
