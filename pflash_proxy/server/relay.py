"""Relay an upstream response to the client as it arrives.

Status and end-to-end headers are copied (hop-by-hop ones dropped), the stages' ``X-PFlash-*`` headers added.
Each chunk is written to the client as it is read (``iter_any``), so SSE events reach the client when llama-server
emits them. A watcher polls the client's transport every 100 ms: when the client has gone, the upstream response
is closed, not released to the pool, so llama-server sees the disconnect and stops generating.

SSE is relayed event by event. If the upstream dies mid-stream the unfinished event is dropped and an SSE client
gets a final ``data: {"error": ...}`` event (and ``[DONE]`` on OpenAI routes); other clients get the stream cut,
as a direct client would. The resend: until the first event of the answer itself (headers, comments,
``prompt_progress`` events and a chat stream's role-only first chunk carry none), nothing of the answer has reached
the client, so when the upstream dies then and ``resend`` is given, the request is sent again, once, into the same
response (``RelayResult.resent``); an error answer to it becomes the stream's error event.

The last JSON event that carries the engine's cache report (``Engine.report_markers``), or the whole body when it
is small JSON, is kept for the stages (``Engine.cache_report``) without buffering the stream.
"""

from __future__ import annotations

import asyncio
import re
import time
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import aiohttp
from aiohttp import web

from multidict import CIMultiDict

from pflash_proxy.contract import RelayResult
from pflash_proxy.dialects import JsonObject, StreamStyle, Translator
from pflash_proxy.jsontypes import JSONObject
from pflash_proxy.errors import ProxyError, UpstreamUnavailable, error_body
from pflash_proxy.server.keys import STREAMS
from pflash_proxy.llama.upstream import HOP_BY_HOP

log = logging.getLogger("pflash_proxy.relay")

_MAX_SNIFF_BYTES = 4 * 1024 * 1024  # non-streamed JSON bodies up to this size are parsed for usage/timings


PLAIN_STREAM = StreamStyle()
SENT_STATUS = web.RequestKey("sent_status", int)  # the status of the answer whose headers the client got
DRAINED = web.RequestKey("drained", bool)  # the shutdown's drain ended this stream with its last error event


class _SSETail:
    """Keeps the last complete ``data: {json}`` event that carries one of ``markers`` (the engine's
    ``report_markers``)."""

    def __init__(self, markers: tuple[bytes, ...]) -> None:
        self._buf = b""
        self.last: JSONObject | None = None  # the last JSON object that carried a report marker
        self.markers = markers

    def _marked(self, data: bytes) -> bool:
        for m in self.markers:
            if m in data:
                return True
        return False

    def feed(self, chunk: bytes) -> None:
        if not self._buf and chunk.endswith(b"\n\n") and not self._marked(chunk):
            return  # whole events, none of them one to keep (most of a stream): nothing to split or parse
        self._buf += chunk
        if b"\n\n" not in self._buf:
            if len(self._buf) > _MAX_SNIFF_BYTES:  # pathological: an event without an end
                self._buf = b""
            return
        events, self._buf = self._buf.rsplit(b"\n\n", 1)
        for event in events.split(b"\n\n"):
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload.startswith(b"{") and self._marked(payload):
                        try:
                            self.last = json.loads(payload)
                        except ValueError:
                            pass


def response_headers(upstream: aiohttp.ClientResponse) -> list[tuple[str, str]]:
    return [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP]


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    extra_headers: dict[str, str] | None = None,
    style: StreamStyle = PLAIN_STREAM,
    prepared: web.StreamResponse | None = None,
    translate: Translator | None = None,
    on_answer: list[Callable[[dict[str, Any] | None], None]] | None = None,
    markers: tuple[bytes, ...] = (),
    resend: Callable[[], Awaitable[aiohttp.ClientResponse]] | None = None,
) -> tuple[web.StreamResponse, RelayResult]:
    """Relay ``upstream`` to the client as it arrives. ``translate`` (a dialect's translator) rewrites a whole
    answer (``body``) or each run of complete SSE events (``stream``, then ``end``) into the client's dialect;
    ``final_json`` is always the upstream's own (its cache report). ``on_answer``: called with a whole answer's
    ``final_json`` before its headers (``extra_headers``, which they may change) are written. ``markers``: the
    engine's ``report_markers``; a stream's last event with one is its ``final_json`` (none, as on the transparent
    routes, whose answers no stage reads: nothing is parsed, ``final_json`` stays None). ``resend``: sends the
    request again, for a stream whose upstream died before the first event of its answer (the resend)."""
    result = RelayResult(status=upstream.status)
    ctype = upstream.headers.get("Content-Type", "")
    is_sse = ctype.startswith("text/event-stream")
    if prepared is not None and not is_sse:
        return await _error_into_started(upstream, prepared, result, style)
    if prepared is not None:  # the client's stream already started (progress comments): relay the events into it
        resp = prepared
    elif not is_sse and (translate is not None or (upstream.content_length is not None
                                                   and upstream.content_length <= _MAX_SNIFF_BYTES)):
        result.first_chunk_at = time.monotonic()  # a whole small answer: its headers are its first byte
        # parsed only for whom reads it: the stages (the engine's markers given) or a translator
        keep = bool(markers) or bool(on_answer)
        return await _relay_small(upstream, extra_headers, result, keep and "json" in ctype, translate, on_answer)
    else:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in response_headers(upstream):
            resp.headers.add(k, v)
        for k, v in (extra_headers or {}).items():
            resp.headers[k] = v
        if upstream.content_length is not None and "Content-Encoding" not in upstream.headers and translate is None:
            resp.content_length = upstream.content_length
    sniff_json = bool(markers) and not is_sse and "json" in ctype and (upstream.content_length or 0) <= _MAX_SNIFF_BYTES
    relayed = _StreamRelay(request, upstream, resp, result, is_sse=is_sse, sniff_json=sniff_json, style=style,
                           translate=translate, markers=markers, resend=resend)
    return await relayed.run()


class _StreamRelay:
    """One answer relayed to the client chunk by chunk into ``resp`` (``relay``'s streamed case): it writes
    events as they complete, decides a resend, and ends the stream normally, on an upstream error or cancelled.

    State: ``held`` (SSE: the bytes after the last complete event), ``pending`` (SSE: events that carry no answer,
    held until the first one that does), ``answered`` (an event of the answer itself reached the client: no resend
    from then on), ``watcher`` (closes ``upstream`` when the client leaves), ``tail`` / ``body_parts`` (what
    ``final_json`` is read from)."""

    def __init__(self, request: web.Request, upstream: aiohttp.ClientResponse, resp: web.StreamResponse,
                 result: RelayResult, *, is_sse: bool, sniff_json: bool, style: StreamStyle,
                 translate: Translator | None, markers: tuple[bytes, ...],
                 resend: Callable[[], Awaitable[aiohttp.ClientResponse]] | None) -> None:
        self.request, self.upstream, self.resp, self.result = request, upstream, resp, result
        self.is_sse, self.sniff_json, self.style, self.translate, self.resend = \
            is_sse, sniff_json, style, translate, resend
        self.tail = _SSETail(markers) if is_sse and markers else None
        self.body_parts: list[bytes] = []
        self.sniffed = 0  # bytes of a sizeless JSON answer seen so far
        self.held = b""  # SSE: bytes after the last complete event, written once the event is complete
        self.answered = not is_sse  # SSE: whether an event of the answer itself was relayed (the resend)
        self.pending: list[bytes] = []  # SSE: events that carry no answer, held until the first one that does
        self.watcher = asyncio.create_task(_watch_client(request, upstream))

    async def run(self) -> tuple[web.StreamResponse, RelayResult]:
        """Relay the answer (sending the request again once, when due), end the stream, let the upstream go."""
        request, result = self.request, self.result
        streams = request.app.get(STREAMS) if self.is_sse else None  # the shutdown ends these before its deadline
        task = asyncio.current_task()
        if streams is not None and task is not None:
            streams.add(task)
        try:
            await self.resp.prepare(request)
            request[SENT_STATUS] = self.resp.status
            while True:
                await self._relay_body()
                if not self._resend_due():
                    break
                sent = await self._send_again()
                if sent == "failed":
                    break
                if sent == "answered":  # an error answer, now the stream's last event
                    return self.resp, result
            if result.upstream_failed and not await self._end_on_upstream_failure():
                return self.resp, result
            if not result.client_gone:
                await self._end_normally()
        except asyncio.CancelledError:
            await self._end_cancelled()
            raise
        finally:
            if streams is not None:
                streams.discard(task)
            self._let_go()
        self._keep_final_json()
        return self.resp, result

    async def _relay_body(self) -> None:
        """Relay the current upstream's body to its end (``completed``), or until the client or the upstream
        fails (``client_gone`` / ``upstream_failed``)."""
        result = self.result
        try:
            async for chunk in self.upstream.content.iter_any():
                if result.first_chunk_at is None:
                    result.first_chunk_at = time.monotonic()  # the clock the routes time requests with
                await self._write(chunk)
            await self._write_rest()
            result.completed = True
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            if _client_gone(self.request):
                result.client_gone = True
            else:
                result.upstream_failed = f"{exc.__class__.__name__}: {exc}"
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            if self.watcher.done() or _client_gone(self.request):
                result.client_gone = True
            else:
                result.upstream_failed = f"{exc.__class__.__name__}: {exc}"

    async def _write(self, chunk: bytes) -> None:
        """Write what ``chunk`` completes: SSE, only whole events (so an error event never follows half of one),
        and none of the answer-less ones before the answer begins (``pending``)."""
        if self.is_sse:
            chunk, self.held = _complete_events(self.held + chunk if self.held else chunk)
            if not self.answered and chunk:
                chunk, self.answered = _until_answer(chunk, self.pending)
        if self.tail is not None:
            self.tail.feed(chunk)
        out = self.translate.stream(chunk) if self.translate is not None and chunk else chunk
        if self.sniff_json and chunk:  # a whole JSON answer without a size: kept to be parsed at its end
            self.sniffed += len(chunk)
            if self.sniffed <= _MAX_SNIFF_BYTES:
                self.body_parts.append(chunk)
            else:  # too long to parse: nothing kept, no final_json
                self.sniff_json, self.body_parts = False, []
        if out:
            await self.resp.write(out)
            self.result.bytes_out += len(out)
            self.result.chunks += 1

    async def _write_rest(self) -> None:
        """At the body's end: the held first chunk and a last event without its blank line, as they are; a
        translated stream's close in its own dialect."""
        if self.pending or self.held:
            held = self.held
            rest = b"".join(self.pending) + (held + b"\n\n" if self.translate is not None and held else held)
            self.pending.clear()
            if self.tail is not None:
                self.tail.feed(rest)
            out = self.translate.stream(rest) if self.translate is not None else rest
            await self.resp.write(out)
            self.result.bytes_out += len(out)
            self.held = b""
        if self.translate is not None and self.is_sse:
            out = self.translate.end()
            if out:
                await self.resp.write(out)
                self.result.bytes_out += len(out)

    def _resend_due(self) -> bool:
        """The upstream failed before the first event of the answer, a resend is possible and none was made."""
        result = self.result
        return bool(result.upstream_failed) and self.resend is not None and not self.answered and not result.resent

    async def _send_again(self) -> Literal["again", "failed", "answered"]:
        """The resend: nothing of the answer reached the client; send the request again, once, into the same
        response. ``again``: a new stream to relay; ``failed``: it could not be sent (``upstream_failed``);
        ``answered``: an answer without a stream (an error), written as the stream's last event."""
        assert self.resend is not None
        result = self.result
        log.warning("upstream failed on %s before the first event of its answer (%s); sending it again",
                    self.request.path, result.upstream_failed)
        result.resent = True
        self.upstream.close()
        self.watcher.cancel()
        self.held, failed, result.upstream_failed = b"", result.upstream_failed, None
        self.pending.clear()
        try:
            self.upstream = await self.resend()
        except ProxyError as exc:
            result.upstream_failed = f"{failed}; sent again: {exc.message}"
            return "failed"
        self.watcher = asyncio.create_task(_watch_client(self.request, self.upstream))
        if not self.upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
            await _error_into_started(self.upstream, self.resp, result, self.style)
            return "answered"
        return "again"

    async def _end_on_upstream_failure(self) -> bool:
        """The upstream failed mid-answer: an SSE stream gets its error event (True: end it normally then);
        another body is cut as the upstream cut it (False: nothing more to write)."""
        result = self.result
        log.warning("upstream failed mid-response on %s: %s%s", self.request.path, result.upstream_failed,
                    f" (dropped {len(self.held)} bytes of an unfinished event)" if self.held else "")
        self.upstream.close()
        if self.is_sse:
            await _write_sse_error(self.resp, result, self.style)
            return True
        # Without a body framing to signal errors, cut the connection as the upstream did.
        if self.request.transport is not None:
            self.request.transport.close()
        return False

    async def _end_normally(self) -> None:
        try:
            await self.resp.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            self.result.client_gone = True

    async def _end_cancelled(self) -> None:
        """Cancelled: with the client still there, the shutdown's drain ran out, and an SSE client gets a last
        error event it can parse, not a cut stream."""
        self.upstream.close()
        if self.is_sse and not _client_gone(self.request):
            self.request[DRAINED] = True
            await _end_cancelled_stream(self.resp, self.style)
        self.result.client_gone = True

    def _let_go(self) -> None:
        """Stop watching the client; close the upstream when the client left (llama-server must see the
        disconnect), else release it to the pool."""
        self.watcher.cancel()
        if self.result.client_gone:
            self.upstream.close()
        else:
            self.upstream.release()

    def _keep_final_json(self) -> None:
        if self.tail is not None:
            self.result.final_json = self.tail.last
        elif self.body_parts:
            try:
                parsed = json.loads(b"".join(self.body_parts))
                self.result.final_json = parsed if isinstance(parsed, dict) else None
            except ValueError:
                pass


async def _relay_small(upstream: aiohttp.ClientResponse, extra_headers: dict[str, str] | None, result: RelayResult,
                       is_json: bool, translate: Translator | None = None,
                       on_answer: list[Callable[[dict[str, Any] | None], None]] | None = None
                       ) -> tuple[web.StreamResponse, RelayResult]:
    """A complete, bounded body (every non-streamed llama-server answer): read it, answer in one write.

    The upstream has already finished generating when its headers arrive, so there is nothing to cancel.
    """
    try:
        body = await upstream.read()
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
        upstream.close()
        result.upstream_failed = f"{exc.__class__.__name__}: {exc}"
        raise UpstreamUnavailable(f"upstream connection lost while reading the response ({exc})") from exc
    finally:
        upstream.release()
    if is_json and body[:1] == b"{":
        try:
            result.final_json = json.loads(body)
        except ValueError:
            pass
    for fn in on_answer or ():
        fn(result.final_json)
    headers = CIMultiDict(response_headers(upstream))
    headers.update(extra_headers or {})
    if translate is not None:
        body = translate.body(upstream.status, body)
    resp = web.Response(status=upstream.status, reason=upstream.reason, body=body, headers=headers)
    result.bytes_out, result.chunks, result.completed = len(body), 1, True
    return resp, result


async def _error_into_started(upstream: aiohttp.ClientResponse, resp: web.StreamResponse, result: RelayResult,
                              style: StreamStyle) -> tuple[web.StreamResponse, RelayResult]:
    """The client's stream already started but llama-server answered without a stream (an error): that answer
    becomes the stream's error event."""
    try:
        body = await upstream.read()
    finally:
        upstream.release()
    try:
        err = json.loads(body)
    except ValueError:
        err = None
    if not (isinstance(err, dict) and "error" in err):
        err = error_body(upstream.status if upstream.status >= 400 else 502,
                         body.decode("utf-8", "replace")[:500] or "upstream answered without a stream",
                         "upstream_not_a_stream")
    await write_stream_error(resp, err, style)
    result.completed = True
    return resp, result


async def write_stream_error(resp: web.StreamResponse, body: JsonObject, style: StreamStyle) -> None:
    """An error as the last event of a stream that already started, in its dialect (then the stream ends)."""
    payload = style.error_event(body)
    try:
        await resp.write(payload)
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass


_EVENT = re.compile(rb".*?(?:\r\n\r\n|\n\n)", re.S)
_SILENT_DELTA = {"role", "content", "reasoning_content", "tool_calls"}  # keys of a chat delta that says nothing


def _until_answer(chunk: bytes, pending: list[bytes]) -> tuple[bytes, bool]:
    """Complete events before the first one of the answer (the resend): what to write now (comments and progress,
    then, once an event of the answer came, everything held and the rest), and whether the answer began. Events
    that carry nothing else are appended to ``pending``."""
    out: list[bytes] = []
    for m in _EVENT.finditer(chunk):
        event = m.group()
        kind = _before_answer(event)
        if kind == "pass":
            out.append(event)
        elif kind == "hold":
            pending.append(event)
        else:
            out += pending
            pending.clear()
            out.append(chunk[m.start():])
            return b"".join(out), True
    return b"".join(out), False


def _before_answer(event: bytes) -> str | None:
    """``pass`` for an event that carries nothing of an answer and may reach the client at once (comments,
    llama-server's ``prompt_progress``), ``hold`` for a chat stream's role-only first chunk, None for anything
    else (the answer, an error, a shape not known here)."""
    payloads = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    if not payloads:
        return "pass" if all(not line.strip() or line.startswith(b":") for line in event.splitlines()) else None
    kinds = set()
    for payload in payloads:
        try:
            data = json.loads(payload) if payload.startswith(b"{") else None
        except ValueError:
            return None
        if not isinstance(data, dict) or "error" in data or data.get("usage") or data.get("content") \
                or data.get("stop"):
            return None
        choices = data.get("choices")
        if choices is not None and not _silent_choices(choices):
            return None
        if "prompt_progress" in data:
            kinds.add("pass")
        elif choices:
            kinds.add("hold")
        else:
            return None
    return "hold" if "hold" in kinds else "pass"


def _silent_choices(choices: object) -> bool:
    """Chat chunk choices that end nothing and whose deltas say nothing (a role, empty content)."""
    if not isinstance(choices, list):
        return False
    for c in choices:
        delta = c.get("delta") if isinstance(c, dict) else None
        if not isinstance(delta, dict) or c.get("finish_reason") is not None or c.get("text"):
            return False
        if set(delta) - _SILENT_DELTA or any(delta.get(k) for k in _SILENT_DELTA - {"role"}):
            return False
    return True


def _complete_events(buf: bytes) -> tuple[bytes, bytes]:
    """``buf`` split after its last event terminator (a blank line, ``\n\n`` or ``\r\n\r\n``)."""
    lf, crlf = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
    cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return buf[:cut], buf[cut:]


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _watch_client(request: web.Request, upstream: aiohttp.ClientResponse) -> None:
    """Close the upstream response as soon as the client's connection is gone."""
    while True:
        await asyncio.sleep(0.1)
        if _client_gone(request):
            log.info("client left %s; closing upstream connection", request.path)
            upstream.close()
            return


async def _end_cancelled_stream(resp: web.StreamResponse, style: StreamStyle) -> None:
    body = error_body(503, "the proxy is shutting down (--shutdown-save-timeout-s ran out while this stream ran); "
                           "retry the request", "proxy_shutdown")
    try:
        await asyncio.wait_for(asyncio.shield(_write_eof(resp, style.error_event(body))), 1.0)
    except BaseException:  # noqa: BLE001 - best effort on the way out; the cancellation goes on
        pass


async def _write_eof(resp: web.StreamResponse, payload: bytes) -> None:
    await resp.write(payload)
    await resp.write_eof()


async def _write_sse_error(resp: web.StreamResponse, result: RelayResult, style: StreamStyle) -> None:
    body = error_body(502, f"upstream connection lost mid-stream ({result.upstream_failed})", "upstream_stream_lost")
    payload = style.error_event(body)
    try:
        await resp.write(payload)
        result.bytes_out += len(payload)
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        result.client_gone = True
