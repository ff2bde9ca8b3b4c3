"""Issue 13 item 4: the bytes of request bodies the proxy holds at once are bounded (``--max-pending-mb``).
Issue 26 item 6: they are counted as they arrive (not as declared), and a body must arrive within
``--body-timeout-s`` (408, connection closed), so idle or trickling uploads cannot hold the budget.

A fake upstream that holds its answer (fault injection: a busy server) keeps the first request in flight; raw
sockets play the slow clients (bodies are read before any upstream is involved)."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web
from aiohttp.test_utils import TestServer

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


async def test_idle_and_trickling_bodies_hold_nothing_and_get_408_at_the_body_timeout(aiohttp_client, tmp_path):
    async def ok(request):
        return web.json_response({"ok": len(await request.read())})

    fake = web.Application()
    fake.router.add_post("/v1/embeddings", ok)
    fake.router.add_post("/v1/chat/completions", ok)
    upstream = await aiohttp_client(fake)
    settings = make_settings(str(upstream.make_url("")).rstrip("/"), tmp_path, sessions=False,
                             max_pending_mb=1, body_timeout_s=3)
    # aiohttp reads and drops what a timed-out client still sends for lingering_time (10 s by default), then closes
    server = TestServer(create_app(settings))
    await server.start_server(lingering_time=0.5)
    proxy = await aiohttp_client(server)
    first = b'{"input": "'
    slow = []
    started = time.monotonic()
    for path in ["/v1/embeddings"] * 8 + ["/v1/chat/completions"] * 8:  # 16 x 32 MB declared, budget 1 MB
        reader, writer = await asyncio.open_connection(proxy.server.host, proxy.server.port)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {32 * 2**20}\r\n\r\n".encode() + first)
        await writer.drain()
        slow.append((reader, writer))
    for _ in range(300):  # every handler is reading its body, and counts what arrived
        if proxy.app[BODIES].used >= 16 * len(first):
            break
        await asyncio.sleep(0.01)
    assert proxy.app[BODIES].used == 16 * len(first)

    async def trickle(writer):  # one byte every 0.2 s: a gap between chunks never reaches the timeout
        try:
            while True:
                await asyncio.sleep(0.2)
                writer.write(b"x")
                await writer.drain()
        except (ConnectionError, RuntimeError):
            pass

    trickling = [asyncio.ensure_future(trickle(w)) for _, w in slow[::2]]
    for path, body in (("/v1/embeddings", {"input": "hi"}),  # other clients are not affected
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        small = await proxy.post(path, json=body)
        assert small.status == 200, await small.text()
    assert time.monotonic() - started < 3  # (all before the slow ones time out)

    async def answer(reader, writer):  # read at once: a trickler's late byte may get a reset after the close
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode().lower().split("\r\n")
        length = int(next(ln.split(":")[1] for ln in lines if ln.startswith("content-length:")))
        err = json.loads(await reader.readexactly(length))["error"]
        try:
            rest = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:
            rest = b""
        writer.close()
        return lines, err, rest

    for lines, err, rest in await asyncio.gather(*(answer(r, w) for r, w in slow)):
        assert lines[0].startswith("http/1.1 408"), lines
        assert "connection: close" in lines
        assert err["code"] == "body_timeout" and "--body-timeout-s" in err["message"]
        assert rest == b""  # and the connection is closed
    assert time.monotonic() - started >= 3
    for t in trickling:
        t.cancel()
    assert proxy.app[BODIES].used == 0
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["bodies"]["refused"] == 0
