"""Anthropic Messages through the proxy, with the real ``anthropic`` SDK and the real llama-server (gemma).

1. A streamed answer's ``message_start.usage`` holds the prompt's real counts (llama-server's own /v1/messages
   does; the proxy's translation used to send 0) and they equal the counts the stream ends with, on a cold
   turn and on a turn served from the slot's cache.
2. The reasoning fields Claude Code sends (``thinking``, ``output_config``, ``context_management``) are mapped
   or dropped without breaking the request, streamed or not.
3. For a base model the proxy spawned (``Upstream.turn_cap``), a request asking more than the cap gets an answer
   of at most the cap that ends its turn (``end_turn``, ``X-PFlash-Turn-Cap``); without the rule the same stop
   is ``max_tokens``.
"""

from __future__ import annotations

import json
import uuid

import pytest

from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import UPSTREAM
from tests.conftest import make_settings

pytestmark = pytest.mark.llama


@pytest.fixture
async def proxy(aiohttp_client, llama_server, tmp_path):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir)
    return await aiohttp_client(create_app(settings))


async def _stream(client, **kw) -> tuple[dict, dict, str]:
    """(message_start usage, final usage, text) of one streamed /v1/messages call."""
    start, final, text = {}, {}, ""
    async with client.messages.stream(model="gemma", max_tokens=3, extra_body={"temperature": 0, "top_k": 1},
                                     **kw) as stream:
        async for event in stream:
            if event.type == "message_start":
                start = event.message.usage.model_dump()
            elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = (await stream.get_final_message()).usage.model_dump()
    return start, final, text


async def test_message_start_carries_the_real_input_tokens(proxy):
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=str(proxy.make_url("/")), api_key="unused", max_retries=0)
    meta = {"user_id": f"usage-{uuid.uuid4()}"}
    history = [{"role": "user", "content": "Tell me one fact about lighthouses and harbours, briefly. " * 8}]
    start, final, text = await _stream(client, system="Be brief.", messages=history, metadata=meta)
    assert start["input_tokens"] > 100  # the cold prompt, counted before the first token
    assert start["input_tokens"] == final["input_tokens"]
    assert start["cache_read_input_tokens"] == final["cache_read_input_tokens"]
    # the next turn of the same session: most of the prompt comes from the slot's cache
    history += [{"role": "assistant", "content": text or "ok"}, {"role": "user", "content": "And another?"}]
    start2, final2, _ = await _stream(client, system="Be brief.", messages=history, metadata=meta)
    assert start2["cache_read_input_tokens"] > 100 and start2["input_tokens"] > 0
    assert (start2["input_tokens"], start2["cache_read_input_tokens"]) == \
        (final2["input_tokens"], final2["cache_read_input_tokens"])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("fields", [
    {"thinking": {"type": "adaptive"}, "output_config": {"effort": "medium"},
     "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
    {"thinking": {"type": "enabled", "budget_tokens": 1024}},
    {"thinking": {"type": "disabled"}, "output_config": {"effort": "max"}},
], ids=["claude-code", "enabled", "disabled"])
async def test_reasoning_fields_are_honoured_or_dropped_without_error(proxy, fields, stream):
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=str(proxy.make_url("/")), api_key="unused", max_retries=0)
    args = dict(model="gemma", max_tokens=2, messages=[{"role": "user", "content": "Say hi."}], extra_body=fields)
    if stream:
        async with client.messages.stream(**args) as s:
            msg = await s.get_final_message()
    else:
        msg = await client.messages.create(**args)
    assert msg.stop_reason in ("max_tokens", "end_turn") and msg.usage.input_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("cap", [6, 0], ids=["spawned-base-model", "no-rule"])
async def test_a_spawned_base_models_cap_ends_the_turn(aiohttp_client, llama_server, tmp_path, cap, stream):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir)
    app = create_app(settings)
    app[UPSTREAM].turn_cap = cap  # what the supervisor sets for a spawned base model (llama/spawn.py, step 3)
    proxy = await aiohttp_client(app)
    body = {"model": "gemma", "max_tokens": 128000 if cap else 6, "stream": stream, "temperature": 0, "top_k": 1,
            "messages": [{"role": "user", "content": "Count from one to one hundred in words: one, two, three,"}]}
    r = await proxy.post("/v1/messages", json=body)
    assert r.status == 200
    assert r.headers.get("X-PFlash-Turn-Cap") == (str(cap) if cap else None)
    if stream:
        events = [json.loads(line[6:]) for line in (await r.text()).splitlines() if line.startswith("data: ")]
        delta = next(e for e in events if e["type"] == "message_delta")
        reason, tokens = delta["delta"]["stop_reason"], delta["usage"]["output_tokens"]
    else:
        msg = await r.json()
        reason, tokens = msg["stop_reason"], msg["usage"]["output_tokens"]
    assert tokens == 6
    assert reason == ("end_turn" if cap else "max_tokens")
