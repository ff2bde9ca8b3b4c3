"""The session stages of the pipeline: identity → served history → slot lease → restore → verify.

The stages call the session service (``sessions/service.py``) only: it finds and leases sessions, prepares
slots, commits histories and decides where each index call runs; the engine's own vocabulary (how a request is
pinned to a slot, what an answer's cache report looks like) stays behind ``engine.Engine``.

``SessionStage.on_request`` (chat routes):
1. Seed = upstream model identity + the request's owner (its credential headers, hashed: ``identity``) (+ the
   ``X-PFlash-Session`` name, if given); find the session whose served history is the longest prefix of the
   request, or start one (a request that diverges inside a session's history forks a new session: a session's
   history is linear). Requests of different credentials never share a session record, hence never a served
   history, recall sources or inspector traces; a session id echoed by a client of another credential is ignored.
2. Replace the content of already-served messages by their served versions (byte-identical prefix turn after
   turn); every other field stays the client's own (``served_version``).
3. Lease a slot (queueing in the proxy, never at a busy slot).  If the lease displaced another session whose
   slot content has no current snapshot, save it first.  If this session is not resident but has a snapshot
   for this model identity, restore it; a failed restore deletes the snapshot and falls back to full prefill.
4. Pin the request to its slot (``Slots.pin_fields``: llama-server's ``id_slot``) and add
   ``X-PFlash-Session/Slot/Cache/Cached-Tokens`` headers. A whole (non-streamed) answer's ``Cache``/
   ``Cached-Tokens`` are what the engine reused (its cache report, ``Engine.cache_report``;
   ``sessions.service.reported_cache``: a hit or restore that reused far less is a ``miss`` with ``X-PFlash-Cache-Reason``,
   a miss that reused a prefix the slot held a ``hit-prefix``); a stream's headers leave before that is known,
   so they carry the expectation, and the log line and the inspector trace carry the answer.
Under ``--cache-isolation credential``, between 3 and 4, a slot whose content another credential left and that this
request did not restore its own snapshot into is erased first (``sessions/isolation.py``; anonymous and batch
leases too).
With a shared index (``--index redis://``, ``sessions/cluster.py``), between 1 and 3: a session another live node
holds is not leased here: ``req.forward_to`` names that node and the server forwards the client's request there
(``X-PFlash-Via`` on the answer); a request forwarded to this node (``X-PFlash-Forwarded-By``) is always served
here. Otherwise the session's turn lease in the index is taken with the slot's, this node claims the session
(``X-PFlash-Node``; ``X-PFlash-Takeover`` names the node it held before: step 3 then restores the snapshot that
node left in the shared directory, or prefills cold), and ``on_finish`` frees the turn lease.
``SessionCommitStage`` (last in the pipeline, after compression may have changed the newest message) starts
writing the served history to disk as the request is forwarded; the answer's headers wait for the write
(``ProxyRequest.settle``), and so does the lease's release, so the next turn reads it.
``on_response`` compares the tokens the answer's cache report says were reused with the table's expectation; ``on_finish`` releases
the lease (a request that went upstream and ended before its response did keeps it until llama-server's slot is
idle: ``SlotScheduler.release_when_idle``).  Completion routes (no messages) get an anonymous lease so they
never land on a busy slot.  The conversation routes (chat, Anthropic Messages, Responses) all work on the
internal conversation of ``pflash_proxy.dialects``; a name the client's dialect carries in the body
(``metadata.user_id``, ``prompt_cache_key``) names the session when no header does.
"""

from __future__ import annotations

import logging
import time
import contextlib
from collections.abc import Awaitable, Mapping

from pflash_proxy.contract import (VIA_HEADER, Message, ProxyRequest, RelayResult, SessionContext, SessionsView, Stage,
                                   StageHooks, TurnTraces)
from pflash_proxy.engine import Engine
from pflash_proxy.sessions.cluster import NODE_HEADER, TAKEOVER_HEADER
from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.index import StoreError
from pflash_proxy.sessions.service import SessionService
from pflash_proxy.sessions.slots import SlotReport
from pflash_proxy.sessions.traces import record_cache
from pflash_proxy.stats import JSONPart

log = logging.getLogger("pflash_proxy.sessions")

SESSION_HEADER = "X-PFlash-Session"
DEGRADED_HEADER = "X-PFlash-Degraded"
CACHE_REASON_HEADER = "X-PFlash-Cache-Reason"  # why a turn that had a snapshot or a slot is a miss after all
# the conversation's name, when the client gives one: ours first, then what agents send on their own
SESSION_HEADERS = (SESSION_HEADER, "X-Claude-Code-Session-Id", "x-session-affinity", "session_id", "session-id")


def _pin(req: ProxyRequest, fields: Mapping[str, object]) -> None:
    for name, value in fields.items():
        req.set_field(name, value)


class SessionStage(Stage):
    name = "sessions"

    def __init__(self, sessions: SessionService, engine: Engine):
        self.sessions = sessions
        self.engine = engine  # an answer's cache report (``Engine.cache_report``)

    def bind(self, hooks: StageHooks) -> None:
        self.sessions.on_snapshot_timing(hooks.on_snapshot_timing)  # snapshot timings feed the metrics

    async def start(self) -> None:
        await self.sessions.start()

    async def stop(self) -> None:
        await self.sessions.stop()

    def sessions_view(self) -> SessionsView:
        return self.sessions.view()

    def slot_guard(self, slot_id: int) -> contextlib.AbstractAsyncContextManager[None]:
        """A client's slot action runs under a lease of that very slot, after which the table no longer claims to
        know its content."""
        return self.sessions.slot_guard(slot_id)

    async def on_request(self, req: ProxyRequest) -> None:
        svc = self.sessions
        await svc.ensure_ready()
        if req.kind == "completion" and is_batch(req.body.get("prompt")):
            await self._whole_server(req)
            return
        if req.kind != "chat":
            await self._anonymous(req)
            return
        # a header, else the name the client's dialect carries in the body (Anthropic metadata.user_id, Responses
        # prompt_cache_key)
        explicit = next((req.headers[h] for h in SESSION_HEADERS if req.headers.get(h)), None) \
            or (req.dialect.session_name(req.body) if req.dialect is not None else None)
        messages = list(req.messages)
        t_wait = time.monotonic()
        req.progress = "waiting for a llama-server slot"
        owner = svc.owner(req.headers)
        forwarded_by = req.forwarded_by  # verified by the server (sessions/cluster.py: signed by a node)
        if req.forward_failed is not None:  # the holder did not answer: take over here
            svc.forward_failed(req.forward_node or req.forward_failed)
            req.forward_node = None
        try:
            seed = await svc.seed(explicit, owner)
            found = await svc.find_and_lease(seed, explicit is not None, owner, messages, len(req.raw_body),
                                             forwarded_by, may_forward=req.forward_failed is None)
        except StoreError:  # the index is unreadable (counted by the service): serve this request whole, unsaved
            req.response_headers[DEGRADED_HEADER] = "session index unavailable; served without a session"
            await self._anonymous(req)
            return
        record, matched, hashes, lease = found.record, found.matched, found.hashes, found.lease
        if found.turn is not None:
            req.turn_lease = found.turn
        if lease is None:  # another live node holds the session (its slot is warm): the server forwards the turn
            assert found.forward is not None and svc.node_id is not None
            req.forward_node, req.forward_to = found.forward
            req.response_headers[VIA_HEADER] = svc.node_id
            req.log_fields.update({"session": record.id[:8], "forwarded_to": req.forward_to})
            return
        taken_from = None
        if svc.node_id is not None:
            taken_from = await svc.claim(record.id, forwarded_by)
            req.response_headers[NODE_HEADER] = svc.node_id
            if taken_from is not None:
                req.response_headers[TAKEOVER_HEADER] = taken_from
        queue_ms = round((time.monotonic() - t_wait) * 1000, 2)
        req.log_fields["queue_ms"] = queue_ms
        served = [served_version(c, s) for c, s in zip(messages[:matched], record.served)] + messages[matched:]
        ctx = SessionContext(record, lease, matched, hashes, served, "miss", 0, traces=TurnTraces(record.turns + 1),
                             queue_ms=queue_ms)
        req.session = ctx
        served_hashes = _hashes(served, messages, hashes)  # a message served as sent: the lookup's hash
        ctx.hashed = (served, served_hashes)  # on_response reuses them for the messages left unchanged
        req.progress = "restoring the session" if not lease.resident else "checking the slot"
        prepared = await svc.prepare(lease, seed, served_hashes, owner, found.prefetched,
                                     taken_over=taken_from is not None)
        ctx.cache, ctx.expected_cached = prepared.cache, prepared.expected
        if prepared.cold:  # --cache-isolation could not erase another credential's slot
            req.set_field("cache_prompt", False)
        if served[:matched] != messages[:matched]:
            req.set_messages(served)
        _pin(req, prepared.pin)
        req.response_headers.update({
            "X-PFlash-Session": record.id,
            "X-PFlash-Slot": str(lease.slot.id),
            "X-PFlash-Cache": ctx.cache,
            "X-PFlash-Cached-Tokens": str(ctx.expected_cached),
        })
        if lease.reason is not None:
            req.response_headers[CACHE_REASON_HEADER] = lease.reason
        # a whole answer's headers say what the engine reused (its cache report), not what the proxy expected
        req.on_answer.append(lambda answer: self._answer_headers(req, ctx, answer))
        req.log_fields.update({"session": record.id[:8], "slot": lease.slot.id, "cache": ctx.cache})

    async def _whole_server(self, req: ProxyRequest) -> None:
        """A batch (``prompt`` holds several prompts) runs one task per prompt on slots the engine picks, so it
        is not pinned: it leases every slot and leaves every slot unknown to the table afterwards."""
        leases, cold = await self.sessions.lease_all(self.sessions.owner(req.headers))
        if cold:
            req.set_field("cache_prompt", False)
        req.session = SessionContext(None, leases[0], 0, [], [], "miss", 0, batch=leases)
        req.response_headers["X-PFlash-Slot"] = "all"

    async def _anonymous(self, req: ProxyRequest) -> None:
        """A lease of its own for a request without a session (completion routes, an unusable index)."""
        svc = self.sessions
        t_wait = time.monotonic()
        req.progress = "waiting for a llama-server slot"
        lease = await svc.lease_anonymous()
        queue_ms = round((time.monotonic() - t_wait) * 1000, 2)
        req.log_fields["queue_ms"] = queue_ms
        req.session = SessionContext(None, lease, 0, [], [], "miss", 0, queue_ms=queue_ms)
        prepared = await svc.prepare_anonymous(lease, svc.owner(req.headers))
        if prepared.cold:
            req.set_field("cache_prompt", False)
        _pin(req, prepared.pin)
        req.response_headers["X-PFlash-Slot"] = str(lease.slot.id)

    async def _end_turn(self, req: ProxyRequest) -> None:
        turn, req.turn_lease = req.turn_lease, None
        if turn is not None:
            await self.sessions.end_turn(turn)

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        ctx = req.session
        if ctx is None or ctx.batch is not None:
            return
        ctx.settled = result.completed and not result.client_gone
        served_hashes = _hashes(ctx.served, *ctx.hashed)
        report = SlotReport.of(result.status, self.engine.cache_report(result.final_json))
        cached = self.sessions.observe(ctx.lease, ctx.cache, ctx.expected_cached, served_hashes, report)
        if cached is None:
            return
        reported, reason = self.sessions.report(ctx.cache, ctx.expected_cached, cached)
        req.log_fields.update({"cache": reported, "cached_tokens": cached})
        if reported == ctx.cache or ctx.record is None:
            return
        req.log_fields["cache_announced"] = ctx.cache
        log.log(logging.INFO if reported == "hit-prefix" else logging.WARNING,
                "session %s: announced %s (~%d tokens expected from cache), llama-server reused %d: reported %s",
                ctx.record.id[:8], ctx.cache, ctx.expected_cached, cached, reported)
        record_cache(ctx.traces, len(ctx.served) - 1, ctx.cache, reported, ctx.expected_cached, cached, reason)

    def _answer_headers(self, req: ProxyRequest, ctx: SessionContext, answer: Mapping[str, object] | None) -> None:
        """``X-PFlash-Cache`` / ``-Cached-Tokens`` of a whole answer from its own cache report."""
        report = self.engine.cache_report(answer)
        if report is None:
            return
        reported, reason = self.sessions.report(ctx.cache, ctx.expected_cached, report.cached_tokens, count=False)
        req.response_headers["X-PFlash-Cache"] = reported
        req.response_headers["X-PFlash-Cached-Tokens"] = str(report.cached_tokens)
        if reason is not None:
            req.response_headers[CACHE_REASON_HEADER] = reason

    async def on_finish(self, req: ProxyRequest) -> None:
        await self._end_turn(req)
        ctx = req.session
        if ctx is None:
            return
        if ctx.batch is not None:
            for lease in ctx.batch:
                self.sessions.release_unknown(lease)
            return
        # the client left, or the upstream broke: the engine may still work on the slot
        busy = ctx.forwarded and not ctx.settled
        self.sessions.finish(ctx.lease, ctx.record.id if ctx.record is not None else None, busy)

    async def save_all(self) -> int:
        return await self.sessions.save_all()

    def stats(self) -> JSONPart:
        return JSONPart(self.sessions.stats())


def is_batch(prompt: object) -> bool:
    """llama-server's rule: a list holding strings or token lists is several prompts (a flat token list is one)."""
    return isinstance(prompt, list) and len(prompt) > 1 and any(isinstance(p, (str, list, dict)) for p in prompt)


def served_version(client: Message, stored: Mapping[str, object]) -> Message:
    """The client's message with only what the proxy rewrote (its content) taken from the served history.

    Identity hashes role, content, tool calls, tool id and name; any other field (``reasoning_content``,
    provider extras) comes from this client, never from whichever client first served the same visible history.
    """
    if client == stored or stored.get("content") == client.get("content"):
        return client
    return {**client, "content": stored.get("content")}


def _hashes(messages: list[Message], before: list[Message], hashes: list[str]) -> list[str]:
    """``message_hash`` of each message, taken from ``hashes`` where the message equals the one at its position
    in ``before`` (the served history hashed before compression, most of which compression leaves alone)."""
    return [hashes[i] if i < len(before) and (m is before[i] or m == before[i]) else message_hash(m)
            for i, m in enumerate(messages)]


class SessionCommitStage(Stage):
    """Persist the served history (after every stage that may change it): the write starts before the request is
    forwarded and runs beside it; the answer's headers, and the lease's release, wait for it."""

    name = "sessions-commit"

    def __init__(self, sessions: SessionService):
        self.sessions = sessions

    async def on_request(self, req: ProxyRequest) -> None:
        ctx = req.session
        if ctx is not None:
            ctx.forwarded = True  # the last stage: the request goes upstream next
        if ctx is None or ctx.record is None:
            return
        ctx.served = list(req.messages)
        # the write runs while the upstream works; the answer's headers wait for it (``settle``)
        kept = self.sessions.commit(ctx.record, ctx.client_hashes, ctx.served, len(req.raw_body))
        req.beside_upstream.append(self._committed(req, kept))

    async def _committed(self, req: ProxyRequest, kept: Awaitable[bool]) -> None:
        if not await kept:  # disk full, damaged index: the request is served, the history not kept
            req.response_headers[DEGRADED_HEADER] = "session index unavailable; this turn was not saved"
