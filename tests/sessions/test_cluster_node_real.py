"""One node of a cluster (``sessions/cluster.py``) in-process, against a real llama-server and a real redis-server.

1. A session whose recorded holder is another node with a live heartbeat but nobody listening at its URL: the
   forward is refused, the turn is served here as a takeover (``X-PFlash-Takeover``, no ``X-PFlash-Via``), the
   node is counted as a failed forward, and this node is the holder afterwards.
2. A session whose turn lease another node holds: the turn waits (it is not answered before the lease is freed),
   then runs; ``turn_waits`` counts it, and the lease is free again after the turn.
3. A turn forwarded to this node (``X-PFlash-Forwarded-By``) is served here even though the index names another
   live node as the holder (no forwarding loop), and counted as forwarded in. A clean stop saves the session and
   removes the node's heartbeat at once.
4. A missed session's snapshot record is read from a slow shared index in a worker thread: ``/health``, polled
   from another thread meanwhile, never waits behind it.
5. Only the cluster's own nodes: a client's ``X-PFlash-Forwarded-By`` (unsigned, or signed with another secret)
   is not honoured: the turn is forwarded to the live holder (a recording node with a signed heartbeat) as any
   other, which receives a mark this node signed and never the client's; ``forwarded_in`` stays 0. A holder whose
   heartbeat in Redis names a URL without the cluster's signature (what a Redis writer can plant) never gets the
   turn, nor the client's ``Authorization``: the turn is served here, and that URL receives nothing.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from pflash_proxy.sessions.stats import ClusterStats, SessionStats
from pflash_proxy.llama.spawn import free_port
from pflash_proxy.server.app import create_app
from pflash_proxy.sessions.cluster import sign_forward, sign_heartbeat, verify_forward
from pflash_proxy.sessions.index.redis import RedisIndex
from tests.conftest import make_settings
from tests.redis_server import RedisServer, binary

pytestmark = [pytest.mark.llama, pytest.mark.skipif(binary() is None, reason="redis-server not installed")]

GEN = {"max_tokens": 2, "temperature": 0}
SECRET = "test-cluster-secret-0123456789"
AUTH = {"Authorization": "Bearer client-key"}


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer.start(tmp_path / "redis")
    yield server
    server.stop()


async def make_node(aiohttp_client, llama_server, tmp_path, redis_url, index=None):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, index=redis_url,
                             node_id="here", heartbeat_s=0.5, cluster_secret=SECRET)
    app = create_app(settings, index=index)  # index: the test's own (a fault-injecting one), else --index's
    client = await aiohttp_client(app)
    return client, app


def stats_of(app) -> ClusterStats:
    """This node's cluster counters (the session service's stats, as ``/pflash/stats`` reads them)."""
    from pflash_proxy.server.control import collect_stats

    sessions = collect_stats(app).stage(SessionStats)
    assert sessions is not None and sessions.cluster is not None
    return sessions.cluster


async def test_a_holder_that_does_not_answer_is_taken_over(aiohttp_client, llama_server, tmp_path, redis_server):
    client, app = await make_node(aiohttp_client, llama_server, tmp_path, redis_server.url)
    index = RedisIndex(redis_server.url)
    msgs = [{"role": "user", "content": "Count the apples in the orchard, please."}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
    assert r.status == 200 and r.headers["X-PFlash-Node"] == "here"
    sid = r.headers["X-PFlash-Session"]
    assert index.holder(sid) == "here"
    msgs += [(await r.json())["choices"][0]["message"], {"role": "user", "content": "And the pears?"}]
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    index.heartbeat("ghost", sign_heartbeat(SECRET, "ghost", dead), 60_000)
    assert index.claim(sid, "ghost", "here") == "ghost"
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
    assert r.status == 200, await r.text()
    assert r.headers["X-PFlash-Takeover"] == "ghost" and r.headers["X-PFlash-Node"] == "here"
    assert "X-PFlash-Via" not in r.headers and r.headers["X-PFlash-Session"] == sid
    assert r.headers["X-PFlash-Cache"] in ("hit", "restored")  # its slot here still held it
    s = stats_of(app)
    assert (s.forward_failures, s.forwarded_out, s.takeovers) == (1, 0, 1)
    assert index.holder(sid) == "here"
    index.close()


async def test_a_turn_waits_for_the_lease_another_node_holds(aiohttp_client, llama_server, tmp_path, redis_server):
    client, app = await make_node(aiohttp_client, llama_server, tmp_path, redis_server.url)
    index = RedisIndex(redis_server.url)
    msgs = [{"role": "user", "content": "Which river runs through the valley?"}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
    sid = r.headers["X-PFlash-Session"]
    msgs += [(await r.json())["choices"][0]["message"], {"role": "user", "content": "How long is it?"}]
    assert index.acquire_turn(sid, "elsewhere/1", 60_000)
    task = asyncio.create_task(client.post("/v1/chat/completions", json={"messages": msgs, **GEN}))
    await asyncio.sleep(1.5)
    assert not task.done(), "the turn ran while another node held the session's turn"
    assert index.release_turn(sid, "elsewhere/1")
    r = await asyncio.wait_for(task, 120)
    assert r.status == 200 and r.headers["X-PFlash-Session"] == sid
    assert stats_of(app).turn_waits == 1
    for _ in range(50):  # freed in on_finish, just after the answer
        if index.turn_holder(sid) is None:
            break
        await asyncio.sleep(0.1)
    assert index.turn_holder(sid) is None
    index.close()


async def test_a_forwarded_turn_is_served_here(aiohttp_client, llama_server, tmp_path, redis_server):
    client, app = await make_node(aiohttp_client, llama_server, tmp_path, redis_server.url)
    index = RedisIndex(redis_server.url)
    msgs = [{"role": "user", "content": "Name the tallest tower in the old town."}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
    sid = r.headers["X-PFlash-Session"]
    msgs += [(await r.json())["choices"][0]["message"], {"role": "user", "content": "Who built it?"}]
    index.heartbeat("other", sign_heartbeat(SECRET, "other", f"http://127.0.0.1:{free_port()}"), 60_000)
    index.claim(sid, "other", "here")
    raw = json.dumps({"messages": msgs, **GEN}).encode()
    mark = sign_forward(SECRET, "other", "POST", "/v1/chat/completions", raw, time.time())
    r = await client.post("/v1/chat/completions", data=raw, headers={"X-PFlash-Forwarded-By": mark,
                                                                     "Content-Type": "application/json"})
    assert r.status == 200 and r.headers["X-PFlash-Node"] == "here" and r.headers["X-PFlash-Takeover"] == "other"
    s = stats_of(app)
    assert (s.forwarded_in, s.forwarded_out, s.forward_failures) == (1, 0, 0)
    assert "here" in index.nodes()
    await client.close()  # a clean stop: resident sessions saved, then the heartbeat removed at once
    assert "here" not in index.nodes() and index.snapshot(sid) is not None
    index.close()


async def test_a_slow_shared_index_does_not_stall_the_event_loop_on_a_miss(aiohttp_client, llama_server, tmp_path,
                                                                           redis_server):
    """The snapshot record of a missed session is read from the shared index (a network round trip, and a stat on
    the shared directory) in a worker thread: a slow index delays that turn, not every other request."""
    import threading
    import time
    import urllib.request

    store = RedisIndex(redis_server.url)  # the node's index, slowed below
    client, app = await make_node(aiohttp_client, llama_server, tmp_path, redis_server.url, index=store)
    read = store.snapshot

    def slow_snapshot(sid):  # fault injection: an index 0.8 s away
        time.sleep(0.8)
        return read(sid)
    store.snapshot = slow_snapshot
    health, done, waits = str(client.make_url("/health")), threading.Event(), []

    def poll() -> None:  # from another thread: the test client shares the proxy's loop and would not see a stall
        while not done.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(health, timeout=10) as resp:
                assert resp.status == 200
            waits.append(time.perf_counter() - t0)
            time.sleep(0.05)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        r = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Name a mountain."}], **GEN})
    finally:
        done.set()
    await asyncio.get_running_loop().run_in_executor(None, poller.join, 10)
    assert r.status == 200 and r.headers["X-PFlash-Cache"] == "miss"
    assert len(waits) >= 5 and max(waits) < 0.4, f"/health waited {max(waits):.2f} s behind the shared index"


async def recording_node(aiohttp_server, seen: list):
    """A node that answers every chat turn at once and records the headers it got."""
    async def handler(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.read()))
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                               "finish_reason": "stop"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return await aiohttp_server(app)


async def _held_elsewhere(client, index, node: str, heartbeat: str, n: int = 0) -> list:
    """A session started here (with the credential the turns will carry), then held by ``node``."""
    msgs = [{"role": "user", "content": f"Which bridge crosses harbour number {n}?"}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN}, headers=AUTH)
    sid = r.headers["X-PFlash-Session"]
    index.heartbeat(node, heartbeat, 60_000)
    assert index.claim(sid, node, "here") == node
    return msgs + [(await r.json())["choices"][0]["message"], {"role": "user", "content": "When was it built?"}]


async def test_a_clients_forwarding_header_is_not_honoured(aiohttp_client, aiohttp_server, llama_server, tmp_path,
                                                          redis_server):
    client, app = await make_node(aiohttp_client, llama_server, tmp_path, redis_server.url)
    index = RedisIndex(redis_server.url)
    seen: list = []
    other = await recording_node(aiohttp_server, seen)
    url = str(other.make_url("")).rstrip("/")
    msgs = await _held_elsewhere(client, index, "other", sign_heartbeat(SECRET, "other", url))
    raw = json.dumps({"messages": msgs, **GEN}).encode()
    forged = ["other", "other;%d;%s" % (time.time(), "0" * 64),
              sign_forward("another-secret-0123456789", "other", "POST", "/v1/chat/completions", raw, time.time())]
    for n, mark in enumerate(forged, 1):
        r = await client.post("/v1/chat/completions", data=raw, headers={
            "X-PFlash-Forwarded-By": mark, "Content-Type": "application/json", **AUTH})
        assert r.status == 200, await r.text()
        assert r.headers.get("X-PFlash-Via") == "here" and "X-PFlash-Takeover" not in r.headers
        assert len(seen) == n  # forwarded to the holder, not served (and taken over) here
        headers, body = seen[-1]
        assert headers["X-PFlash-Forwarded-By"] != mark and body == raw
        assert verify_forward(SECRET, [headers["X-PFlash-Forwarded-By"]], "POST", "/v1/chat/completions", body,
                              time.time()) == "here"
    s = stats_of(app)
    assert (s.forwarded_in, s.forwarded_out) == (0, 3)
    index.close()


async def test_a_url_planted_in_redis_never_gets_a_turn(aiohttp_client, aiohttp_server, llama_server, tmp_path,
                                                        redis_server):
    client, app = await make_node(aiohttp_client, llama_server, tmp_path, redis_server.url)
    index = RedisIndex(redis_server.url)
    seen: list = []
    mallory = await recording_node(aiohttp_server, seen)
    planted = str(mallory.make_url("")).rstrip("/")
    values = (planted, f"{planted} sig={'0' * 64}", sign_heartbeat("another-secret-0123456789", "m", planted))
    for n, value in enumerate(values):
        msgs = await _held_elsewhere(client, index, "m", value, n)
        r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN}, headers=AUTH)
        assert r.status == 200, await r.text()
        assert r.headers["X-PFlash-Node"] == "here" and r.headers["X-PFlash-Takeover"] == "m"
        assert "X-PFlash-Via" not in r.headers
    assert seen == []  # not one request, so no client credential, reached the planted URL
    s = stats_of(app)
    assert s.forwarded_out == 0 and s.foreign_holders == 3 and "m" not in s.nodes
    index.close()
