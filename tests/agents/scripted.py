"""A scripted model behind the proxy, and a recording front before it, for real agent CLIs in a real loop.

``ScriptedUpstream`` is what the proxy gets as ``--upstream``:
1. Every request that does not generate (``/tokenize``, ``/slots``, ``/props``, ``/health``, slot actions,
   ``/v1/chat/completions/input_tokens``, ``/v1/messages/count_tokens`` ...) is forwarded to the real
   llama-server unchanged, and its answer returned unchanged.
2. A generating call (``/v1/chat/completions``: chat clients and Anthropic Messages, which the proxy translates to
   chat; ``/v1/responses``: Codex) is first run on the real llama-server as it came (``id_slot`` included) with
   one output token (``max_tokens`` / ``max_output_tokens`` = 1, not streamed), so the slot holds the prompt the
   model would have read and ``/slots``, ``cache_n`` and ``usage`` stay true.  If the server refuses it (400),
   it is run once more without the tools llama-server cannot take (non-``function`` tools), and that is noted.
3. The answer comes from the ``Script``: while the conversation holds no tool result / no added file yet, a call
   of the client's own read tool on the long file (``Read``/``file_path``, ``read``/``filePath``, or a shell
   tool with ``cat FILE``); without any tool (aider) a text that names the file (aider then adds it); once the
   file arrived, the final text answer.  It is written in the route's own format (chat completion or chunks;
   Responses object or events), streamed or not as asked, with the real run's ``usage`` and ``timings``.
4. Every generating request is recorded (``Received``: path, headers, body, the real run's numbers, the reply),
   i.e. exactly what the model would have seen.

``RecordingFront`` sits between the client and the proxy: it forwards every request (streaming the answer back as
it comes) with one added ``X-Recording-Front-Id`` header, which the proxy forwards like any client header, so
each request the model received pairs with the one the client sent; it records what the client sent and the
proxy's status and headers (also the ``X-PFlash-*`` values that a progress-comment stream carries in its last
``: pflash`` comment).
"""

from __future__ import annotations

import copy
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

GENERATING = ("/v1/chat/completions", "/chat/completions", "/v1/responses", "/responses")
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
       "transfer-encoding", "upgrade", "host", "content-length"}
READ_TOOLS = ("read", "read_file", "view")
PATH_PARAMS = ("file_path", "filePath", "path", "filename")
SHELL_TOOLS = ("exec_command", "shell_command", "shell", "bash")
FRONT_ID = "X-Recording-Front-Id"  # added by the front, forwarded by the proxy: pairs both sides' records


def _headers(h) -> list[tuple[str, str]]:
    return [(k, v) for k, v in h.items() if k.lower() not in HOP]


# The script ---------------------------------------------------------------------------------------------------
@dataclass
class Reply:
    text: str | None = None
    tool: str | None = None
    arguments: dict | None = None


def _tools(body: dict) -> list[tuple[str, dict]]:
    """(name, JSON schema) of each function tool, in chat or Responses form."""
    out = []
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        if t.get("type", "function") == "function" and isinstance(fn.get("name"), str):
            out.append((fn["name"], fn.get("parameters") or {}))
    return out


def _texts(body: dict) -> list[tuple[str, str]]:
    """(role, text) of every message (chat) or input item (Responses)."""
    out = []
    items = body.get("messages") if "messages" in body else body.get("input")
    if isinstance(items, str):
        return [("user", items)]
    for m in items or []:
        if not isinstance(m, dict):
            continue
        role = m.get("role") or m.get("type") or ""
        c = m.get("content") if "content" in m else m.get("output")
        if isinstance(c, list):
            c = "".join(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
        out.append((role, c if isinstance(c, str) else ""))
    return out


def tool_results(body: dict) -> list[str]:
    """The texts of the tool results in a chat or Responses body."""
    return [t for r, t in _texts(body) if r in ("tool", "function_call_output")]


@dataclass
class Script:
    """Read ``file`` with the client's own tool, then answer ``answer``."""

    file: Path
    answer: str = "It returns the best matches, most similar first."

    def file_arrived(self, body: dict) -> bool:
        if tool_results(body):
            return True
        # aider: an added file travels in a user message as "NAME\n```...".
        return any(r == "user" and f"{self.file.name}\n```" in t for r, t in _texts(body))

    def reply(self, body: dict) -> Reply:
        if self.file_arrived(body):
            return Reply(text=self.answer)
        tools = _tools(body)
        for name, schema in tools:
            props = schema.get("properties") or {}
            key = next((k for k in PATH_PARAMS if k in props), None)
            if name.lower() in READ_TOOLS and key:
                return Reply(tool=name, arguments={key: str(self.file)})
        for name, schema in tools:
            props = schema.get("properties") or {}
            cmd = f"cat {self.file}"
            if name == "exec_command" and "cmd" in props:
                args: dict = {"cmd": cmd}
                if "max_output_tokens" in props:
                    args["max_output_tokens"] = 100000
                return Reply(tool=name, arguments=args)
            if name in SHELL_TOOLS and "command" in props:
                typ = (props["command"] or {}).get("type")
                return Reply(tool=name, arguments={"command": ["bash", "-lc", cmd] if typ == "array" else cmd})
        if tools:
            return Reply(text="I have no tool to read files with.")
        return Reply(text=f"To answer I need to see {self.file.name}")


# The recorded request -----------------------------------------------------------------------------------------
@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict
    reply: Reply
    real_status: int = 0
    real: dict = field(default_factory=dict)  # usage / timings of the one-token run
    note: str = ""
    t: float = field(default_factory=time.time)

    def _counts(self) -> tuple[int | None, int | None]:
        """(cached, newly evaluated) prompt tokens of the real run: its ``timings``, or its ``usage`` (llama-server's
        non-streamed Responses answer carries no timings)."""
        timings = self.real.get("timings") or {}
        if "cache_n" in timings:
            return timings.get("cache_n"), timings.get("prompt_n")
        usage = self.real.get("usage") or {}
        if "input_tokens" in usage:
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
            return cached, usage["input_tokens"] - cached
        if "prompt_tokens" in usage:
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            return cached, usage["prompt_tokens"] - cached
        return None, None

    @property
    def cache_n(self) -> int | None:
        return self._counts()[0]

    @property
    def prompt_n(self) -> int | None:
        return self._counts()[1]


class _CatchAll:
    """A loopback aiohttp server that hands every request to ``_handle``, with a client session to forward by."""

    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None
    url = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=1800),
                                              auto_decompress=False)
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


class ScriptedUpstream(_CatchAll):
    def __init__(self, real_url: str, script: Script):
        self.real_url = real_url.rstrip("/")
        self.script = script
        self.received: list[Received] = []
        self.forwarded: list[tuple[str, str]] = []  # (method, path) of what went to llama-server as it was
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if request.method == "POST" and request.path in GENERATING:
            return await self._scripted(request, json.loads(raw))
        self.forwarded.append((request.method, request.path))
        assert self._session is not None
        async with self._session.request(request.method, self.real_url + request.path_qs,
                                         headers=_headers(request.headers), data=raw or None) as up:
            body = await up.read()
            return web.Response(status=up.status, body=body, headers=_headers(up.headers))

    async def _real_run(self, path: str, body: dict) -> tuple[int, dict, str]:
        shadow = copy.deepcopy(body)
        shadow["stream"] = False
        shadow.pop("stream_options", None)
        if path.endswith("/responses"):
            shadow["max_output_tokens"] = 1
        else:
            shadow.pop("max_completion_tokens", None)
            shadow["max_tokens"] = 1
        assert self._session is not None
        note = ""
        for attempt in range(2):
            async with self._session.post(self.real_url + path, json=shadow) as r:
                status, text = r.status, await r.text()
            if status != 400 or attempt or not shadow.get("tools"):
                break
            kept = [t for t in shadow["tools"] if isinstance(t, dict) and t.get("type", "function") == "function"]
            if len(kept) == len(shadow["tools"]):
                break
            note = (f"real run refused ({text[:200]}); rerun without {len(shadow['tools']) - len(kept)} "
                    f"non-function tools")
            shadow["tools"] = kept
        try:
            data = json.loads(text)
        except ValueError:
            data = {"raw": text[:500]}
        if status != 200:
            note = (note + "; " if note else "") + f"real run {status}: {text[:300]}"
        return status, {"usage": data.get("usage"), "timings": data.get("timings")}, note

    async def _scripted(self, request: web.Request, body: dict) -> web.StreamResponse:
        status, real, note = await self._real_run(request.path, body)
        reply = self.script.reply(body)
        self.received.append(Received(request.path, dict(request.headers), body, reply, status, real, note))
        n = next(self._ids)
        if request.path.endswith("/responses"):
            return await self._responses(request, body, reply, real, n)
        return await self._chat(request, body, reply, real, n)

    # chat completions ------------------------------------------------------------------------------------------
    async def _chat(self, request, body, reply: Reply, real: dict, n: int) -> web.StreamResponse:
        model = body.get("model") or "gemma"
        cid, created = f"chatcmpl-scripted-{n}", int(time.time())
        finish = "tool_calls" if reply.tool else "stop"
        call = ({"id": f"call_scripted_{n}", "type": "function",
                 "function": {"name": reply.tool, "arguments": json.dumps(reply.arguments)}} if reply.tool else None)
        usage = real.get("usage") or {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 0}
        timings = real.get("timings") or {}
        if not body.get("stream"):
            msg: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if call:
                msg["tool_calls"] = [call]
            return web.json_response({"id": cid, "object": "chat.completion", "created": created, "model": model,
                                      "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                                      "usage": usage, "timings": timings})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        per_token = bool(body.get("timings_per_token"))

        async def chunk(delta: dict, fin: str | None = None, last: bool = False) -> None:
            ev: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                                  "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}
            if per_token or last:
                ev["timings"] = timings
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")

        await chunk({"role": "assistant", "content": None})
        if call:
            await chunk({"tool_calls": [{"index": 0, **call}]})
        else:
            await chunk({"content": reply.text})
        await chunk({}, finish, last=True)
        if (body.get("stream_options") or {}).get("include_usage"):
            ev = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                  "usage": usage, "timings": timings}
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # Responses ----------------------------------------------------------------------------------------------------
    async def _responses(self, request, body, reply: Reply, real: dict, n: int) -> web.StreamResponse:
        rid, created = f"resp_scripted_{n}", int(time.time())
        if reply.tool:
            item: dict[str, Any] = {"type": "function_call", "id": f"fc_scripted_{n}", "call_id": f"call_scripted_{n}",
                                    "name": reply.tool, "arguments": json.dumps(reply.arguments),
                                    "status": "completed"}
        else:
            item = {"type": "message", "id": f"msg_scripted_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}
        usage = dict(real.get("usage") or {})
        usage.setdefault("input_tokens", 0)
        usage.setdefault("output_tokens", 1)
        usage.setdefault("total_tokens", usage["input_tokens"] + usage["output_tokens"])
        timings = real.get("timings") or {}
        if "input_tokens_details" not in usage and "cache_n" in timings:
            usage["input_tokens_details"] = {"cached_tokens": timings["cache_n"]}
        response = {"id": rid, "object": "response", "created_at": created, "status": "completed",
                    "model": body.get("model") or "gemma", "output": [item], "usage": usage}
        if not body.get("stream"):
            return web.json_response({**response, "timings": timings})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        seq = itertools.count()

        async def event(kind: str, **data: Any) -> None:
            ev = {"type": kind, "sequence_number": next(seq), **data}
            await resp.write(f"event: {kind}\ndata: ".encode() + json.dumps(ev).encode() + b"\n\n")

        await event("response.created", response={**response, "status": "in_progress", "output": [], "usage": None})
        await event("response.in_progress", response={**response, "status": "in_progress", "output": [],
                                                      "usage": None})
        if reply.tool:
            await event("response.output_item.added", output_index=0,
                        item={**item, "arguments": "", "status": "in_progress"})
            await event("response.function_call_arguments.delta", item_id=item["id"], output_index=0,
                        delta=item["arguments"])
            await event("response.function_call_arguments.done", item_id=item["id"], output_index=0,
                        arguments=item["arguments"])
        else:
            part = {"type": "output_text", "text": "", "annotations": []}
            await event("response.output_item.added", output_index=0,
                        item={**item, "status": "in_progress", "content": []})
            await event("response.content_part.added", item_id=item["id"], output_index=0, content_index=0, part=part)
            await event("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0,
                        delta=reply.text)
            await event("response.output_text.done", item_id=item["id"], output_index=0, content_index=0,
                        text=reply.text)
            await event("response.content_part.done", item_id=item["id"], output_index=0, content_index=0,
                        part={**part, "text": reply.text})
        await event("response.output_item.done", output_index=0, item=item)
        await event("response.completed", response={**response, "timings": timings})
        await resp.write_eof()
        return resp


# The recording front ------------------------------------------------------------------------------------------
@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    response_tail: bytes = b""

    def json(self) -> dict:
        try:
            return json.loads(self.body)
        except ValueError:
            return {}

    def pflash(self, name: str) -> str | None:
        """An ``X-PFlash-*`` value: a response header, or from the ``: pflash K=V ...`` comment a progress stream
        ends its comments with (the headers decided after the stream started)."""
        for k, v in self.response_headers.items():
            if k.lower() == name.lower():
                return v
        for line in self.response_tail.decode("utf-8", "replace").splitlines():
            if line.startswith(": pflash ") and f"{name}=" in line:
                for tok in line[len(": pflash "):].split():
                    if tok.startswith(name + "="):
                        return tok.split("=", 1)[1]
        return None


class RecordingFront(_CatchAll):
    def __init__(self, target_url: str):
        self.target = target_url.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def generating(self) -> list[Exchange]:
        return [x for x in self.exchanges if x.method == "POST" and x.path in ("/v1/messages", *GENERATING)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        x = Exchange(request.method, request.path, dict(request.headers), raw)
        self.exchanges.append(x)
        assert self._session is not None
        headers = _headers(request.headers) + [(FRONT_ID, str(len(self.exchanges) - 1))]
        async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                         data=raw or None) as up:
            x.status, x.response_headers = up.status, dict(up.headers)
            resp = web.StreamResponse(status=up.status, headers=_headers(up.headers))
            await resp.prepare(request)
            tail = bytearray()
            async for chunk in up.content.iter_any():
                tail += chunk
                del tail[:-65536]
                await resp.write(chunk)
            x.response_tail = bytes(tail)
            await resp.write_eof()
            return resp
