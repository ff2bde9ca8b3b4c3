"""A message far over --max-prompt-tokens is refused from a prefix, never tokenized whole (the engine's counts are
spied on at the seam: ``LlamaServerEngine.count_text`` / ``pieces`` / ``count_prompt``)."""

from __future__ import annotations

import pytest

from pflash_proxy.llama.engine import LlamaServerEngine
from tests.conftest import make_settings
from tests.stages.test_compress_real import document

pytestmark = pytest.mark.llama


async def test_an_oversized_message_is_refused_from_a_prefix(aiohttp_client, llama_server, tmp_path, monkeypatch):
    from pflash_proxy.server.app import create_app

    seen: list[tuple[str, int]] = []
    count_text, pieces, count_prompt = (LlamaServerEngine.count_text, LlamaServerEngine.pieces,
                                        LlamaServerEngine.count_prompt)

    async def spy_count_text(self, text, **kw):
        seen.append(("tokenize", len(text)))
        return await count_text(self, text, **kw)

    async def spy_pieces(self, text):
        seen.append(("tokenize+pieces", len(text)))
        return await pieces(self, text)

    async def spy_count_prompt(self, body):
        seen.append(("input_tokens", 0))
        return await count_prompt(self, body)

    monkeypatch.setattr(LlamaServerEngine, "count_text", spy_count_text)
    monkeypatch.setattr(LlamaServerEngine, "pieces", spy_pieces)
    monkeypatch.setattr(LlamaServerEngine, "count_prompt", spy_count_prompt)
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             max_prompt_tokens=1500)
    proxy = await aiohttp_client(create_app(settings))
    huge = document() * 200  # ~1.4 M characters, ~500K tokens
    resp = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": huge}]})
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["code"] == "context_length_exceeded" and "1500" in err["message"]
    assert not any(kind == "input_tokens" or "pieces" in kind for kind, _ in seen), seen
    assert max(n for _, n in seen) < len(huge) // 10, seen  # only a sample and a prefix were tokenized


async def test_a_message_near_the_limit_is_still_counted_exactly(aiohttp_client, llama_server, tmp_path):
    from pflash_proxy.server.app import create_app

    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             max_prompt_tokens=3000, prefill_curve="1000:0.45 4000:0.35", query_pin=32)
    proxy = await aiohttp_client(create_app(settings))
    doc = document()  # ~2.5K tokens: bytes over the limit, tokens under it
    assert len(doc.encode()) > 3000
    resp = await proxy.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": doc + "\n\nWhat was the name of the silver eagle?"}],
        "max_tokens": 1, "temperature": 0})
    assert resp.status == 200, await resp.text()
    assert resp.headers["X-PFlash-Mode"] in ("compressed", "full-flat")


HISTORY_CASES = {
    "one-earlier-message": lambda big: [{"role": "user", "content": big}, {"role": "assistant", "content": "Noted."},
                                        {"role": "user", "content": "Summarise it."}],
    "thousands-of-messages": lambda big: [m for i in range(4000) for m in (
        {"role": "user", "content": big[i * 1000:(i + 1) * 1000]}, {"role": "assistant", "content": "ok"})]
    + [{"role": "user", "content": "Go on."}],
    "tool-call-arguments": lambda big: [{"role": "user", "content": "Write the file."},
                                        {"role": "assistant", "content": None, "tool_calls": [{
                                            "id": "c1", "type": "function", "function": {
                                                "name": "write", "arguments": '{"text": "%s"}' % big[:4_000_000]}}]},
                                        {"role": "tool", "tool_call_id": "c1", "content": "written"},
                                        {"role": "user", "content": "Done?"}],
}


@pytest.mark.parametrize("case", list(HISTORY_CASES))
async def test_a_history_over_the_limit_is_refused_whatever_turn_carries_it(aiohttp_client, llama_server, tmp_path,
                                                                           monkeypatch, case):
    """The bulk sits in earlier turns (one long message, 4,000 short ones, a tool call's arguments), the newest
    message is short: still a 400 ``context_length_exceeded``, after tokenizing about the limit's worth of it."""
    from pflash_proxy.server.app import create_app

    seen: list[int] = []
    count_text, pieces, count_prompt = (LlamaServerEngine.count_text, LlamaServerEngine.pieces,
                                        LlamaServerEngine.count_prompt)

    async def spy_count_text(self, text, **kw):
        seen.append(len(text))
        return await count_text(self, text, **kw)

    async def spy_pieces(self, text):
        seen.append(len(text))
        return await pieces(self, text)

    async def spy_count_prompt(self, body):
        seen.append(-1)
        return await count_prompt(self, body)

    monkeypatch.setattr(LlamaServerEngine, "count_text", spy_count_text)
    monkeypatch.setattr(LlamaServerEngine, "pieces", spy_pieces)
    monkeypatch.setattr(LlamaServerEngine, "count_prompt", spy_count_prompt)
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             max_prompt_tokens=2000)
    proxy = await aiohttp_client(create_app(settings))
    big = (document() * 1200)[:8_000_000]  # 8 MB of text
    messages = HISTORY_CASES[case](big)
    resp = await proxy.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert resp.status == 400, (await resp.text())[:300]
    err = (await resp.json())["error"]
    assert err["code"] == "context_length_exceeded" and "2000" in err["message"]
    assert -1 not in seen and sum(seen) <= 2 * 16384, seen  # one or two pieces of text, never the 8 MB


async def test_an_anthropic_history_over_the_limit_is_its_own_400(aiohttp_client, llama_server, tmp_path):
    from pflash_proxy.server.app import create_app

    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             max_prompt_tokens=2000)
    proxy = await aiohttp_client(create_app(settings))
    big = (document() * 300)[:2_000_000]
    resp = await proxy.post("/v1/messages", json={"model": "g", "max_tokens": 2, "messages": [
        {"role": "user", "content": big}, {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Summarise it."}]})
    assert resp.status == 400
    body = await resp.json()
    assert body["type"] == "error" and "--max-prompt-tokens" in body["error"]["message"]
