"""The session stages of the pipeline: one turn of the session service per request (``SessionService.begin``).

``SessionStage.on_request`` begins the request's turn (``sessions/service.py``: the session whose served history is
the longest prefix of the request, or a new one or a fork; its slot leased, saved-over sessions saved, restored or
checked; credentials isolated) and hands it to the later stages in ``req.notes.session``. Then it applies the turn:
the served versions of already-served messages (``service.served_version``: only their content; a byte-identical
prefix turn after turn), the slot pin (``Slots.pin_fields``), ``cache_prompt: false`` when ``--cache-isolation``
could not erase another credential's slot, and the ``X-PFlash-Session/Slot/Cache/Cached-Tokens`` headers (plus
``X-PFlash-Cache-Reason`` when a session with a snapshot is a miss). A whole (non-streamed) answer's ``Cache``/
``Cached-Tokens`` are what the engine reused (its cache report, ``Turn.reported``: a hit or restore that reused far
less is a ``miss``, a miss that reused a prefix the slot held a ``hit-prefix``); a stream's headers leave before
that is known, so they carry the expectation, and the log line and the inspector trace carry the answer.
Requests of different credentials never share a session record; a session id echoed by a client of another
credential is ignored. Completion routes get an anonymous slot (a batch of prompts every slot), so they never land
on a busy slot; so does a conversation when the index is unreadable (``X-PFlash-Degraded``).
With a shared index (``--index redis://``, ``sessions/cluster.py``) a session another live node holds is not leased
here: ``req.forward.to`` names that node and the server forwards the client's request there (``X-PFlash-Via`` on
the answer); a request forwarded to this node (``X-PFlash-Forwarded-By``) is always served here; a claimed session
says ``X-PFlash-Node`` (and ``X-PFlash-Takeover``: the node it held before).
``on_response`` hands the answer's cache report to the turn (``Turn.observe``); ``on_finish`` closes the turn (a
request that went upstream and ended before its response did keeps its slot until llama-server is idle on it).
``SessionCommitStage`` (last in the pipeline, after compression may have changed the newest message) starts
writing the served history as the request is forwarded (``Turn.commit``, with the lines the compression omitted
and noted for a later recall, ``CompressionNote.recall``); the answer's headers wait for the write
(``ProxyRequest.settle``), and so does the lease's release, so the next turn reads it. A name the client's dialect
carries in the body (``metadata.user_id``, ``prompt_cache_key``) names the session when no header does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping

from pflash_proxy.contract import ProxyRequest, RelayResult, SessionContext, Stage, TurnTraces
from pflash_proxy.engine import Engine
from pflash_proxy.headers import (CACHE_HEADER, CACHE_REASON_HEADER, CACHED_TOKENS_HEADER, DEGRADED_HEADER, NODE_HEADER,
                                  SESSION_HEADER, SLOT_HEADER, TAKEOVER_HEADER, VIA_HEADER)
from pflash_proxy.sessions.service import SessionService, Turn, TurnAsk
from pflash_proxy.sessions.slots import SlotReport
from pflash_proxy.sessions.stats import SessionStats
from pflash_proxy.sessions.traces import record_cache

log = logging.getLogger(__name__)

# the conversation's name, when the client gives one: ours first, then what agents send on their own
SESSION_HEADERS = (SESSION_HEADER, "X-Claude-Code-Session-Id", "x-session-affinity", "session_id", "session-id")


class SessionStage(Stage):
    """Begins each request's turn and applies it (module docstring); the application starts and stops the
    service (``server/app.py``)."""

    name = "sessions"

    def __init__(self, sessions: SessionService, engine: Engine):
        self.sessions = sessions
        self.engine = engine  # an answer's cache report (``Engine.cache_report``)

    async def on_request(self, req: ProxyRequest) -> None:
        ask = self._ask(req)
        req.forward.node = None  # a node a forward of this turn did not reach: its sessions are taken over here
        turn = await self.sessions.begin(ask, progress=lambda what: setattr(req.relay, "progress", what))
        if turn.forward is not None:  # another live node holds the session (its slot is warm): the turn goes there
            assert turn.record is not None and turn.node is not None
            req.forward.node, req.forward.to = turn.forward
            req.response_headers[VIA_HEADER] = turn.node
            req.log_fields.update({"session": turn.record.id[:8], "forwarded_to": req.forward.to})
            return
        record = turn.record
        req.notes.session = SessionContext(turn, TurnTraces(record.turns + 1 if record is not None else 0))
        if turn.queue_ms is not None:
            req.log_fields["queue_ms"] = turn.queue_ms
        if turn.cold:  # --cache-isolation could not erase another credential's slot
            req.set_field("cache_prompt", False)
        if turn.degraded is not None:
            req.response_headers[DEGRADED_HEADER] = turn.degraded
        if turn.batch:
            req.response_headers[SLOT_HEADER] = "all"
            return
        if record is not None and turn.served[:turn.matched] != req.messages[:turn.matched]:
            req.set_messages(turn.served)
        for name, value in turn.pin.items():
            req.set_field(name, value)
        if record is None:
            req.response_headers[SLOT_HEADER] = str(turn.slot)
            return
        if turn.node is not None:
            req.response_headers[NODE_HEADER] = turn.node
            if turn.taken_from is not None:
                req.response_headers[TAKEOVER_HEADER] = turn.taken_from
        req.response_headers.update({SESSION_HEADER: record.id, SLOT_HEADER: str(turn.slot), CACHE_HEADER: turn.cache,
                                     CACHED_TOKENS_HEADER: str(turn.expected)})
        if turn.cache_reason is not None:
            req.response_headers[CACHE_REASON_HEADER] = turn.cache_reason
        # a whole answer's headers say what the engine reused (its cache report), not what the proxy expected
        req.relay.on_answer.append(lambda answer: self._answer_headers(req, turn, answer))
        req.log_fields.update({"session": record.id[:8], "slot": turn.slot, "cache": turn.cache})

    @staticmethod
    def _ask(req: ProxyRequest) -> TurnAsk:
        """The request's part in its turn: its route, and for a conversation its session name (a header, else the
        name the client's dialect carries in the body: Anthropic ``metadata.user_id``, Responses
        ``prompt_cache_key``), messages and forwards."""
        if req.kind != "chat":
            batch = req.kind == "completion" and is_batch(req.body.get("prompt"))
            return TurnAsk("batch" if batch else "anonymous", req.headers)
        name = next((req.headers[h] for h in SESSION_HEADERS if req.headers.get(h)), None) \
            or (req.dialogue.dialect.session_name(req.body) if req.dialogue.dialect is not None else None)
        unreachable = (req.forward.node or req.forward.failed) if req.forward.failed is not None else None
        return TurnAsk("chat", req.headers, name, req.messages, len(req.raw_body), req.forward.by, unreachable)

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        ctx = req.notes.session
        if ctx is None:
            return
        ctx.settled = result.completed and not result.client_gone
        seen = ctx.turn.observe(SlotReport.of(result.status, self.engine.cache_report(result.final_json)))
        if seen is None:
            return
        req.log_fields.update({"cache": seen.reported, "cached_tokens": seen.cached})
        turn = ctx.turn
        if seen.reported == turn.cache or turn.record is None:
            return
        req.log_fields["cache_announced"] = turn.cache
        log.log(logging.INFO if seen.reported == "hit-prefix" else logging.WARNING,
                "session %s: announced %s (~%d tokens expected from cache), llama-server reused %d: reported %s",
                turn.record.id[:8], turn.cache, turn.expected, seen.cached, seen.reported)
        record_cache(ctx.traces, len(turn.served) - 1, turn.cache, seen.reported, turn.expected, seen.cached,
                     seen.reason)

    def _answer_headers(self, req: ProxyRequest, turn: Turn, answer: Mapping[str, object] | None) -> None:
        """``X-PFlash-Cache`` / ``-Cached-Tokens`` of a whole answer from its own cache report."""
        report = self.engine.cache_report(answer)
        if report is None:
            return
        reported, reason = turn.reported(report.cached_tokens)
        req.response_headers[CACHE_HEADER] = reported
        req.response_headers[CACHED_TOKENS_HEADER] = str(report.cached_tokens)
        if reason is not None:
            req.response_headers[CACHE_REASON_HEADER] = reason

    async def on_finish(self, req: ProxyRequest) -> None:
        ctx = req.notes.session
        if ctx is not None:  # the client left, or the upstream broke: the engine may still work on the slot
            await ctx.turn.close(engine_may_be_busy=ctx.forwarded and not ctx.settled)

    def stats(self) -> SessionStats:
        return self.sessions.stats()


def is_batch(prompt: object) -> bool:
    """llama-server's rule: a list holding strings or token lists is several prompts (a flat token list is one)."""
    return isinstance(prompt, list) and len(prompt) > 1 and any(isinstance(p, (str, list, dict)) for p in prompt)


class SessionCommitStage(Stage):
    """Persist the served history (after every stage that may change it): the write starts before the request is
    forwarded and runs beside it; the answer's headers, and the lease's release, wait for it."""

    name = "sessions-commit"

    async def on_request(self, req: ProxyRequest) -> None:
        ctx = req.notes.session
        if ctx is not None:
            ctx.forwarded = True  # the last stage: the request goes upstream next
        if ctx is None or ctx.turn.record is None:
            return
        note = req.notes.compression
        kept = ctx.turn.commit(list(req.messages), len(req.raw_body), recall=note.recall if note is not None else None)
        # the write runs while the upstream works; the answer's headers wait for it (``settle``)
        req.relay.beside_upstream.append(self._committed(req, kept))

    async def _committed(self, req: ProxyRequest, kept: Awaitable[bool]) -> None:
        if not await kept:  # disk full, damaged index: the request is served, the history not kept
            req.response_headers[DEGRADED_HEADER] = "session index unavailable; this turn was not saved"
