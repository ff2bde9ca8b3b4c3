"""A client that gives up: the proxy's upstream request ends with it (issue 26 item 10), against a fake upstream
whose own handler sees its connection close, so the proxy's part is timed without llama-server's polling."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import METRICS
from tests.conftest import make_settings


def never_answering(events: list) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/props":
            return web.json_response({"total_slots": 2, "model_path": "fake.gguf",
                                      "default_generation_settings": {"n_ctx": 4096}})
        if request.path == "/slots":
            return web.json_response([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": False}])
        if request.path != "/completion":
            return web.json_response({})
        body = await request.json()
        events.append(("forwarded", time.monotonic()))
        try:
            if body.get("stream"):
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                while True:
                    await resp.write(b'data: {"content": "x"}\n\n')
                    await asyncio.sleep(0.05)
            await asyncio.sleep(3600)  # a whole answer that never comes
        except asyncio.CancelledError:  # the test server cancels a handler whose client left
            events.append(("closed", time.monotonic()))
            raise
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_the_upstream_request_is_closed_as_soon_as_the_client_leaves(aiohttp_server, aiohttp_client, tmp_path,
                                                                          stream):
    events: list = []
    up = await aiohttp_server(never_answering(events))
    proxy = await aiohttp_client(create_app(make_settings(str(up.make_url("")), tmp_path)))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as client:
        with pytest.raises(asyncio.TimeoutError):
            async with client.post(proxy.make_url("/completion"),
                                   json={"prompt": "x", "n_predict": -1, "stream": stream}) as resp:
                await resp.read()
    left = time.monotonic()
    while not any(e[0] == "closed" for e in events) and time.monotonic() - left < 2:
        await asyncio.sleep(0.05)
    kinds = [e[0] for e in events]
    assert kinds == ["forwarded", "closed"]
    assert events[1][1] - left < 0.5  # at once: not after the answer, not after a timeout


async def test_a_client_that_leaves_before_its_answer_is_counted_499_not_500(aiohttp_server, aiohttp_client,
                                                                            tmp_path, caplog):
    events: list = []
    up = await aiohttp_server(never_answering(events))
    proxy = await aiohttp_client(create_app(make_settings(str(up.make_url("")), tmp_path)))
    for path, body in (("/completion", {"prompt": "x", "n_predict": -1}), ("/completion", {"prompt": "y"})):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as client:
            with pytest.raises(asyncio.TimeoutError):
                async with client.post(proxy.make_url(path), json=body) as resp:
                    await resp.read()
    metrics = proxy.server.app[METRICS]
    deadline = time.monotonic() + 3
    while metrics.by_status.get(499, 0) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert metrics.by_status.get(499) == 2 and 500 not in metrics.by_status, dict(metrics.by_status)
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["requests"]["by_status"].get("499") == 2 and "500" not in stats["requests"]["by_status"]
    text = await (await proxy.get("/pflash/metrics")).text()
    assert 'status="499"' in text and 'status="500"' not in text
