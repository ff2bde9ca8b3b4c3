"""Snapshots and cache reports that are what they say, against a real llama-server killed and started again.

A save checks ``/slots`` first, so a slot that a restart emptied is never saved over the session's good snapshot;
a whole answer's ``X-PFlash-Cache`` / ``X-PFlash-Cached-Tokens`` are llama-server's own ``timings.cache_n``; one
restart counts once; a shutdown with llama-server gone does not wait for saves that cannot happen.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pflash_proxy.server.app import create_app
from pflash_proxy.sessions.liveness import UpstreamWatch
from tests.conftest import make_settings, start_llama_server
from tests.sessions.test_sessions_real import SAMPLING, chat

pytestmark = pytest.mark.llama

DOC_A = "\n".join(f"Ledger entry {i}: the orchard at plot {i} harvested {i * 7 % 53} crates of apples."
                  for i in range(40))
DOC_B = "\n".join(f"Station log {i}: the tide gauge at pier {i} read {i * 11 % 37} centimetres above datum."
                  for i in range(40))


async def ask(client, messages, max_tokens=4, headers=None):
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens, **SAMPLING},
                             headers=headers or {})
    body = await resp.json()
    assert resp.status == 200, body
    return resp.headers, body


@pytest.fixture
def own_server(gemma_model, tmp_path):
    server = start_llama_server(gemma_model, tmp_path / "llama", parallel=1, ctx_per_slot=4096)
    yield server
    server.stop()


async def _no_health_monitor(self) -> None:
    return None


async def test_a_save_after_an_unseen_restart_keeps_the_good_snapshot(aiohttp_client, own_server, tmp_path,
                                                                     monkeypatch):
    # a restart between two health polls (systemd restarts in well under a second): only what the proxy checks
    # itself stands between it and a save of the emptied slot
    monkeypatch.setattr(UpstreamWatch, "_health_monitor", _no_health_monitor)
    proxy = await aiohttp_client(create_app(make_settings(own_server.url, tmp_path, slot_save_path=own_server.slot_dir,
                                                          idle_save_s=0)))
    h, a1 = await ask(proxy, chat(DOC_A, "How many crates at plot 3?"))
    sid = h["X-PFlash-Session"]
    assert (await (await proxy.post("/pflash/save")).json())["saved"] == 1
    snap = own_server.slot_dir / f"pf-{sid}.bin"
    good = snap.stat().st_size
    assert good > 100_000
    h, _ = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 5?"))
    assert h["X-PFlash-Cache"] == "hit"  # the slot now holds more than the snapshot: evicting it would save it

    await asyncio.get_running_loop().run_in_executor(None, own_server.crash)
    h, _ = await ask(proxy, chat(DOC_B, "What did pier 4 read?"))  # displaces A from the (now empty) slot
    assert snap.stat().st_size == good  # nothing was saved over the good snapshot
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    assert stats["saves_refused"] == 1 and stats["upstream_restarts"] == 1

    h, a3 = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 5?", "And plot 7?"))
    assert h["X-PFlash-Session"] == sid and h["X-PFlash-Cache"] == "restored"
    assert int(h["X-PFlash-Cached-Tokens"]) == a3["timings"]["cache_n"]
    assert a3["timings"]["cache_n"] >= 0.9 * a1["usage"]["prompt_tokens"]


async def test_headers_are_what_llama_server_reused(aiohttp_client, own_server, tmp_path):
    proxy = await aiohttp_client(create_app(make_settings(own_server.url, tmp_path, slot_save_path=own_server.slot_dir,
                                                          idle_save_s=0)))
    first = {"X-PFlash-Session": "first"}
    await ask(proxy, chat(DOC_A, "How many crates at plot 3?"), headers=first)
    h, a2 = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 5?"), headers=first)
    assert h["X-PFlash-Cache"] == "hit"
    assert int(h["X-PFlash-Cached-Tokens"]) == a2["timings"]["cache_n"]  # the generated tokens included
    # a new session that opens like the slot's last one: llama-server reuses that prefix, and the header says so
    h, b = await ask(proxy, chat(DOC_A, "Which plot harvested 14 crates?"), headers={"X-PFlash-Session": "second"})
    assert b["timings"]["cache_n"] > 500
    assert h["X-PFlash-Cache"] == "hit-prefix"
    assert int(h["X-PFlash-Cached-Tokens"]) == b["timings"]["cache_n"]
    # a snapshot that holds nothing is never announced as restored
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    assert stats["prefix_hits"] == 1 and stats["cache_mismatches"] == 0


async def test_one_restart_counts_once(aiohttp_client, own_server, tmp_path):
    proxy = await aiohttp_client(create_app(make_settings(own_server.url, tmp_path, slot_save_path=own_server.slot_dir,
                                                          idle_save_s=0)))
    await ask(proxy, chat(DOC_A, "How many crates at plot 3?"))
    own_server.proc.kill()
    own_server.proc.wait()
    loop = asyncio.get_running_loop()

    async def start_later() -> None:
        await asyncio.sleep(1.5)  # the health monitor sees it down
        await loop.run_in_executor(None, own_server.crash)

    starting = asyncio.create_task(start_later())
    h, _ = await ask(proxy, chat(DOC_A, "How many crates at plot 3?", "And plot 5?"))  # meets it back
    await starting
    assert h["X-PFlash-Cache"] == "miss"  # nothing was saved before the crash (idle saves are off here)
    await asyncio.sleep(3)  # the health monitor's polls after the server came back
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    assert stats["upstream_restarts"] == 1


async def test_shutdown_with_llama_server_gone_does_not_wait_for_saves(aiohttp_client, own_server, tmp_path):
    settings = make_settings(own_server.url, tmp_path, slot_save_path=own_server.slot_dir, idle_save_s=0,
                             shutdown_save_timeout_s=30, upstream_wait_s=60)
    proxy = await aiohttp_client(create_app(settings))
    await ask(proxy, chat(DOC_A, "How many crates at plot 3?"))  # a resident session with no snapshot
    own_server.proc.kill()
    own_server.proc.wait()
    t0 = time.monotonic()
    await proxy.close()  # the app's shutdown: SessionService.stop
    assert time.monotonic() - t0 < 8
