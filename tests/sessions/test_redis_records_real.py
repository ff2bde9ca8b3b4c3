"""Nothing a writer of the shared Redis plants runs in a node: one node in-process, a real redis-server, the real
llama-server.

A conversation is served and stored; then its session record, a response record, its snapshot record and a
second session's record are replaced, straight in Redis, by a pickle whose ``__reduce__`` would create a file,
and by values that are not records (a pickled number, JSON of another shape, a Redis list under a record key).
The node then continues the conversation (looked up by its chain: the record reads as absent, the turn is answered
as a new session), lists ``/pflash/stats``, the inspector's overview and session list, and ``pflash-proxy ls``
reads the same index: every answer is 200 (ls exits 0), and the file is never created.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys

import pytest

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings
from tests.redis_server import RedisServer, binary

pytestmark = [pytest.mark.llama, pytest.mark.skipif(binary() is None, reason="redis-server not installed")]

GEN = {"max_tokens": 2, "temperature": 0}


class CreatesFile:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer.start(tmp_path / "redis")
    yield server
    server.stop()


async def test_a_planted_pickle_never_runs_and_the_turn_is_answered(aiohttp_client, llama_server, tmp_path,
                                                                    redis_server):
    import redis

    marker = tmp_path / "pwned"
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir,
                             index=redis_server.url, node_id="here", heartbeat_s=0.5)
    client = await aiohttp_client(create_app(settings))
    msgs = [{"role": "user", "content": "Name a colour of the rainbow."}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
    assert r.status == 200
    sid = r.headers["X-PFlash-Session"]
    r2 = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Other."}], **GEN})
    other = r2.headers["X-PFlash-Session"]
    resp = await client.post("/v1/responses", json={"model": "g", "input": "Say hi.", "max_output_tokens": 2})
    assert resp.status == 200
    rid = (await resp.json())["id"]

    raw = redis.Redis.from_url(redis_server.url)
    assert raw.get(f"pflash:session:{sid}").startswith(b"{")  # stored as JSON
    evil = pickle.dumps(CreatesFile(str(marker)))
    raw.set(f"pflash:session:{sid}", evil)
    raw.set(f"pflash:response:{rid}", evil)
    raw.set(f"pflash:snapshot:{sid}", evil)
    raw.sadd("pflash:snapshots", sid)
    raw.set(f"pflash:session:{other}", pickle.dumps(5))  # not a record at all (was a TypeError, a 500)
    raw.zadd("pflash:used", {"planted": 1.0})
    raw.rpush("pflash:session:planted", "not", "a", "string")  # a Redis list where a record belongs

    msgs += [(await r.json())["choices"][0]["message"], {"role": "user", "content": "And another one?"}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, **GEN})
    assert r.status == 200, await r.text()
    assert r.headers["X-PFlash-Session"] != sid  # the record read as absent: served as a new session
    r = await client.post("/v1/responses", json={"model": "g", "previous_response_id": rid, "input": "Again.",
                                                 "max_output_tokens": 2})
    assert r.status in (200, 400, 404), await r.text()  # an unknown previous response, never a 5xx
    for path in ("/pflash/stats", "/pflash/api/overview", "/pflash/api/sessions", f"/pflash/api/sessions/{sid}"):
        r = await client.get(path)
        assert r.status in (200, 404) and (r.status == 200 or path.endswith(sid)), (path, r.status, await r.text())
    listing = await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
        [sys.executable, "-m", "pflash_proxy.cli", "ls", "--index", redis_server.url], capture_output=True,
        text=True, timeout=60, env={**os.environ, "PFLASH_HOME": str(tmp_path / "home"),
                                    "PFLASH_SLOT_SAVE_PATH": str(llama_server.slot_dir)}))
    assert listing.returncode == 0, listing.stderr
    assert "Traceback" not in listing.stderr
    raw.close()
    assert not marker.exists()
