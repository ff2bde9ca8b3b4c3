"""The contract between the HTTP server and the stages: ``ProxyRequest``, ``RelayResult``, ``Stage``, ``Pipeline``.

The bottom of the proxy: it imports nothing of the project at run time, and the upper layers (``server``,
``stages``, ``sessions``, ``compress``, ``inspector``) all import it. A stage is an addon (mitmproxy's word): an
object with hooks that the server calls, in the order the stage list gives (``stages.default_stages``).

Per request, the server parses the body into a ``ProxyRequest`` and runs every stage's ``on_request`` in order (a
stage may rewrite the body, add response headers, raise a client error, or hand the request to another proxy node
through ``forward.to``, which ends the run); it sends the body upstream (the client's own bytes when no stage
changed it), awaits the work stages started beside the upstream (``relay.beside_upstream``) before the answer's
headers, relays the answer and runs each stage's ``on_response`` with the ``RelayResult``; ``on_finish`` runs in
reverse order for every stage whose ``on_request`` ran, whatever happened. Failures in ``on_response`` and
``on_finish`` are logged, never raised to the client.
Besides the per-request hooks a stage declares what the application calls on it: ``start``/``stop`` (its
resources, in stage order / reverse order), ``settle`` (work it left running after answers, awaited before a reader
of what that work writes: ``/pflash/stats``, the metrics, the inspector) and ``stats`` (``/pflash/stats`` under the
stage's ``name``). What only the sessions offer (saving them, a client's slot action, their read-only view) the
application asks the session service's admin face for, never a stage.

Stages hand each other what they found through the request's typed parts, never a dict of names: ``notes``
(``StageNotes``: each field set by one stage, read by later ones), ``dialogue`` (the conversation the server
parsed), ``forward`` and ``relay`` (the server's). A stage imports this module, never another stage.
``log_fields`` is the access log's bag: written by anyone, read by the log line alone.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel


if TYPE_CHECKING:
    from aiohttp import web

    from pflash_proxy.compress import RecallSource
    from pflash_proxy.dialects import Conversation, Dialect
    from pflash_proxy.engine import CacheReport
    from pflash_proxy.jsontypes import JSONObject
    from pflash_proxy.sessions.index import SessionRecord, SnapshotRecord, Trace, TraceLog
    from pflash_proxy.sessions.service import Turn

log = logging.getLogger("pflash_proxy.pipeline")


RouteKind = Literal["chat", "completion", "generating"]  # generating: other routes that decode in a slot
Body = dict[str, Any]  # a JSON object, parsed or being built: a request's body, a message, an answer, log fields


@dataclass
class RelayResult:
    """What relaying the upstream's answer produced (``server.relay``), for the stages' ``on_response``."""

    status: int
    bytes_out: int = 0
    completed: bool = False  # upstream body fully relayed
    client_gone: bool = False
    upstream_failed: str | None = None
    final_json: Body | None = None  # last JSON object seen (final SSE chunk or whole body)
    chunks: int = 0
    first_chunk_at: float | None = None
    resent: bool = False  # the upstream failed before the answer began and the request was sent again, once
    upstream_ms: float | None = None  # from sending the request upstream to the answer's end (the access log)


Message = dict[str, object]  # one message of a conversation, as the dialect parsed it


@dataclass
class TurnTraces:
    """The inspector traces one turn leaves (``sessions.traces`` builds them, ``stages.savings`` writes them to
    the session's trace log after the answer), each a record of its kind (``sessions.trace_records``), and what they
    add to the session's totals."""

    turn: int  # the number the commit gives the turn (the record's turns + 1)
    items: list[Trace] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, trace: Trace, counts: Mapping[str, int] | None = None) -> None:
        self.items.append(trace)
        for k, v in (counts or {}).items():
            self.counts[k] = self.counts.get(k, 0) + int(v)


@dataclass
class SessionContext:
    """What the session stage (``stages.sessions.SessionStage``) began for a request (``ProxyRequest.notes.session``):
    ``turn``, the session service's turn, holds the slot and what was found (its ``record``, None for an anonymous
    lease; the ``matched`` leading messages; the ``served`` history; ``cache``, ``expected`` and ``queue_ms``);
    compression reads it, the commit writes the history through it. The context adds only what the stages note
    around it: the inspector's traces and how the request ended."""

    turn: Turn
    # the inspector's traces of this turn, written to the session's trace log after the answer (SavingsStage)
    traces: TurnTraces = field(default_factory=lambda: TurnTraces(0))
    forwarded: bool = False  # the request went upstream (the commit stage, the last, ran)
    settled: bool = False  # its answer ended whole, with the client still there


@dataclass
class CompressionNote:
    """What the compression stage (``stages.compress.CompressStage``) decided for a chat turn with a session
    (``ProxyRequest.notes.compression``): the mode served (the ``X-PFlash-Mode`` header's value), why, and, when the
    compressor ran, its wall time, the scorer it ran and the time of each of its steps (the metrics' drafter time
    is the segment, represent and score steps of a scorer other than the lexical one)."""

    mode: str  # compressed | passthrough | full-error | full-flat | ...
    reason: str | None = None  # why the message was served whole or its budget widened (None: nothing to say)
    ms: float | None = None  # the compressor's wall time (None: it did not run)
    scorer: str | None = None  # the scorer that ran (None: the compressor did not run)
    stage_ms: dict[str, float] = field(default_factory=dict)  # the compressor's steps: segment, represent, score...
    # the lines the served message omitted, which a later turn may recall: the commit keeps them with the session's
    # history (``Turn.commit``); None: nothing was omitted
    recall: RecallSource | None = None


@dataclass
class ResponseChain:
    """A Responses request's chain (``stages.chains.ResponseChainStage``), recorded after the answer: its items
    (the expanded ``previous_response_id`` first), its owner, and the expanded id with how many items it stands
    for."""

    items: list[dict[str, object]]
    owner: str | None
    parent: tuple[str, int] | None


@dataclass
class AnswerNote:
    """What the savings stage notes of an answer for the turn trace it builds later (``stages.savings``)."""

    result: RelayResult
    at: float  # when the answer ended (epoch s)
    report: CacheReport | None  # the engine's cache report of the answer (``Engine.cache_report``)


@dataclass
class TurnNote:
    """What the savings stage notes of a session's chat turn (``ProxyRequest.notes.turn``): its number, when it was
    forwarded, and its answer once there is one."""

    number: int  # the number the commit gives the turn
    forwarding_at: float  # monotonic
    answer: AnswerNote | None = None


@dataclass
class Dialogue:
    """A conversation route's request (chat, Anthropic Messages, Responses), set by the server: the dialect that
    translates the body, the conversation parsed from it (``pflash_proxy.dialects``), the body it was parsed from,
    and what ``ProxyRequest.set_messages`` last served (None: the client's own messages). The chain stage re-parses
    a Responses body it expanded."""

    dialect: Dialect | None = None
    conversation: Conversation | None = None
    base: Body = field(default_factory=dict)
    served: list[Body] | None = None


@dataclass
class StageNotes:
    """What the stages hand each other, each set by the stage named and read by the later ones."""

    session: SessionContext | None = None  # stages.sessions.SessionStage
    chain: ResponseChain | None = None  # stages.chains.ResponseChainStage (a Responses request)
    compression: CompressionNote | None = None  # stages.compress.CompressStage (a session's chat turn)
    turn: TurnNote | None = None  # stages.savings.SavingsStage (a session's chat turn)


@dataclass
class Forwarding:
    """Another proxy node serving this request (several nodes sharing one index, ``sessions/cluster.py``)."""

    # SessionStage: the node's URL; it ends the stage run, and the server sends the client's own request there,
    # untouched, and relays its answer
    to: str | None = None
    node: str | None = None  # SessionStage: the node ``to`` reaches (taken over when it fails)
    failed: str | None = None  # the server: the URL that could not be reached, before it runs the stages again
    # the server: the node that forwarded this request here, when its signed ``headers.FORWARDED_HEADER`` verified (a
    # header that does not verify, a client's own, leaves it None)
    by: str | None = None


@dataclass
class Relay:
    """What the server keeps around the upstream call (``server.routes``)."""

    progress: str = "preparing the request"  # what the stages do now (they write it), for the keep-alives
    stream: web.StreamResponse | None = None  # the stream the keep-alives started (the answer goes into it)
    # work a stage started that runs while the upstream works (the history commit): awaited before the answer's
    # headers go out (``ProxyRequest.settle``), and by ``Pipeline.finish`` before any ``on_finish``
    beside_upstream: list[Awaitable[None]] = field(default_factory=list)
    # called with the upstream's parsed answer (None: not JSON) before the headers of a whole, non-streamed answer
    # are written: a stage sets there what only the answer tells (how much of llama-server's cache was reused)
    on_answer: list[Callable[[Body | None], None]] = field(default_factory=list)


@dataclass
class ProxyRequest:
    """One client request as the stages see it: the request as received, the body as it will be forwarded,
    the parts (``dialogue``: the conversation; ``notes``: what the stages hand each other; ``forward``: another
    node serving it; ``relay``: the server's plumbing around the upstream call) and the access log's bag."""

    kind: RouteKind
    method: str
    path_qs: str
    headers: Mapping[str, str]
    raw_body: bytes
    body: Body
    model: BaseModel | None  # the typed body (``models.ChatCompletionRequest`` / ``CompletionRequest``), if any
    received_at: float = field(default_factory=time.monotonic)
    changed: bool = False  # the body was rewritten: forwarded as ``body``, not the client's bytes
    added_fields: dict[str, object] = field(default_factory=dict)  # keys added to an untouched body (``id_slot``)
    response_headers: dict[str, str] = field(default_factory=dict)  # the stages' headers on the answer
    # the access log's extra fields: written by the stages and the server, read by the log line only
    log_fields: Body = field(default_factory=dict)
    dialogue: Dialogue = field(default_factory=Dialogue)
    notes: StageNotes = field(default_factory=StageNotes)
    forward: Forwarding = field(default_factory=Forwarding)
    relay: Relay = field(default_factory=Relay)
    ran: list[Stage] = field(default_factory=list)  # Pipeline: the stages whose on_request ran, for finish


    async def settle(self) -> None:
        """Await the work started beside the upstream request (``relay.beside_upstream``), each piece once."""
        while self.relay.beside_upstream:
            await self.relay.beside_upstream.pop(0)

    @property
    def messages(self) -> list[Body]:
        d = self.dialogue
        if d.served is not None:
            return d.served
        return d.conversation.messages if d.conversation is not None else []

    def set_messages(self, messages: list[Body]) -> None:
        """Serve ``messages`` (only their content may differ), written back into the client's own dialect.

        Always from the body as parsed, with the whole list: a write-back that merges text blocks shifts the
        positions later messages were parsed at, so changes are never stacked on an already rewritten body.
        Keys other stages set meanwhile (``id_slot``) are kept."""
        if messages == self.messages:
            return
        d = self.dialogue
        if d.dialect is None or d.conversation is None:
            raise ValueError("set_messages on a request without a conversation")
        rewritten = d.dialect.write_back(d.base, d.conversation, messages)
        body = dict(self.body)
        body.update({k: v for k, v in rewritten.items() if d.base.get(k) is not v})
        self.set_body(body)
        d.served = list(messages)

    def chat_body(self) -> Body:
        """The conversation as a chat-completions body (exact token counts for any dialect)."""
        if self.dialogue.dialect is None:
            raise ValueError("chat_body on a request without a conversation")
        return self.dialogue.dialect.chat_body(self.body, self.messages)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def set_body(self, body: Body) -> None:
        self.body = body
        self.changed = True

    def set_field(self, key: str, value: object) -> None:
        if key in self.body and self.body[key] == value:
            return
        new = dict(self.body)
        new[key] = value
        if key in self.body or self.changed:
            self.set_body(new)
        else:
            self.body = new
            self.added_fields[key] = value

    def forward_bytes(self) -> bytes:
        if self.changed:
            return json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if not self.added_fields:
            return self.raw_body
        # Keep the client's bytes (key order, escapes, spacing) and splice the new keys in after the "{".
        start = self.raw_body.index(b"{") + 1
        rest = self.raw_body[start:]
        added = json.dumps(self.added_fields, separators=(",", ":")).encode()[1:-1]
        sep = b"" if rest.strip() == b"}" else b","
        return self.raw_body[:start] + added + sep + rest


# Read-only views: what the inspector (and anything else outside the stages) may see of sessions and slots ----
class SlotView(Protocol):
    """One llama-server slot as the slot table knows it."""

    @property
    def id(self) -> int: ...
    @property
    def session(self) -> str | None: ...
    @property
    def tokens(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def busy(self) -> bool: ...
    @property
    def known(self) -> bool: ...
    @property
    def snapshot_current(self) -> bool: ...
    @property
    def anonymous(self) -> bool: ...  # what a request without a session left there
    @property
    def owner(self) -> str | None: ...  # whose requests put the content there (a credential's hash)


class SessionsView(Protocol):
    """The sessions and slots, read only (``sessions.service.ServiceView``). Index reads block: run them off the
    event loop."""

    @property
    def model_identity(self) -> str: ...
    @property
    def identity_info(self) -> Body: ...
    @property
    def queued(self) -> int: ...
    def slots(self) -> Sequence[SlotView]: ...
    def resident_slot(self, sid: str) -> int | None: ...
    def last_uses(self) -> dict[str, float]: ...
    def session(self, sid: str) -> SessionRecord | None: ...
    def trace_log(self, sid: str) -> TraceLog | None: ...  # the inspector's traces of the session
    def snapshot(self, sid: str) -> SnapshotRecord | None: ...
    def holder(self, sid: str) -> str | None: ...  # the node holding the session (a shared index), else None


class StageStats(Protocol):
    """A stage's counters (``Stage.stats``): ``as_json`` is its part of ``/pflash/stats``, under the stage's name."""

    def as_json(self) -> JSONObject: ...


class Stage:
    """Base class: override what you need."""

    name = "stage"

    # Per request --------------------------------------------------------------------------------------------
    async def on_request(self, req: ProxyRequest) -> None:
        return None

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        return None

    async def on_finish(self, req: ProxyRequest) -> None:
        return None

    # What the application calls ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open what the stage owns (an index, a drafter, background tasks); stages start in order."""
        return None

    async def stop(self) -> None:
        """Close it again; stages stop in reverse order, also when a later one failed to start."""
        return None

    async def settle(self) -> None:
        """Wait (boundedly) for work this stage left running after its answers, such as a write the answer did
        not wait for, so that a reader sees what it writes."""
        return None

    def stats(self) -> StageStats | None:
        """The stage's counters (a frozen dataclass of ``pflash_proxy.stats``); None: it keeps none."""
        return None


class Pipeline:
    """The ordered stages of the running app and the three hook runs of one request."""

    def __init__(self, stages: Sequence[Stage] | None = None):
        self.stages: list[Stage] = list(stages or [])

    async def settled(self) -> None:
        """Every stage's ``settle``: what the stages write after their answers is readable."""
        for stage in self.stages:
            try:
                await stage.settle()
            except Exception:
                log.exception("stage %s failed to settle", stage.name)

    async def run_request(self, req: ProxyRequest) -> list[Stage]:
        """Run ``on_request`` in order; returns the stages that ran (for ``finish``), even on error."""
        ran: list[Stage] = []
        req.ran = ran
        for stage in self.stages:
            ran.append(stage)
            await stage.on_request(req)
            if req.forward.to is not None:  # served by another node: the later stages run there
                break
        return ran

    async def run_response(self, req: ProxyRequest, result: RelayResult) -> None:
        for stage in req.ran:
            try:
                await stage.on_response(req, result)
            except Exception:
                log.exception("stage %s failed in on_response", stage.name)

    async def finish(self, req: ProxyRequest) -> None:
        """Run ``on_finish`` of the stages whose ``on_request`` ran, in reverse order; once per ``run_request``."""
        try:
            await req.settle()
        except Exception:
            log.exception("work beside the upstream request failed")
        ran, req.ran = req.ran, []
        for stage in reversed(ran):
            try:
                await stage.on_finish(req)
            except Exception:
                log.exception("stage %s failed in on_finish", stage.name)
