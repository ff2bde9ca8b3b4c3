"""HTTP handlers: the parsed completion routes, the transparent catch-all, and ``/pflash/*``.

- ``passthrough`` forwards every method and path the proxy does not handle itself (query string, body and
  end-to-end headers unchanged) and relays the answer as it arrives.
- ``parsed`` handles the completion routes and every dialect's conversation routes: the body as
  ``bodies.read_body`` reads it, JSON and the typed model or the dialect's conversation (400 in the client's
  dialect; a body of 1 MiB or more is parsed in a worker thread), the stage pipeline, then the relay (a dialect
  sent to another route is translated back as it streams). Untouched bodies are forwarded byte for byte; a
  client's own slot pin must be an integer (400). A turn another node holds is forwarded there
  (``peers.PeerNode``). For a base model the proxy spawned, a translated request's ``max_tokens`` above the
  server's cap is lowered to it (``X-PFlash-Turn-Cap: N``).
- ``slot_action``: a client's own slot action is refused (403) unless ``--allow-slot-actions``; then its slot must
  be a decimal integer (400) and the action runs under a lease of that slot.
- Every request ends with one access-log line (a client that left first is logged and counted as 499); a whole
  answer is written once the stages' ``on_response`` and ``on_finish`` ran (``send_whole``), so the client's next
  turn finds the slot released.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from pydantic import BaseModel

from pflash_proxy.dialects import Dialect, cap_turn, check_tool_arguments, holds_surrogate, is_int
from pflash_proxy.config import Settings
from pflash_proxy.dialects.registry import dialect_for, dialect_paths, stream_style_for
from pflash_proxy.engine import Engine
from pflash_proxy.errors import (BadRequest, ProxyError, UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable,
                                 error_body, error_response)
from pflash_proxy.inspector.routes import guarded
from pflash_proxy.models import ChatCompletionRequest, CompletionRequest, ValidationError
from pflash_proxy.server.bodies import BODY_HELD, read_body as read_bounded
from pflash_proxy.server.control import index, pflash_metrics, pflash_save, pflash_stats, upstream_serves_root
from pflash_proxy.server.keys import (BODIES, ENGINE, HOLDER_NONCE, METRICS, PEERS, PIPELINE, PROOF_PATH, SESSIONS,
                                     SETTINGS, UPSTREAM, proof)
from pflash_proxy.server.peers import PeerNode
from pflash_proxy.contract import Dialogue, ProxyRequest, RelayResult, RouteKind
from pflash_proxy.headers import FORWARDED_HEADER, PREFIX, TURN_CAP_HEADER, VIA_HEADER
from pflash_proxy.server.relay import DRAINED, SENT_STATUS, _client_gone, relay, write_stream_error
from pflash_proxy.sessions.cluster import sign_forward, verify_forward
from pflash_proxy.sessions.slots import NO_CREDENTIAL
from pflash_proxy.llama.api import CLIENT_SLOT_ROUTE, SLOTS_ROUTE
from pflash_proxy.llama.upstream import forwardable_headers

if TYPE_CHECKING:
    from pflash_proxy.dialects import StreamStyle
    from pflash_proxy.contract import Pipeline

log = logging.getLogger("pflash_proxy.access")

PARSE_OFF_LOOP_BYTES = 1 << 20
HOLDER_PATH = PROOF_PATH  # wrap's check of the URL a lock file names (cli/home.py)
PROBE_PATHS = ("/health", "/v1/health")  # answered at once, never held while llama-server (re)starts  # bodies from 1 MiB up are parsed and validated in a worker thread
COMPLETION_PATHS = ("/v1/completions", "/completions", "/completion")
# Routes that make llama-server decode in a slot but that the proxy does not parse (yet): each still gets a slot
# lease and its pin, so nothing ever lands on a slot the table believes holds a session.
GENERATING_PATHS = ("/infill", "/embedding", "/embeddings",
                    "/v1/embeddings", "/rerank", "/v1/rerank", "/reranking", "/v1/reranking")


async def read_body(request: web.Request) -> bytes:
    """The body, bounded in size, in bytes held across requests and in time (``server/bodies.py``)."""
    limits = request.app[SETTINGS].limits
    return await read_bounded(request, request.app[BODIES], limits.max_body_bytes, limits.body_timeout_s)


def _path_qs(request: web.Request) -> str:
    return request.rel_url.raw_path_qs if hasattr(request.rel_url, "raw_path_qs") else str(request.rel_url)


async def root(request: web.Request) -> web.StreamResponse:
    """``GET /``: llama-server's web UI where it serves one, else the proxy's index (``control.index``)."""
    if await upstream_serves_root(request):
        return await passthrough(request)
    return await index(request)


async def passthrough(request: web.Request) -> web.StreamResponse:
    return await _passthrough(request)


async def _passthrough(request: web.Request, translate: SlotsFilter | None = None) -> web.StreamResponse:
    started = time.monotonic()
    result: RelayResult | None = None
    status = 500
    try:
        body = await read_body(request)
        upstream = request.app[UPSTREAM]
        t0 = time.monotonic()
        headers = forwardable_headers(request.headers)
        if translate is not None:  # the answer is rewritten: it must come uncompressed
            pairs = headers.items() if isinstance(headers, dict) else headers
            headers = [(k, v) for k, v in pairs if k.lower() != "accept-encoding"]
        up = await upstream.open(request.method, _path_qs(request), headers, body or None,
                                 wait=request.path not in PROBE_PATHS)
        resp, result = await relay(request, up, style=stream_style_for(request.path), translate=translate)
        result.upstream_ms = round((time.monotonic() - t0) * 1000, 2)
        status = result.status
        await send_whole(request, resp)
        return resp
    except ProxyError as exc:
        status = exc.status
        return exc.response()
    finally:
        _observe(request, status, started, result, None)
        _access_log(request, status, started, result, {})


class SlotsFilter:
    """A client's ``GET /slots`` under ``--cache-isolation credential``: a slot whose content the proxy knows to
    be the requester's own (its credential's) is shown whole; every other one only as ``SLOT_PUBLIC`` (no prompt
    length, task, tokens or sampling settings of another credential's request). A body that is not the JSON list
    llama-server answers is replaced by an empty list (an error status passes as it is)."""

    SLOT_PUBLIC = ("id", "n_ctx", "is_processing", "speculative")

    def __init__(self, own: set[int]):
        self.own = own

    def body(self, status: int, raw: bytes) -> bytes:
        if status != 200:
            return raw
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            data = None
        if not isinstance(data, list):
            return b"[]"
        return json.dumps([s if s.get("id") in self.own else {k: s[k] for k in self.SLOT_PUBLIC if k in s}
                           for s in data if isinstance(s, dict)]).encode()

    def stream(self, chunk: bytes) -> bytes:
        return chunk

    def end(self) -> bytes:
        return b""


async def slots_listing(request: web.Request) -> web.StreamResponse:
    """``GET /slots``: llama-server's answer, filtered by ``SlotsFilter`` when credentials are isolated (the
    sessions stage knows whose content each slot holds); as it is otherwise."""
    if request.app[SETTINGS].sessions.cache_isolation != "credential":
        return await _passthrough(request)
    sessions = request.app[SESSIONS]
    if sessions is None:  # no sessions: the proxy knows no slot's owner, and shows none's details
        return await _passthrough(request, SlotsFilter(set()))
    owner = sessions.owner(request.headers)
    key = owner if owner is not None else NO_CREDENTIAL
    own = {slot.id for slot in sessions.view().slots() if slot.owner == key}
    return await _passthrough(request, SlotsFilter(own))


def check_strings(body: object) -> None:
    """JSON may escape a lone surrogate (``"\\ud800"``); no UTF-8 text can hold one, so the request is refused
    here rather than failing later in hashing, tokenizing or forwarding."""
    if holds_surrogate(body):
        raise BadRequest("invalid request: a string holds a lone UTF-16 surrogate escape (e.g. \\ud800)",
                         code="invalid_request")


# a lone surrogate reaches a parsed string only through a ``\uD800``-``\uDFFF`` escape or, since ``json.loads``
# decodes bytes with ``surrogatepass``, as its UTF-8 form (ED A0-BF ..)
_SURROGATE_SIGN = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def may_hold_surrogate(raw: bytes) -> bool:
    """False when no string of this UTF-8 body can hold a surrogate (then ``check_strings`` need not walk it);
    True for anything else, a body in UTF-16/32 (``json.loads`` detects those) included."""
    if raw[:3] == b"\xef\xbb\xbf" or b"\x00" in raw[:4]:  # a BOM or UTF-16/32: leave it to the walk
        return True
    return _SURROGATE_SIGN.search(raw) is not None


async def run_with_progress(request: web.Request, req: ProxyRequest, pipeline: Pipeline, interval: float
                            ) -> web.StreamResponse | None:
    """Run the stages; while they take long (a slot wait, a compression, a drafter pass), a streaming client gets
    SSE comment lines (``: pflash compressing 12,345 tokens``) every ``interval`` seconds, so agents with read
    timeouts keep waiting. Returns the already started stream (status 200, the headers known so far), or None
    when the stages finished before the first comment was due (the usual case: nothing changes)."""
    if not req.stream or interval <= 0:  # nobody to keep alive: the stages run in this task
        await pipeline.run_request(req)
        return None
    task = asyncio.ensure_future(pipeline.run_request(req))
    resp: web.StreamResponse | None = req.relay.stream  # a second run (a forward that failed)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=min(2.0, interval) if resp is None else interval)
            if done:
                break
            if resp is None:
                resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                               "Cache-Control": "no-cache", **req.response_headers})
                await resp.prepare(request)
                request[SENT_STATUS] = resp.status
                req.relay.stream = resp
            await resp.write(f": pflash {req.relay.progress}\n\n".encode())
    except BaseException:
        task.cancel()  # the client left while waiting: stop the stages too (finish() releases the lease)
        raise
    task.result()  # a stage's ProxyError surfaces here
    if resp is not None:  # headers decided after the stream started travel as one last comment
        late = {k: v for k, v in req.response_headers.items() if k.startswith(PREFIX)}
        await resp.write((": pflash " + " ".join(f"{k}={v}" for k, v in late.items()) + "\n\n").encode())
    return resp


async def parsed(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    app = request.app
    pipeline = app[PIPELINE]
    result: RelayResult | None = None
    status = 500
    req: ProxyRequest | None = None
    dialect = dialect_for(request.path)
    style = stream_style_for(request.path)
    try:
        raw = await read_body(request)
        if len(raw) >= PARSE_OFF_LOOP_BYTES:  # a large body is parsed in a worker thread: the loop never stalls
            req = await asyncio.get_running_loop().run_in_executor(None, parse_request, request, raw, dialect,
                                                                   app[SETTINGS], app[ENGINE])
        else:
            req = parse_request(request, raw, dialect, app[SETTINGS], app[ENGINE])
        try:
            prepared = await run_with_progress(request, req, pipeline, app[SETTINGS].limits.progress_interval_s)
            if req.forward.to is not None:  # another node holds the session (sessions/cluster.py)
                forwarded = await forward_to_node(request, req, style, prepared)
                if forwarded is not None:
                    resp, result = forwarded
                    status = result.status
                    return resp
                await pipeline.finish(req)  # that node is gone: the stages run again and serve it here
                prepared = await run_with_progress(request, req, pipeline, app[SETTINGS].limits.progress_interval_s)
        except ProxyError as exc:
            if req.relay.stream is None:
                raise
            status = exc.status  # the stream already started: the error travels as an event of it
            await write_stream_error(req.relay.stream, error_body(exc.status, exc.message, exc.code),
                                     style)
            return req.relay.stream
        upstream, engine = app[UPSTREAM], app[ENGINE]
        path_qs, payload, translate = req.path_qs, req.forward_bytes(), None
        if dialect is not None and dialect.upstream_path:  # sent as another route, answered in the client's dialect
            body = dialect.to_upstream(req.body, req.messages)
            body.update(pin_of(engine, req.body))  # the slot the stages (or the client) pinned the request to
            capped = cap_turn(body, upstream.turn_cap)  # a spawned base model (llama/spawn.py: its turn cap)
            if capped:
                req.response_headers[TURN_CAP_HEADER] = str(upstream.turn_cap)
            path_qs, translate = dialect.upstream_path, dialect.translator(engine.cache_report, turn_capped=capped)
            payload = json.dumps(body, ensure_ascii=False).encode()
        t0 = time.monotonic()
        headers = forwardable_headers(request.headers)
        up = await upstream.open(request.method, path_qs, headers, payload)
        try:
            await req.settle()  # the history commit ran beside the upstream request; its header goes out too
        except BaseException:
            up.release()
            raise

        async def send_again() -> aiohttp.ClientResponse:  # a stream lost before its answer began (relay's resend)
            return await upstream.open(request.method, path_qs, headers, payload)
        resp, result = await relay(request, up, extra_headers=req.response_headers, style=style, prepared=prepared,
                                   translate=translate, on_answer=req.relay.on_answer, markers=engine.report_markers,
                                   resend=send_again)
        result.upstream_ms = round((time.monotonic() - t0) * 1000, 2)
        status = result.status
        await pipeline.run_response(req, result)
        await pipeline.finish(req)
        await send_whole(request, resp)
        return resp
    except ProxyError as exc:
        status = exc.status
        started_stream = req.relay.stream if req is not None else None
        if started_stream is not None:  # e.g. the upstream went away after progress comments were sent
            await write_stream_error(started_stream, error_body(exc.status, exc.message, exc.code), style)
            return started_stream
        headers = {**(req.response_headers if req is not None else {}), **exc.headers}
        if dialect is not None:  # the client's own error dialect (Anthropic clients parse only theirs)
            return dialect.error_response(exc.status, exc.message, exc.code, headers=headers or None)
        return error_response(exc.status, exc.message, exc.code, headers=headers or None)
    finally:
        if req is not None:
            await pipeline.finish(req)
        _observe(request, status, started, result, req)
        _access_log(request, status, started, result, req.log_fields if req is not None else {})


async def send_whole(request: web.Request, resp: web.StreamResponse) -> None:
    """Write a whole answer the relay built but did not send (before the metrics and the log line).
    aiohttp sends nothing twice: the handler still returns ``resp``. A client that left meanwhile is the relay's
    case of a client gone after the answer was complete: nothing to do."""
    if resp.prepared:
        return
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionResetError:
        log.debug("client of %s %s left before its answer was written", request.method, request.path)


async def forward_to_node(request: web.Request, req: ProxyRequest, style: StreamStyle, prepared: web.StreamResponse | None
                          ) -> tuple[web.StreamResponse, RelayResult] | None:
    """Send the client's own request (its bytes, path and headers) to the node named by ``req.forward.to`` and
    relay its answer; None when that node could not be reached (``req.forward.failed`` says which, and
    ``forward.to`` is cleared so that the stages serve the request here)."""
    url = req.forward.to or ""
    peers = request.app[PEERS]
    peer = peers.get(url)
    if peer is None:
        settings = request.app[SETTINGS]
        peer = PeerNode(url, read_timeout_s=settings.upstream.upstream_timeout_s + settings.limits.queue_timeout_s)
        await peer.start()
        peers[url] = peer
    via = req.response_headers.get(VIA_HEADER, "")
    secret = request.app[SETTINGS].cluster.cluster_secret
    mark = sign_forward(secret, via, request.method, req.path_qs, req.raw_body, time.time()) if secret and via \
        else via or "1"  # without a secret the receiver honours no mark: it finds itself the holder and serves
    headers = [*forwardable_headers(request.headers), (FORWARDED_HEADER, mark)]
    t0 = time.monotonic()
    try:
        up = await peer.open(request.method, req.path_qs, headers, req.raw_body)
    except (UpstreamUnavailable, UpstreamTimeout, UpstreamNotReady) as exc:
        log.warning("node %s unreachable for a forwarded turn (%s); serving it here", url, exc)
        req.forward.failed, req.forward.to = url, None
        req.response_headers.pop(VIA_HEADER, None)  # served here after all
        return None
    req.log_fields["forwarded_to"] = url
    resp, result = await relay(request, up, extra_headers={VIA_HEADER: via} if via else None, style=style,
                               prepared=prepared)
    result.upstream_ms = round((time.monotonic() - t0) * 1000, 2)
    return resp, result


async def close_peers(app: web.Application) -> None:
    for peer in app[PEERS].values():
        await peer.close()


def pin_of(engine: Engine, body: Mapping[str, object]) -> dict[str, object]:
    """The fields of ``body`` that pin it to a slot of ``engine`` (none without slots)."""
    slots = engine.slots
    if slots is None:
        return {}
    kept = slots.unpin(body)
    return {k: v for k, v in body.items() if k not in kept} if len(kept) != len(body) else {}


def check_pin(engine: Engine, body: Mapping[str, object]) -> None:
    """A slot pin the client sent itself must be an integer (400, before llama-server would fail on it)."""
    for key, value in pin_of(engine, body).items():
        if value is not None and not is_int(value):
            raise BadRequest(f"invalid request: {key}: must be an integer", code="invalid_request")


def parse_request(request: web.Request, raw: bytes, dialect: Dialect | None, settings: Settings,
                  engine: Engine) -> ProxyRequest:
    """The body as JSON (400 otherwise), checked, typed and, on the conversation routes, translated into the
    internal conversation by the route's dialect."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError:
        raise BadRequest("request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    if may_hold_surrogate(raw):
        check_strings(body)
    check_pin(engine, body)
    kind: RouteKind = "chat" if dialect is not None else "completion" if request.path in COMPLETION_PATHS else "generating"
    model: BaseModel | None = None
    try:
        if dialect is not None and dialect.name == "chat":
            model = ChatCompletionRequest.model_validate(body)
        elif kind == "completion":
            model = CompletionRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BadRequest(f"invalid request: {where}: {err['msg']}", code="invalid_request") from exc
    cleaned = dialect.prepare(body, settings.sessions.drop_volatile_lines) if dialect is not None else None
    req = ProxyRequest(kind, request.method, _path_qs(request), request.headers, raw, cleaned or body, model)
    forwarded = request.headers.getall(FORWARDED_HEADER, [])
    if forwarded:  # another node's turn, when it is signed with the shared secret; a client's own is ignored
        req.forward.by = verify_forward(settings.cluster.cluster_secret, forwarded, request.method, req.path_qs, raw,
                                        time.time())
        if req.forward.by is None:
            log.warning("ignoring an %s header that is not signed by a cluster node", FORWARDED_HEADER)
    if cleaned is not None:
        req.changed = True  # forwarded without the volatile lines
        req.log_fields["volatile_dropped"] = True
    if dialect is not None:
        conversation = dialect.parse(req.body)
        check_tool_arguments(conversation.messages)  # JSON inside strings that the session identity parses
        req.dialogue = Dialogue(dialect, conversation, req.body)
    return req


CLIENT_CLOSED = 499  # nginx's status for a request whose client left before it was answered


def _final(request: web.Request, status: int) -> int:
    """The status a request is counted and logged with: a request that ended without an answer (the handler
    cancelled, or an error about to be answered) because its client left is 499, not 500; one whose answer's
    headers the client already got (a stream the shutdown's drain ended with an error event) is that answer's."""
    if status != 500:
        return status
    sent = request.get(SENT_STATUS)
    if sent is not None and request.get(DRAINED):
        return sent
    if _client_gone(request):
        return CLIENT_CLOSED
    return sent if sent is not None else status


def _observe(request: web.Request, status: int, started: float, result: RelayResult | None,
             req: ProxyRequest | None) -> None:
    status = _final(request, status)
    first = result.first_chunk_at - started if result is not None and result.first_chunk_at is not None else None
    queue_ms = req.notes.session.turn.queue_ms if req is not None and req.notes.session is not None else None
    request.app[METRICS].observe_request(request.path, status, time.monotonic() - started,
                                         first if first is not None and first >= 0 else None, queue_ms,
                                         req.notes.compression if req is not None else None)


def _access_log(request: web.Request, status: int, started: float, result: RelayResult | None, extra: dict) -> None:
    status = _final(request, status)
    fields = {
        "method": request.method,
        "path": request.path,
        "status": status,
        "ms": round((time.monotonic() - started) * 1000, 2),
        "upstream_ms": result.upstream_ms if result else None,
        "bytes": result.bytes_out if result else 0,
    }
    if request.get(DRAINED):
        fields["drained"] = True  # the shutdown's drain ended it with an error event (relay.py)
    elif (result is not None and result.client_gone) or status == CLIENT_CLOSED:
        fields["client_gone"] = True
    if result is not None and result.upstream_failed:
        fields["upstream_failed"] = result.upstream_failed
    if result is not None and result.resent:
        fields["resent"] = True  # lost before its answer began, and sent again (relay's resend)
    fields.update(extra)
    log.info("%s %s %s", request.method, request.path, status, extra={"fields": fields})


def add_routes(app: web.Application) -> None:
    for path in dialect_paths() + COMPLETION_PATHS + GENERATING_PATHS:  # dialects: parsed into the conversation
        app.router.add_post(path, parsed)
    app.router.add_post(CLIENT_SLOT_ROUTE, slot_action)
    app.router.add_get("/pflash/stats", guarded(pflash_stats))  # the inspector's rule: it names sessions and slots
    app.router.add_get("/pflash/metrics", pflash_metrics)  # counts only: open to scrapers (Host-checked, gate.py)
    app.router.add_post("/pflash/save", guarded(pflash_save))
    app.router.add_get(HOLDER_PATH, holder_proof)
    app.router.add_get(SLOTS_ROUTE, slots_listing)
    app.router.add_get("/", root)
    app.router.add_route("*", "/{tail:.*}", passthrough)



async def holder_proof(request: web.Request) -> web.StreamResponse:
    """``GET /pflash/holder?challenge=HEX``: this proxy's proof that it holds the state directory's lock, the
    HMAC of the challenge under the nonce it wrote into ``serve.lock`` (``cli/home.py``), so that ``wrap``
    uses the URL a lock file names only when the proxy that wrote it answers there. 404 when this process wrote
    no nonce (an app not started by ``serve``); 400 for a challenge that is not 16 to 128 hex digits."""
    nonce = request.app.get(HOLDER_NONCE)
    if not nonce:
        return error_response(404, "this proxy holds no state directory lock", "not_found")
    challenge = request.query.get("challenge", "")
    if not (16 <= len(challenge) <= 128 and all(c in "0123456789abcdef" for c in challenge)):
        return error_response(400, "challenge: 16 to 128 lowercase hex digits", "invalid_request")
    return web.json_response({"proof": proof(nonce, challenge)})


async def slot_action(request: web.Request) -> web.StreamResponse:
    """Clients' slot actions overwrite what the proxy keeps in a slot: refused (403) unless allowed, and then
    run under a lease of that very slot, after which the table no longer claims to know its content."""
    if not request.app[SETTINGS].sessions.allow_slot_actions:
        return error_response(403, "slot actions are reserved to the proxy, which manages the slots' contents "
                                   "(start it with --allow-slot-actions to pass them through)", "slot_actions_refused",
                              "permission_error")
    slot = request.match_info["slot"]
    if not (slot.isascii() and slot.isdigit()):  # int() would take " 1", "1_0", "+1" or "١"; llama-server's stoi
        return error_response(400, f"slot id {slot[:40]!r} is not a plain integer", "invalid_slot_id")
    slot_id = int(slot)
    sessions = request.app[SESSIONS]
    if sessions is None:
        return await passthrough(request)
    async with sessions.slot_guard(slot_id):
        return await passthrough(request)


def error_middleware_factory():
    @web.middleware
    async def errors(request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                return error_response(exc.status, exc.reason or "error")
            raise
        except ProxyError as exc:
            return exc.response()
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            dialect = dialect_for(request.path)  # Anthropic clients parse only their own error shape
            if dialect is not None:
                return dialect.error_response(500, "internal proxy error", "internal_error")
            return error_response(500, "internal proxy error", "internal_error")
        finally:  # the request's body no longer counts against --max-pending-mb
            request.app[BODIES].release(request.get(BODY_HELD, 0))

    return errors
