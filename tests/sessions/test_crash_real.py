"""A crash of llama-server (``kill -9``) costs no idle session its cache: idle sessions are saved in the background.

Two sessions sit idle in the two slots of a real llama-server, two more were displaced to disk; the server is
killed and started again; all four continue ``restored``, with llama-server reusing at least 90 % of each one's
history (``benchmarks/sessions_crash.py`` runs the same with 6 + 6 sessions on 6 slots).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings, start_llama_server
from tests.sessions.test_snapshot_truth_real import SAMPLING

pytestmark = [pytest.mark.llama, pytest.mark.timeout(900)]  # four prefills, four restores and a restart

SUBJECTS = ("orchard", "lighthouse", "quarry", "vineyard")


def opening(subject: str) -> list[dict]:
    doc = "\n".join(f"{subject.title()} record {i}: crew {i} logged {i * 13 % 41} units at the {subject} on day {i}."
                    for i in range(12))
    return [{"role": "system", "content": "You answer briefly.\n\n" + doc},
            {"role": "user", "content": f"What did crew 3 log at the {subject}?"}]


async def turn(proxy, messages):
    resp = await proxy.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, **SAMPLING})
    body = await resp.json()
    assert resp.status == 200, body
    return resp.headers, body


@pytest.fixture
def two_slot_server(gemma_model, tmp_path):
    server = start_llama_server(gemma_model, tmp_path / "llama", parallel=2, ctx_per_slot=2048)
    yield server
    server.stop()


async def stats(proxy) -> dict:
    return (await (await proxy.get("/pflash/stats")).json())["sessions"]


async def test_idle_sessions_survive_a_crash(aiohttp_client, two_slot_server, tmp_path):
    proxy = await aiohttp_client(create_app(make_settings(two_slot_server.url, tmp_path,
                                                          slot_save_path=two_slot_server.slot_dir, idle_save_s=1)))
    history: dict[str, list[dict]] = {}
    prompt: dict[str, int] = {}
    for subject in SUBJECTS:  # the first two are displaced to disk by the last two
        msgs = opening(subject)
        h, body = await turn(proxy, msgs)
        assert h["X-PFlash-Cache"] == "miss"
        history[subject] = msgs + [body["choices"][0]["message"]]
        prompt[subject] = body["usage"]["prompt_tokens"]
    deadline = time.monotonic() + 30
    while not all(s["snapshot_current"] for s in (await stats(proxy))["table"]):  # once idle for a second
        assert time.monotonic() < deadline, await stats(proxy)
        await asyncio.sleep(0.5)
    saved = (await stats(proxy))["idle_saves"]
    assert saved >= 2
    await asyncio.sleep(2.5)
    assert (await stats(proxy))["idle_saves"] == saved  # once per change: nothing changed since

    await asyncio.get_running_loop().run_in_executor(None, two_slot_server.crash)
    for subject in SUBJECTS:
        msgs = history[subject] + [{"role": "user", "content": "And crew 5?"}]
        h, body = await turn(proxy, msgs)
        assert h["X-PFlash-Cache"] == "restored", (subject, dict(h))
        assert int(h["X-PFlash-Cached-Tokens"]) == body["timings"]["cache_n"]
        assert body["timings"]["cache_n"] >= 0.9 * prompt[subject], (subject, body["timings"])
    after = await stats(proxy)
    assert after["restored"] == 4 and after["cache_mismatches"] == 0
    # llama-server's own account of the slot actions (the time its main loop spent on them, the bytes moved)
    actions = after["slot_actions"]
    assert actions["save"]["n"] == after["snap_saves"] and actions["save"]["server_ms"] > 0
    assert actions["save"]["bytes"] > 100 * 4096 * actions["save"]["n"]  # ~4 KB a token; every session > 100
    assert actions["restore"]["n"] == after["snap_restores"] == 4 and actions["restore"]["server_ms"] > 0
    assert actions["restore"]["bytes"] > 0
