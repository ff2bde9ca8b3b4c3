"""Issue 50 item 6: bytes that are not UTF-8, planted anywhere in the shared Redis, read as absent, everywhere.

On 19528cf non-UTF-8 bytes under a session's ``holder:`` key failed every turn of that session with a 500 on every
node, under a ``node:`` key the inspector's overview and session list answered 500/503, and ``pflash-proxy ls``
crashed. The decoding layer of the index (``redis._text``) now reads such bytes as absent, so every reader
(turns, the inspector, ``ls``) gets what it gets for a missing key.

First every read of ``RedisIndex`` against a real redis-server with bad bytes under each kind of key and in each
kind of member (no llama-server needed); then one node in-process with the real llama-server: the session's next
turn, the inspector and ``ls``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.index import SnapshotRecord
from pflash_proxy.sessions.index.redis import RedisIndex
from tests.redis_server import RedisServer, binary

pytestmark = pytest.mark.skipif(binary() is None, reason="redis-server not installed (scripts/setup.sh)")

BAD = b"\xff\xfe\x80 not utf-8 \xc3"
GEN = {"max_tokens": 2, "temperature": 0}


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer.start(tmp_path / "redis")
    yield server
    server.stop()


def test_bad_bytes_under_every_key_kind_read_as_absent(redis_server):
    import redis

    index = RedisIndex(redis_server.url)
    raw = redis.Redis.from_url(redis_server.url)
    try:
        rec = index.new_session("seed", False)
        hello = [{"role": "user", "content": "hello"}]
        index.save_session(rec, [message_hash(m) for m in hello], hello)
        index.put_snapshot(SnapshotRecord(session=rec.id, file=f"pf-{rec.id}.bin", tokens=5, served_hashes=["h1"],
                                          model_identity="m", size=10))
        index.put_response("r1", {"session": rec.id, "items": []})
        index.heartbeat("n1", "http://127.0.0.1:1", 60_000)
        sid = rec.id
        # the values of a session's holder, its turn lease, a node's URL, a chain entry, the records
        raw.set(f"pflash:holder:{sid}", BAD)
        raw.set(f"pflash:turn:{sid}", BAD)
        raw.set("pflash:node:n1", BAD)
        raw.set("pflash:chain:planted", BAD)
        for key in ("session:planted", "served:planted:0", "recall:planted", "traces:planted",
                    "trace-part:planted:k", "snapshot:planted", "response:planted"):
            raw.set(f"pflash:{key}", BAD)
        # keys and members whose bytes are not UTF-8
        raw.set(b"pflash:holder:" + BAD, b"n1")
        raw.set(b"pflash:node:" + BAD, b"http://127.0.0.1:2")
        raw.zadd("pflash:used", {BAD: 1.0})
        raw.sadd("pflash:snapshots", BAD, "planted")
        raw.rpush(f"pflash:responses:{sid}", BAD)

        assert index.holder(sid) is None
        assert index.turn_holder(sid) is None
        assert index.node_url("n1") is None
        assert index.nodes() == {}  # n1's URL unreadable, the other's name unreadable
        assert index.holders() == {}
        assert index.last_response(sid) is None
        assert set(index.last_uses()) == {sid}
        assert [r.id for r in index.sessions()] == [sid]
        assert index.count_sessions() == 2  # Redis's own count of the sorted set: a number, nothing decoded
        assert [s.session for s in index.snapshots()] == [sid]
        for key in ("planted",):
            assert index.get(key) is None and index.snapshot(key) is None and index.response(key) is None
            assert index.trace_log(key) is None
        found, n, _ = index.lookup("seed", hello)
        assert found is not None and found.id == sid and n == 1
        # a claim takes over a holder that reads as absent, as it would an absent one
        assert index.claim(sid, "n2", index.holder(sid)) == "n2"
        assert index.holder(sid) == "n2"
        assert index.prune(older_than=None, max_sessions=0) == [sid]
    finally:
        raw.close()
        index.close()


@pytest.mark.llama
async def test_a_node_serves_the_session_the_inspector_and_ls_answer(aiohttp_client, llama_server, tmp_path,
                                                                     redis_server):
    import redis

    from pflash_proxy.server.app import create_app
    from tests.conftest import make_settings

    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir,
                             index=redis_server.url, node_id="here", heartbeat_s=0.5)
    client = await aiohttp_client(create_app(settings))
    msgs = [{"role": "user", "content": "Name a colour of the rainbow."}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
    assert r.status == 200
    sid = r.headers["X-PFlash-Session"]
    raw = redis.Redis.from_url(redis_server.url)
    try:
        raw.set(f"pflash:holder:{sid}", BAD)
        raw.set("pflash:node:here-too", BAD)
        raw.set(b"pflash:node:" + BAD, b"http://127.0.0.1:2")
        raw.zadd("pflash:used", {BAD: 1.0})
        raw.sadd("pflash:snapshots", BAD)
        msgs += [(await r.json())["choices"][0]["message"], {"role": "user", "content": "And another one?"}]
        for _ in range(2):  # every turn of the session, not only the first after the planting
            r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
            assert r.status == 200, await r.text()
            assert r.headers["X-PFlash-Session"] == sid  # the same session, served here
            msgs += [(await r.json())["choices"][0]["message"], {"role": "user", "content": "Once more?"}]
        for path in ("/pflash/stats", "/pflash/api/overview", "/pflash/api/sessions", f"/pflash/api/sessions/{sid}"):
            r = await client.get(path)
            assert r.status == 200, (path, r.status, await r.text())
        listing = await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
            [sys.executable, "-m", "pflash_proxy.cli", "ls", "--index", redis_server.url], capture_output=True,
            text=True, timeout=60, env={**os.environ, "PFLASH_HOME": str(tmp_path / "home"),
                                        "PFLASH_SLOT_SAVE_PATH": str(llama_server.slot_dir)}))
        assert listing.returncode == 0, listing.stderr
        assert "Traceback" not in listing.stderr
    finally:
        raw.close()
