"""Transparency and fault injection against aiohttp fake upstreams (the real path is in test_proxy_real.py)."""

from __future__ import annotations

import re

import asyncio
import json

from aiohttp import web

from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import UPSTREAM
from tests.conftest import make_settings


def echo_app(seen: list) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        if request.path == "/props":
            return web.json_response({"total_slots": 2, "model_path": "fake.gguf",
                                      "default_generation_settings": {"n_ctx": 4096}})
        body = await request.read()
        seen.append({"method": request.method, "path_qs": request.path_qs, "headers": dict(request.headers),
                     "body": body})
        return web.json_response({"ok": True, "path": request.path_qs}, headers={"X-Upstream": "1"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


def client_requests(seen: list) -> list:
    """What reached the fake upstream, minus the proxy's own calls: the session layer's start-up probe of slot
    saving, the erase of a slot whose content this process did not put there (cache isolation after a start),
    and the upstream sentinel's ``GET /health`` polls (``llama/sentinel.py``)."""
    own = re.compile(r"/slots/\d+\?action=(?:save|erase)$|/health$")
    return [r for r in seen if not own.match(r["path_qs"])]


async def proxy_for(aiohttp_client, upstream_url: str, tmp_path, **kw):
    return await aiohttp_client(create_app(make_settings(upstream_url, tmp_path, **kw)))


async def test_passthrough_forwards_method_path_query_headers_body(aiohttp_server, aiohttp_client, tmp_path):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    resp = await client.request("PUT", "/some/path?a=1&b=%20x", data=b"\x00raw bytes",
                                headers={"Authorization": "Bearer k", "X-Custom": "v", "Connection": "close",
                                         "Proxy-Authorization": "secret"})
    assert resp.status == 200
    assert resp.headers["X-Upstream"] == "1"
    got = client_requests(seen)[-1]
    assert got["method"] == "PUT"
    assert got["path_qs"] == "/some/path?a=1&b=%20x"
    assert got["body"] == b"\x00raw bytes"
    assert got["headers"]["Authorization"] == "Bearer k"
    assert got["headers"]["X-Custom"] == "v"
    assert "Proxy-Authorization" not in got["headers"]


async def test_parsed_route_forwards_identical_bytes(aiohttp_server, aiohttp_client, tmp_path):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    raw = b'{ "messages" : [{"role":"user","content":"hi \\u00e9"}],   "unknown_field": {"x": [1,2]} }'
    resp = await client.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 200
    # The only change is the slot pin, spliced in front of the client's own bytes.
    slot = resp.headers["X-PFlash-Slot"]
    assert client_requests(seen)[-1]["body"] == b'{"id_slot":' + slot.encode() + b"," + raw[1:]
    # Without the session layer the bytes are forwarded untouched.
    plain = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path, sessions=False)
    resp = await plain.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 200
    assert client_requests(seen)[-1]["body"] == raw


async def test_get_on_parsed_path_is_passed_through(aiohttp_server, aiohttp_client, tmp_path):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    resp = await client.get("/v1/chat/completions?x=1")
    assert resp.status == 200
    assert client_requests(seen)[-1]["method"] == "GET"


async def test_malformed_json_gets_400(aiohttp_server, aiohttp_client, tmp_path):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    resp = await client.post("/v1/chat/completions", data=b'{"messages": [')
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert set(err) == {"message", "type", "code"}
    assert err["code"] == "invalid_json" and "JSON" in err["message"]
    resp = await client.post("/v1/chat/completions", json={"messages": "not a list"})
    assert resp.status == 400
    assert "messages" in (await resp.json())["error"]["message"]
    assert client_requests(seen) == []  # nothing the client sent reached the upstream


BAD_BODIES = [
    ("lone surrogate", b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}]}', "surrogate"),
    ("lone surrogate as UTF-8 bytes", b'{"messages": [{"role": "user", "content": "hi \xed\xa0\x80"}]}', "surrogate"),
    ("lone surrogate in a UTF-16 body", '{"messages": [{"role": "user", "content": "hi \ud800"}]}'.encode(
        "utf-16-le", "surrogatepass"), "surrogate"),
    ("text part is a number", json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
                                          ).encode(), "messages.0.content"),
    ("text part is null", json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}
                                      ).encode(), "messages.0.content"),
    ("function is a string", json.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": "get_weather"}]}]}).encode(), "messages.0.tool_calls"),
    ("nested 100,000 deep", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
]


async def test_bad_input_gets_400_not_500(aiohttp_server, aiohttp_client, tmp_path):
    """Issue #13 item 7: each of these answered 500 (an exception past the parser) before."""
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    for what, body, needle in BAD_BODIES:
        resp = await client.post("/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400, what
        err = (await resp.json())["error"]
        assert err["type"] == "invalid_request_error" and needle in err["message"], (what, err)
    # a properly paired surrogate escape (an emoji) is valid JSON and passes
    resp = await client.post("/v1/chat/completions", data=b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    assert resp.status == 200
    assert len(client_requests(seen)) == 1


async def test_body_over_limit_gets_413(aiohttp_server, aiohttp_client, tmp_path):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path, max_body_mb=0.001)
    resp = await client.post("/v1/chat/completions", data=b"x" * 5000)
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "request_too_large"
    resp = await client.post("/anything/else", data=b"x" * 5000)
    assert resp.status == 413
    assert client_requests(seen) == []


async def test_upstream_down_gets_502(aiohttp_client, tmp_path):
    from pflash_proxy.llama.spawn import free_port

    # a refused connection waits up to --upstream-wait-s for a restarting llama-server before the 502 (60 s by
    # default: two requests here took two minutes); a tiny wait in the test, the default in production
    client = await proxy_for(aiohttp_client, f"http://127.0.0.1:{free_port()}", tmp_path, upstream_wait_s=0.5)
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
        resp = await client.request(method, path, json={"messages": [{"role": "user", "content": "x"}]})
        assert resp.status == 502
        body = await resp.json()
        assert body["error"]["type"] == "upstream_error"
        assert "unreachable" in body["error"]["message"]


async def test_upstream_not_ready_gets_503(aiohttp_server, aiohttp_client, tmp_path):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    client.app[UPSTREAM].set_ready(False, "llama-server is starting")
    resp = await client.get("/health")
    assert resp.status == 503
    assert "starting" in (await resp.json())["error"]["message"]
    client.app[UPSTREAM].set_ready(True)
    assert (await client.get("/health")).status == 200


def sse_app(state: dict) -> web.Application:
    """Streams 5 SSE events 0.3 s apart; with die_after=N it kills the connection after N events."""

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        state["started"] = asyncio.get_running_loop().time()
        try:
            for i in range(state.get("events", 5)):
                if state.get("die_after") == i:
                    if state.get("half_event"):  # part of the next event, then the connection dies
                        await resp.write(b'data: {"i": ' + str(i).encode() + b', "choi')
                        await asyncio.sleep(0.1)
                    request.transport.abort()
                    return resp
                await resp.write(f'data: {{"i": {i}}}\n\n'.encode())
                state.setdefault("sent_at", []).append(asyncio.get_running_loop().time())
                await asyncio.sleep(state.get("gap", 0.3))
            await resp.write(b'data: {"i": "last", "timings": {"cache_n": 7}}\n\ndata: [DONE]\n\n')
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            state["upstream_saw_close_at"] = asyncio.get_running_loop().time()
            raise
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    return app


BODY = {"messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_sse_chunks_are_relayed_as_they_arrive(aiohttp_server, aiohttp_client, tmp_path):
    state: dict = {}
    up = await aiohttp_server(sse_app(state))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path, sessions=False)
    resp = await client.post("/v1/chat/completions", json=BODY)
    first = await resp.content.readuntil(b"\n\n")
    got_first_at = asyncio.get_running_loop().time()
    assert first == b'data: {"i": 0}\n\n'
    # The upstream has sent only its first event(s); the last comes ≥ 1.2 s later.
    assert len(state["sent_at"]) <= 2
    rest = await resp.read()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert state["sent_at"][-1] - got_first_at > 0.8


async def test_upstream_dying_mid_stream_ends_cleanly(aiohttp_server, aiohttp_client, tmp_path):
    state: dict = {"die_after": 2}
    up = await aiohttp_server(sse_app(state))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path, sessions=False)
    resp = await client.post("/v1/chat/completions", json=BODY)
    body = await resp.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert events[:2] == [b'data: {"i": 0}', b'data: {"i": 1}']
    err = json.loads(events[2][len(b"data: "):])
    assert err["error"]["code"] == "upstream_stream_lost"
    assert events[3] == b"data: [DONE]"
    # The proxy keeps serving.
    state.pop("die_after")
    resp = await client.post("/v1/chat/completions", json=BODY)
    assert (await resp.read()).endswith(b"data: [DONE]\n\n")


async def test_a_half_event_is_dropped_before_the_error_event(aiohttp_server, aiohttp_client, tmp_path):
    """Issue #13 item 8: the client got 'data: {"i": 2, "choi' glued to the error event and could parse neither."""
    state: dict = {"die_after": 2, "half_event": True}
    up = await aiohttp_server(sse_app(state))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path, sessions=False)
    resp = await client.post("/v1/chat/completions", json=BODY)
    body = await resp.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert events[:2] == [b'data: {"i": 0}', b'data: {"i": 1}'] and events[-1] == b"data: [DONE]"
    assert [json.loads(e[len(b"data: "):]) for e in events[:-1]][-1]["error"]["code"] == "upstream_stream_lost"
    assert b"choi" not in body


async def test_client_disconnect_closes_upstream_within_a_second(aiohttp_server, aiohttp_client, tmp_path):
    state: dict = {"events": 50, "gap": 0.2}
    up = await aiohttp_server(sse_app(state))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path, sessions=False)
    resp = await client.post("/v1/chat/completions", json=BODY)
    await resp.content.readuntil(b"\n\n")
    left_at = asyncio.get_running_loop().time()
    resp.close()  # drop the client connection
    for _ in range(30):
        if "upstream_saw_close_at" in state:
            break
        await asyncio.sleep(0.1)
    assert "upstream_saw_close_at" in state
    assert state["upstream_saw_close_at"] - left_at < 1.0
    assert len(state["sent_at"]) < 20  # generation stopped long before the 50 events


async def test_one_structured_log_line_per_request(aiohttp_server, aiohttp_client, tmp_path, caplog):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path, sessions=False)
    caplog.set_level("INFO", logger="pflash_proxy.access")
    resp = await client.get("/v1/models?x=1")
    body = await resp.read()
    lines = [r for r in caplog.records if r.name == "pflash_proxy.access"]
    assert len(lines) == 1
    fields = lines[0].fields
    assert fields["method"] == "GET" and fields["path"] == "/v1/models" and fields["status"] == 200
    assert fields["bytes"] == len(body) and fields["upstream_ms"] >= 0
    from pflash_proxy.logs import JsonFormatter

    assert json.loads(JsonFormatter().format(lines[0]))["status"] == 200


async def test_upstream_cookies_are_never_replayed_to_other_clients(aiohttp_server, aiohttp_client, tmp_path):
    seen: list = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        resp = web.json_response({"ok": True})
        resp.set_cookie("session", "secret-of-client-a")
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    up = await aiohttp_server(app)
    # By host name: aiohttp's default jar ignores cookies from bare IP addresses, not from names.
    upstream = str(up.make_url("")).replace("127.0.0.1", "localhost")
    client = await proxy_for(aiohttp_client, upstream, tmp_path, sessions=False)
    first = await client.get("/a")
    assert "secret-of-client-a" in first.headers["Set-Cookie"]  # relayed to its own client
    client.session.cookie_jar.clear()
    await client.get("/b")
    assert seen == [None, None]  # the proxy kept nothing


async def test_a_translated_anthropic_request_carries_the_engines_slot_pin(aiohttp_server, aiohttp_client,
                                                                           tmp_path):
    """The Anthropic dialect is sent as a chat body: the pin the session stage set travels into it."""
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    resp = await client.post("/v1/messages", json={"model": "m", "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200
    sent = json.loads(client_requests(seen)[-1]["body"])
    assert client_requests(seen)[-1]["path_qs"] == "/v1/chat/completions"
    assert sent["id_slot"] == int(resp.headers["X-PFlash-Slot"])
    # a client's own pin, sessions off: forwarded as the client sent it
    plain = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path / "b", sessions=False)
    resp = await plain.post("/v1/messages", json={"model": "m", "max_tokens": 4, "id_slot": 1,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200 and json.loads(client_requests(seen)[-1]["body"])["id_slot"] == 1


async def test_a_slot_pin_that_is_no_integer_is_refused_in_the_clients_dialect(aiohttp_server, aiohttp_client,
                                                                               tmp_path):
    seen: list = []
    up = await aiohttp_server(echo_app(seen))
    client = await proxy_for(aiohttp_client, str(up.make_url("")), tmp_path)
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
                       ("/completion", {"prompt": "hi"})):
        for bad in ("0", 1.5, True, [0]):
            resp = await client.post(path, json={**body, "id_slot": bad})
            assert resp.status == 400, (path, bad)
            err = await resp.json()
            assert "id_slot: must be an integer" in json.dumps(err), err
            if path == "/v1/messages":
                assert err["type"] == "error"
    assert client_requests(seen) == []
