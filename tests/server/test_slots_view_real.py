"""Against the real llama-server: what a client's ``GET /slots`` shows under ``--cache-isolation credential`` (its
own slots whole, another credential's without its prompt length or sampling settings), and the status a stream
the shutdown's drain ended is logged with (the 200 its client got, not 500)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import aiohttp
import pytest

from pflash_proxy.llama.spawn import free_port
from pflash_proxy.server.app import create_app
from tests.conftest import make_settings, wait_for_proxy

pytestmark = pytest.mark.llama

GEN = {"temperature": 0.7, "top_k": 17, "seed": 3, "max_tokens": 2}
PUBLIC = {"id", "n_ctx", "is_processing", "speculative"}  # what another credential's slot shows


async def _turn(client, key: str, text: str) -> int:
    r = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"messages": [{"role": "user", "content": text}], **GEN})
    assert r.status == 200, await r.text()
    return int(r.headers["X-PFlash-Slot"])


@pytest.mark.parametrize("isolation", ["credential", "shared"])
async def test_slots_shows_another_credentials_slot_without_its_prompt_or_settings(aiohttp_client, llama_server,
                                                                                  tmp_path, isolation):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir,
                             cache_isolation=isolation)
    client = await aiohttp_client(create_app(settings))
    slot_a = await _turn(client, "key-a", "Alice's secret plan: the tulips bloom at dawn. " * 4)
    slot_b = await _turn(client, "key-b", "Bob writes something else entirely, about the harbour. " * 3)
    assert slot_a != slot_b
    r = await client.get("/slots", headers={"Authorization": "Bearer key-a"})
    assert r.status == 200
    slots = {s["id"]: s for s in await r.json()}
    direct = {s["id"]: s for s in await (await client.session.get(llama_server.url + "/slots")).json()}
    assert set(slots) == set(direct)
    assert slots[slot_a].keys() == direct[slot_a].keys()  # its own: whole
    assert "params" in direct[slot_b] and direct[slot_b]["params"].get("top_k") == 17
    if isolation == "credential":
        assert set(slots[slot_b]) <= PUBLIC, slots[slot_b]
        assert slots[slot_b]["n_ctx"] == direct[slot_b]["n_ctx"]
        anonymous = {s["id"]: s for s in await (await client.get("/slots")).json()}  # no credential: neither
        assert all(set(s) <= PUBLIC for s in anonymous.values()), anonymous
    else:  # shared caches: llama-server's own answer
        assert slots[slot_b].keys() == direct[slot_b].keys()


async def test_a_stream_the_drain_ended_is_logged_with_the_status_its_client_got(llama_server, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", llama_server.url,
                                 "--port", str(port), "--home", str(tmp_path / "home"), "--slot-save-path",
                                 str(tmp_path / "slots"), "--shutdown-save-timeout-s", "1", "--log-json"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_for_proxy(url, 60, proc, log)
        long = [{"role": "user", "content": "Count from one to five hundred in words."}]
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json={"messages": long, "max_tokens": 2000,
                                                                 "stream": True, "ignore_eos": True}) as r:
                assert r.status == 200
                await r.content.readuntil(b"\n\n")
                proc.send_signal(signal.SIGTERM)
                rest = await asyncio.wait_for(r.content.read(), 60)
        assert b"proxy_shutdown" in rest
        await asyncio.get_running_loop().run_in_executor(None, proc.wait, 90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    access = [x for x in lines if x.get("path") == "/v1/chat/completions" and "status" in x]
    assert access, log.read_text()[-3000:]
    assert access[-1]["status"] == 200 and access[-1].get("drained") is True, access[-1]
