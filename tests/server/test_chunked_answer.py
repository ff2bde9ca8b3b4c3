"""A whole (non-streamed) JSON answer that arrives without a Content-Length (chunked, as from a server or proxy
in front of llama-server that does not buffer) still gives the stages its body: ``RelayResult.final_json`` is
the parsed answer, so its cache report (``timings``/``usage``) is read as from a sized one."""

from __future__ import annotations

import json

from aiohttp import web

from pflash_proxy.contract import ProxyRequest, RelayResult, Stage
from pflash_proxy.server.app import create_app
from tests.conftest import make_settings

ANSWER = {"choices": [{"message": {"role": "assistant", "content": "Hello"}}],
          "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
          "timings": {"prompt_n": 7, "cache_n": 0}}


class Seeing(Stage):
    name = "seeing"

    def __init__(self) -> None:
        self.seen: list[object] = []

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        self.seen.append(result.final_json)


async def _chunked_upstream(aiohttp_server) -> str:
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        body = json.dumps(ANSWER).encode()
        for i in range(0, len(body), 40):  # in several chunks, none the whole answer
            await resp.write(body[i:i + 40])
        await resp.write_eof()
        return resp
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def test_a_chunked_whole_answer_reaches_the_stages_parsed(aiohttp_server, aiohttp_client, tmp_path):
    seeing = Seeing()
    app = create_app(make_settings(await _chunked_upstream(aiohttp_server), tmp_path), stages=[seeing])
    client = await aiohttp_client(app)
    resp = await client.post("/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert resp.status == 200
    assert await resp.json() == ANSWER, "the client gets the answer as it came"
    assert seeing.seen == [ANSWER], "the stages did not see the chunked answer's body"


async def test_a_chunked_answer_over_the_sniff_limit_is_relayed_not_kept(aiohttp_server, aiohttp_client, tmp_path,
                                                                          monkeypatch):
    from pflash_proxy.server import relay
    monkeypatch.setattr(relay, "_MAX_SNIFF_BYTES", 64)  # the answer is ~180 bytes: relayed whole, never parsed
    seeing = Seeing()
    app = create_app(make_settings(await _chunked_upstream(aiohttp_server), tmp_path), stages=[seeing])
    client = await aiohttp_client(app)
    resp = await client.post("/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert await resp.json() == ANSWER
    assert seeing.seen == [None]
