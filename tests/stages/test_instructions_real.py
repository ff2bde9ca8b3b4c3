"""The agent's instructions are never shortened, and a long-looking short message never shields a long one.

Real llama-server, threshold ~1K tokens (issue #25 item 1: opencode's system prompt was cut on a first turn; a
Codex developer message of 2.5K chars shielded its 17K-char one).
"""

from __future__ import annotations

import pytest

from tests.conftest import make_settings
from tests.stages.test_compress_real import SAMPLING, document, served_message

pytestmark = pytest.mark.llama

INSTRUCTIONS = "\n".join(
    f"- Rule {i}: when the user asks about the {t} archive, answer in {i % 4 + 2} sentences and cite the "
    f"{t} ledger by its shelf number; never invent a shelf for the {t} records."
    for i, t in enumerate(["glacier", "violin", "harbour", "orchard", "telescope", "bakery", "railway",
                           "lighthouse", "vineyard", "monastery", "observatory", "foundry"] * 3))


@pytest.fixture
async def proxy(aiohttp_client, llama_server, tmp_path):
    from pflash_proxy.server.app import create_app

    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             prefill_curve="1000:0.45 4000:0.35", query_pin=32)
    return await aiohttp_client(create_app(settings))


async def post(proxy, messages):
    resp = await proxy.post("/v1/chat/completions", json={"messages": messages, **SAMPLING})
    body = await resp.json()
    assert resp.status == 200, body
    return resp.headers, body


@pytest.mark.parametrize("role", ["system", "developer"])
async def test_a_long_system_or_developer_message_is_never_shortened(proxy, role):
    assert len(INSTRUCTIONS) > 4 * 1000  # bytes alone make it a candidate; it is > 1,000 tokens too
    messages = [{"role": role, "content": INSTRUCTIONS}, {"role": "user", "content": "Which rules are there?"}]
    h, body = await post(proxy, messages)
    assert h["X-PFlash-Mode"] == "passthrough"
    assert body["usage"]["prompt_tokens"] > 1000
    assert served_message(proxy, h["X-PFlash-Session"], 0) == INSTRUCTIONS


async def test_the_user_paste_beside_a_long_system_prompt_is_the_one_shortened(proxy):
    doc, question = document(), "What was the name of the silver eagle, the prize bird?"
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": doc + "\n\n" + question}]
    h, _ = await post(proxy, messages)
    assert h["X-PFlash-Mode"] == "compressed"
    assert served_message(proxy, h["X-PFlash-Session"], 0) == INSTRUCTIONS
    assert served_message(proxy, h["X-PFlash-Session"], 1) != doc + "\n\n" + question


async def test_a_message_long_in_bytes_but_short_in_tokens_does_not_shield_a_long_one(proxy):
    doc = document()
    # ~1,500 bytes (over the 1,000 threshold in bytes) but far fewer than 1,000 tokens: the newer message is
    # a candidate by its byte bound only; the earlier paste of this same turn is the long one.
    short = "The silver eagle, the prize bird. " * 40
    assert len(short.encode()) > 1000
    question = "What was the name of the silver eagle, the prize bird?"
    messages = [{"role": "user", "content": doc}, {"role": "user", "content": short + question}]
    h, _ = await post(proxy, messages)
    assert h["X-PFlash-Mode"] == "compressed"
    assert served_message(proxy, h["X-PFlash-Session"], 0) != doc
    assert served_message(proxy, h["X-PFlash-Session"], 1) == short + question
