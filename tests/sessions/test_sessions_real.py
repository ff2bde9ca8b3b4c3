"""Sessions against a real llama-server: slot pinning, save/restore, restarts, corrupt snapshots, concurrency."""

from __future__ import annotations

import asyncio

import pytest

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings, session_service, start_llama_server

pytestmark = pytest.mark.llama

SAMPLING = {"temperature": 0, "seed": 7, "top_k": 1}

DOC_A = "\n".join(f"Ledger entry {i}: the orchard at plot {i} harvested {i * 7 % 53} crates of apples."
                  for i in range(60))
DOC_B = "\n".join(f"Station log {i}: the tide gauge at pier {i} read {i * 11 % 37} centimetres above datum."
                  for i in range(60))


def chat(doc: str, *turns: str) -> list[dict]:
    msgs = [{"role": "system", "content": "You answer briefly.\n\n" + doc}]
    for i, t in enumerate(turns):
        if i:
            msgs.append({"role": "assistant", "content": f"Answer {i}."})
        msgs.append({"role": "user", "content": t})
    return msgs


@pytest.fixture(scope="module")
def one_slot_server(gemma_model, tmp_path_factory):
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("llama1"), parallel=1, ctx_per_slot=4096)
    yield server
    server.stop()


async def make_proxy(aiohttp_client, server, tmp_path, **kw):
    settings = make_settings(server.url, tmp_path, slot_save_path=server.slot_dir, **kw)
    return await aiohttp_client(create_app(settings))


async def ask(client, messages, max_tokens=8, headers=None):
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens, **SAMPLING},
                             headers=headers or {})
    body = await resp.json()
    assert resp.status == 200, body
    return resp.headers, body


async def test_two_sessions_alternate_on_one_slot_through_restores(aiohttp_client, one_slot_server, tmp_path):
    proxy = await make_proxy(aiohttp_client, one_slot_server, tmp_path)
    h, a1 = await ask(proxy, chat(DOC_A, "How many crates at plot 3?"))
    assert h["X-PFlash-Cache"] == "miss"
    h, b1 = await ask(proxy, chat(DOC_B, "What did pier 4 read?"))
    assert h["X-PFlash-Cache"] == "miss"  # A was saved to disk to make room
    h, a2 = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 5?"))
    assert h["X-PFlash-Cache"] == "restored"
    # The server's own numbers: the restored prefix covered the whole first turn's prompt.
    assert a2["timings"]["cache_n"] >= a1["usage"]["prompt_tokens"] - 1
    h, b2 = await ask(proxy, chat(DOC_B, "What did pier 4 read?", "And pier 9?"))
    assert h["X-PFlash-Cache"] == "restored"
    assert b2["timings"]["cache_n"] >= b1["usage"]["prompt_tokens"] - 1
    h, b3 = await ask(proxy, chat(DOC_B, "What did pier 4 read?", "And pier 9?", "And pier 10?"))
    assert h["X-PFlash-Cache"] == "hit"
    assert b3["timings"]["cache_n"] >= b2["usage"]["prompt_tokens"] - 1
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["sessions"]["restored"] == 2 and stats["sessions"]["cache_mismatches"] == 0


async def test_restart_between_turns_restores_byte_identical_answer(aiohttp_client, one_slot_server, tmp_path):
    proxy = await make_proxy(aiohttp_client, one_slot_server, tmp_path)
    first = chat(DOC_A, "Which plot harvested 14 crates?")
    h, _ = await ask(proxy, first)
    sid = h["X-PFlash-Session"]
    assert (await (await proxy.post("/pflash/save")).json())["saved"] == 1
    await asyncio.get_running_loop().run_in_executor(None, one_slot_server.restart)
    await asyncio.sleep(1.5)  # let the health monitor see the server come back
    follow = chat(DOC_A, "Which plot harvested 14 crates?", "Name one plot with 21 crates.")
    h, restored = await ask(proxy, follow, max_tokens=16)
    assert h["X-PFlash-Session"] == sid and h["X-PFlash-Cache"] == "restored"
    assert restored["timings"]["cache_n"] > 500
    # The same turn by full prefill (a fresh proxy state, nothing cached) gives the same bytes.
    fresh = await make_proxy(aiohttp_client, one_slot_server, tmp_path / "fresh")
    await ask(fresh, chat(DOC_B, "clear the slot"), max_tokens=1)
    h, full = await ask(fresh, follow, max_tokens=16)
    assert h["X-PFlash-Cache"] == "miss"
    assert restored["choices"][0]["message"]["content"] == full["choices"][0]["message"]["content"]


async def test_corrupt_snapshot_is_served_as_miss_and_deleted(aiohttp_client, one_slot_server, tmp_path):
    proxy = await make_proxy(aiohttp_client, one_slot_server, tmp_path)
    h, _ = await ask(proxy, chat(DOC_A, "Plot 2?"))
    await ask(proxy, chat(DOC_B, "Pier 2?"))  # evicts A to disk
    path = one_slot_server.slot_dir / f"pf-{h['X-PFlash-Session']}.bin"
    assert path.is_file()
    path.write_bytes(b"garbage" * 100)
    h, body = await ask(proxy, chat(DOC_A, "Plot 2?", "Plot 3?"))
    assert h["X-PFlash-Cache"] == "miss"
    assert body["choices"][0]["message"]["content"] is not None
    assert not path.exists()


async def test_eight_concurrent_sessions_on_two_slots(aiohttp_client, llama_server, tmp_path):
    proxy = await make_proxy(aiohttp_client, llama_server, tmp_path)
    prompts = [f"Repeat this word exactly once and nothing else: {w}" for w in
               ("apple", "river", "candle", "forest", "violin", "marble", "pepper", "anchor")]
    expected = []
    for p in prompts:  # one at a time: the reference answers
        _, body = await ask(proxy, [{"role": "user", "content": p}], max_tokens=6)
        expected.append(body["choices"][0]["message"]["content"])
    results = await asyncio.gather(*(ask(proxy, [{"role": "user", "content": p}], max_tokens=6) for p in prompts))
    for (headers, body), want in zip(results, expected):
        assert body["choices"][0]["message"]["content"] == want
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["sessions"]["slots"] == 2


async def test_attached_server_gets_one_warning_with_the_flags(aiohttp_client, llama_server, tmp_path, caplog):
    caplog.set_level("WARNING", logger="pflash_proxy.sessions")
    proxy = await make_proxy(aiohttp_client, llama_server, tmp_path)
    await ask(proxy, [{"role": "user", "content": "hi"}], max_tokens=1)
    await ask(proxy, [{"role": "user", "content": "hi again"}], max_tokens=1)
    warnings = [r.getMessage() for r in caplog.records if "cannot verify" in r.getMessage()]
    assert len(warnings) == 1
    assert "--no-cache-idle-slots -sps 0" in warnings[0]  # /props and /slots show neither
    assert "-np" not in warnings[0]  # the slot count is what /props and /slots show
    assert "--slot-save-path" not in warnings[0]  # this server has one: the probe saw 400, not 501
    assert "--swa-full" in warnings[0] and "(for a sliding-window" not in warnings[0]  # gemma 3's GGUF, read here


async def test_save_every_turn_snapshots_in_the_background(aiohttp_client, llama_server, tmp_path):
    proxy = await make_proxy(aiohttp_client, llama_server, tmp_path, save_every_turn=True)
    h, _ = await ask(proxy, [{"role": "user", "content": "Count to three."}], max_tokens=4)
    path = llama_server.slot_dir / f"pf-{h['X-PFlash-Session']}.bin"
    for _ in range(50):
        if path.is_file():
            break
        await asyncio.sleep(0.1)
    assert path.is_file()
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["sessions"]["snap_saves"] == 1 and stats["sessions"]["evicted_saves"] == 0


async def test_pruned_session_loses_its_snapshot_and_starts_over(aiohttp_client, one_slot_server, tmp_path):
    proxy = await make_proxy(aiohttp_client, one_slot_server, tmp_path, max_sessions=1)
    h_a, _ = await ask(proxy, chat(DOC_A, "How many crates at plot 3?"))
    h_b, _ = await ask(proxy, chat(DOC_B, "What did pier 4 read?"))  # A is saved to disk to free the slot
    snap_a = one_slot_server.slot_dir / f"pf-{h_a['X-PFlash-Session']}.bin"
    assert snap_a.is_file()
    assert await session_service(proxy.app).prune() == [h_a["X-PFlash-Session"]]  # B holds the slot, so A is the surplus one
    assert not snap_a.exists()
    h, _ = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 5?"))
    assert h["X-PFlash-Cache"] == "miss" and h["X-PFlash-Session"] != h_a["X-PFlash-Session"]
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["sessions"]["sessions_pruned"] == 1


async def test_a_deleted_snapshot_is_saved_again_when_its_session_is_evicted(aiohttp_client, one_slot_server,
                                                                              tmp_path):
    """Issue #13 item 10: the slot still claimed a current snapshot after the file was deleted (``rm``, LRU,
    pruning), so the eviction skipped the save and the session's next turn was prefilled from scratch."""
    proxy = await make_proxy(aiohttp_client, one_slot_server, tmp_path)
    h, _ = await ask(proxy, chat(DOC_A, "How many crates at plot 3?"))
    assert (await (await proxy.post("/pflash/save")).json())["saved"] == 1
    path = one_slot_server.slot_dir / f"pf-{h['X-PFlash-Session']}.bin"
    path.unlink()  # what `pflash-proxy rm` does from another process
    await ask(proxy, chat(DOC_B, "What did pier 4 read?"))  # evicts A
    assert path.is_file()
    h2, _ = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 5?"))
    assert h2["X-PFlash-Session"] == h["X-PFlash-Session"] and h2["X-PFlash-Cache"] == "restored"
