"""A message far over --max-prompt-tokens is refused from a prefix, never tokenized whole (issue #26 item 5)."""

from __future__ import annotations

import pytest

from pflash_proxy.llama.upstream import Upstream
from tests.conftest import make_settings
from tests.stages.test_compress_real import document

pytestmark = pytest.mark.llama


async def test_an_oversized_message_is_refused_from_a_prefix(aiohttp_client, llama_server, tmp_path, monkeypatch):
    from pflash_proxy.server.app import create_app

    seen: list[tuple[str, int]] = []
    tokenize, input_tokens = Upstream.tokenize, Upstream.input_tokens

    async def spy_tokenize(self, text, **kw):
        seen.append(("tokenize" + ("+pieces" if kw.get("with_pieces") else ""), len(text)))
        return await tokenize(self, text, **kw)

    async def spy_input_tokens(self, body):
        seen.append(("input_tokens", 0))
        return await input_tokens(self, body)

    monkeypatch.setattr(Upstream, "tokenize", spy_tokenize)
    monkeypatch.setattr(Upstream, "input_tokens", spy_input_tokens)
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
