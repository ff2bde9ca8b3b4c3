"""Cache isolation between credentials against a real llama-server (one slot, so every request shares it).

Credential A's session leaves its KV in the slot; credential B's request with the same long opening lands on that
slot. Under ``--cache-isolation credential`` llama-server reuses none of A's tokens for B (``timings.cache_n``);
under ``shared`` it reuses them (the test can fail). B's own next turn, A's return and a lone credential's second
session keep their reuse.
"""

from __future__ import annotations

import pytest

from pflash_proxy.engine import EngineRefused
from pflash_proxy.llama.engine import LlamaServerSlots
from tests.conftest import start_llama_server
from tests.sessions.test_sessions_real import DOC_A, DOC_B, ask, chat, make_proxy

pytestmark = [pytest.mark.llama, pytest.mark.timeout(900)]  # four ~1.5K-token prefills on a loaded 2-core machine

KEY_A = {"Authorization": "Bearer key-of-a"}
KEY_B = {"Authorization": "Bearer key-of-b"}


@pytest.fixture(scope="module")
def one_slot(gemma_model, tmp_path_factory):
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("llama-iso"), parallel=1, ctx_per_slot=4096)
    yield server
    server.stop()


async def test_credential_b_reuses_nothing_of_a(aiohttp_client, one_slot, tmp_path):
    proxy = await make_proxy(aiohttp_client, one_slot, tmp_path)
    _, a1 = await ask(proxy, chat(DOC_A, "How many crates at plot 3?"), headers=KEY_A)
    h, b1 = await ask(proxy, chat(DOC_A, "How many crates at plot 8?"), headers=KEY_B)
    assert h["X-PFlash-Cache"] == "miss"
    assert b1["timings"]["cache_n"] == 0 and b1["usage"]["prompt_tokens"] > 500
    # B's own follow-up is still a hit on what B left there
    h, b2 = await ask(proxy, chat(DOC_A, "How many crates at plot 8?", "And plot 9?"), headers=KEY_B)
    assert h["X-PFlash-Cache"] == "hit" and b2["timings"]["cache_n"] >= b1["usage"]["prompt_tokens"] - 1
    # A comes back to its own snapshot (saved when B took the slot), not to an erased slot
    h, a2 = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 4?"), headers=KEY_A)
    assert h["X-PFlash-Cache"] == "restored" and a2["timings"]["cache_n"] >= a1["usage"]["prompt_tokens"] - 1
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    # A's first request erased what an earlier proxy left in the slot (unknown owner), B's request A's content
    assert stats["cache_isolation_active"] and stats["isolation_erases"] == 2
    assert stats["isolation_erases_unknown"] == 1


@pytest.mark.parametrize("guess", ["right", "wrong"])
async def test_after_a_proxy_restart_b_reuses_nothing_of_a(aiohttp_client, one_slot, tmp_path, guess):
    """Issue 50 item 5: llama-server keeps its slot across a restart of the proxy, and the restarted proxy has
    seen one credential only. On 19528cf B's first request reused A's cached prompt (the whole opening for a right
    guess, the chat template's tokens for a wrong one): a cache-timing oracle. Now the slot, whose owner the new
    process does not know, is erased first."""
    first = await make_proxy(aiohttp_client, one_slot, tmp_path)
    _, a1 = await ask(first, chat(DOC_A, "How many crates at plot 3?"), headers=KEY_A)
    assert a1["usage"]["prompt_tokens"] > 500
    await first.close()  # the proxy stops (its sessions saved); llama-server keeps running, A's prompt in its slot
    second = await make_proxy(aiohttp_client, one_slot, tmp_path)  # the same state directory: a restart
    doc = DOC_A if guess == "right" else DOC_B
    h, b1 = await ask(second, chat(doc, "How many crates at plot 8?"), headers=KEY_B)
    assert h["X-PFlash-Cache"] == "miss"
    assert b1["timings"]["cache_n"] == 0, b1["timings"]
    stats = (await (await second.get("/pflash/stats")).json())["sessions"]
    assert stats["isolation_erases_unknown"] == 1
    # A, back after the restart, gets its own snapshot (saved at shutdown), not an erased slot
    h, a2 = await ask(second, chat(DOC_A, "How many crates at plot 3?", "And plot 4?"), headers=KEY_A)
    assert h["X-PFlash-Cache"] == "restored" and a2["timings"]["cache_n"] >= a1["usage"]["prompt_tokens"] - 1


async def test_shared_reuses_a_for_b(aiohttp_client, one_slot, tmp_path):
    proxy = await make_proxy(aiohttp_client, one_slot, tmp_path, cache_isolation="shared")
    await ask(proxy, chat(DOC_A, "How many crates at plot 3?"), headers=KEY_A)
    h, b1 = await ask(proxy, chat(DOC_A, "How many crates at plot 8?"), headers=KEY_B)
    assert b1["timings"]["cache_n"] > 500
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    assert not stats["cache_isolation_active"] and stats["isolation_erases"] == 0


async def test_one_credential_pays_nothing(aiohttp_client, one_slot, tmp_path):
    proxy = await make_proxy(aiohttp_client, one_slot, tmp_path)
    await ask(proxy, chat(DOC_A, "How many crates at plot 3?"), headers=KEY_A)
    _, second = await ask(proxy, chat(DOC_A, "How many crates at plot 8?"), headers=KEY_A)  # another session of A
    assert second["timings"]["cache_n"] > 500


async def complete(proxy, headers):
    r = await proxy.post("/completion", json={"prompt": "You answer briefly.\n\n" + DOC_A, "n_predict": 1,
                                              "temperature": 0}, headers=headers)
    body = await r.json()
    assert r.status == 200, body
    return body


@pytest.mark.parametrize("mode", ["credential", "shared"])
async def test_completion_route_of_b_and_a(aiohttp_client, one_slot, tmp_path, mode):
    proxy = await make_proxy(aiohttp_client, one_slot, tmp_path, cache_isolation=mode)
    await complete(proxy, KEY_A)
    b = await complete(proxy, KEY_B)
    if mode == "credential":
        assert b["timings"]["cache_n"] == 0
    else:
        assert b["timings"]["cache_n"] > 500


async def test_failed_erase_sends_the_request_uncached(aiohttp_client, one_slot, tmp_path, monkeypatch):
    async def no_erase(self, slot):  # fault injection: erase refused
        raise EngineRefused(f"slot {slot} erase", 501, "not supported")

    monkeypatch.setattr(LlamaServerSlots, "erase", no_erase)
    proxy = await make_proxy(aiohttp_client, one_slot, tmp_path)
    await ask(proxy, chat(DOC_A, "How many crates at plot 3?"), headers=KEY_A)
    _, b1 = await ask(proxy, chat(DOC_A, "How many crates at plot 8?"), headers=KEY_B)
    assert b1["timings"]["cache_n"] == 0 and b1["usage"]["prompt_tokens"] > 500
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    # A's request found content of an owner this process did not know, B's A's: both sent cold
    assert stats["isolation_cold"] == 2 and stats["isolation_erases"] == 0
