"""Issue 13 item 4: the bytes of request bodies the proxy holds at once are bounded (``--max-pending-mb``).

A fake upstream that holds its answer (fault injection: a busy server) keeps the first request in flight."""

from __future__ import annotations

import asyncio

from aiohttp import web

from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import BODIES
from tests.conftest import make_settings


async def test_bodies_beyond_the_bound_get_429_and_are_admitted_again_later(aiohttp_client, tmp_path):
    release = asyncio.Event()

    async def slow(request):
        await request.read()
        await release.wait()
        return web.json_response({"ok": True})

    fake = web.Application()
    fake.router.add_post("/v1/embeddings", slow)
    upstream = await aiohttp_client(fake)
    settings = make_settings(str(upstream.make_url("")).rstrip("/"), tmp_path, sessions=False,
                             max_pending_mb=6000 / 2**20)  # 6,000 bytes
    proxy = await aiohttp_client(create_app(settings))
    body = b'{"input": "' + b"x" * 4000 + b'"}'

    first = asyncio.ensure_future(proxy.post("/v1/embeddings", data=body))
    for _ in range(100):
        if proxy.app[BODIES].used:
            break
        await asyncio.sleep(0.01)
    assert proxy.app[BODIES].used == len(body)
    second = await proxy.post("/v1/embeddings", data=body)
    assert second.status == 429 and int(second.headers["Retry-After"]) > 0
    assert (await second.json())["error"]["code"] == "queue_full"
    chunked = await proxy.post("/v1/embeddings", data=_chunks(body))  # counted as it arrives
    assert chunked.status == 429
    small = asyncio.ensure_future(proxy.post("/v1/embeddings", data=b'{"input": "hi"}'))  # fits beside it
    release.set()
    assert (await first).status == 200 and (await small).status == 200
    assert proxy.app[BODIES].used == 0
    again = await proxy.post("/v1/embeddings", data=body)
    assert again.status == 200
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["bodies"] == {"held_bytes": 0, "limit_bytes": 6000, "refused": 2}


async def _chunks(body: bytes):
    for i in range(0, len(body), 1000):
        yield body[i:i + 1000]
