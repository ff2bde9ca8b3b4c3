"""Fault injection (no llama-server): an unexpected failure inside the proxy on a dialect route still answers in
that route's error dialect — Anthropic clients parse only ``{"type": "error", "error": {...}}``."""

from __future__ import annotations

import pytest

from pflash_proxy.server.app import create_app
from pflash_proxy.contract import Stage
from tests.conftest import make_settings


class Boom(Stage):
    name = "boom"

    async def on_request(self, req):
        raise RuntimeError("a bug in a stage")


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "m", "input": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
async def test_an_unexpected_error_is_a_500_in_the_routes_dialect(aiohttp_client, tmp_path, path, body):
    proxy = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path, sessions=False),
                                            stages=[Boom()]))
    resp = await proxy.post(path, json=body)
    assert resp.status == 500
    err = await resp.json()
    if path == "/v1/messages":
        assert err == {"type": "error", "error": {"type": "api_error", "message": "internal proxy error"}}
    else:
        assert err["error"]["code"] == "internal_error"
