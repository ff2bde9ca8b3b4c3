"""Progress comments keep a streaming client waiting through a slow slot wait or compression (issue 14)."""

from __future__ import annotations

import asyncio
import json

import pytest

from pflash_proxy.errors import BadRequest
from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import PIPELINE
from tests.conftest import make_settings

pytestmark = pytest.mark.llama


class SlowStage:
    """Fault injection: a compression (or drafter pass) that takes seconds, then maybe fails."""
    name = "slow"

    def __init__(self, seconds: float, fail: bool = False):
        self.seconds, self.fail = seconds, fail

    async def on_request(self, req):
        req.relay.progress = "compressing 12,345 tokens"
        await asyncio.sleep(self.seconds)
        if self.fail:
            raise BadRequest("too long after all", code="context_too_long")

    async def on_response(self, req, result):
        pass

    async def on_finish(self, req):
        pass

    def stats(self):
        return None


async def _proxy(aiohttp_client, llama_server, tmp_path, stage):
    app = create_app(make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir,
                                   progress_interval_s=0.5))
    client = await aiohttp_client(app)
    stages = client.server.app[PIPELINE].stages
    stages.insert(1, stage)  # after the session lease, like compression
    return client


async def test_a_slow_stage_sends_comments_then_the_stream(aiohttp_client, llama_server, tmp_path):
    proxy = await _proxy(aiohttp_client, llama_server, tmp_path, SlowStage(2.2))
    r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 4, "stream": True})
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    raw = (await r.read()).decode()
    comments = [line for line in raw.split("\n") if line.startswith(": pflash compressing 12,345 tokens")]
    assert len(comments) >= 3  # every 0.5 s from the 0.5 s mark
    first_data = raw.index("data: ")
    assert all(raw.index(c) < first_data for c in comments)
    assert "X-PFlash-Session=" in raw  # headers decided late travel as a comment
    assert raw.rstrip().endswith("data: [DONE]")
    events = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]
    assert any(c.get("delta", {}).get("content") for e in events for c in e.get("choices", []))


async def test_a_fast_request_is_not_touched(aiohttp_client, llama_server, tmp_path):
    proxy = await _proxy(aiohttp_client, llama_server, tmp_path, SlowStage(0.0))
    r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 4, "stream": True})
    raw = (await r.read()).decode()
    assert r.status == 200 and ": pflash" not in raw and "X-PFlash-Session" in r.headers


async def test_an_error_after_progress_is_an_error_event(aiohttp_client, llama_server, tmp_path):
    proxy = await _proxy(aiohttp_client, llama_server, tmp_path, SlowStage(1.2, fail=True))
    r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 4, "stream": True})
    raw = (await r.read()).decode()
    assert r.status == 200 and ": pflash" in raw
    err = next(json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {"))
    assert err["error"]["code"] == "context_too_long"
    assert raw.rstrip().endswith("data: [DONE]")


async def test_the_openai_sdk_streams_through_progress_comments(aiohttp_client, llama_server, tmp_path):
    from openai import AsyncOpenAI

    proxy = await _proxy(aiohttp_client, llama_server, tmp_path, SlowStage(1.5))
    client = AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="x")
    stream = await client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=4, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text
