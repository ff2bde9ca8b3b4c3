"""A request that meets llama-server restarting waits for it and is served (issue #26 item 8)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from tests.conftest import make_settings, start_llama_server
from tests.server.faultrelay import FaultRelay, reset

pytestmark = pytest.mark.llama


@pytest.fixture
def own_server(gemma_model, tmp_path):
    server = start_llama_server(gemma_model, tmp_path / "llama")
    yield server
    server.stop()


def _start_again(server) -> None:
    logf = open(server.log, "ab")
    server.proc = subprocess.Popen(server.args, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)


CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2, "temperature": 0}


async def test_a_request_during_a_restart_waits_and_is_served(aiohttp_client, own_server, tmp_path):
    from pflash_proxy.server.app import create_app

    settings = make_settings(own_server.url, tmp_path, slot_save_path=own_server.slot_dir, upstream_wait_s=60)
    proxy = await aiohttp_client(create_app(settings))
    assert (await proxy.post("/v1/chat/completions", json=CHAT)).status == 200
    own_server.stop()  # down: connections are refused, then the new process answers 503 while loading
    loop = asyncio.get_running_loop()

    async def restart_later() -> None:
        await asyncio.sleep(1.5)
        await loop.run_in_executor(None, _start_again, own_server)

    restarting = asyncio.create_task(restart_later())
    chat, models = await asyncio.gather(proxy.post("/v1/chat/completions", json=CHAT), proxy.get("/v1/models"))
    await restarting
    assert chat.status == 200, await chat.text()
    assert models.status == 200, await models.text()  # a passthrough request waits the same way
    assert (await chat.json())["choices"][0]["message"]["content"] is not None


async def test_health_probes_and_a_zero_wait_still_answer_at_once(aiohttp_client, own_server, tmp_path):
    from pflash_proxy.server.app import create_app

    settings = make_settings(own_server.url, tmp_path, slot_save_path=own_server.slot_dir, upstream_wait_s=0)
    proxy = await aiohttp_client(create_app(settings))
    own_server.stop()
    health = await asyncio.wait_for(proxy.get("/health"), 10)
    assert health.status in (502, 503)
    chat = await asyncio.wait_for(proxy.post("/v1/chat/completions", json=CHAT), 10)
    assert chat.status in (502, 503)


class ClosesMidBody(FaultRelay):
    """While armed, resets the connection that carries a chat request as soon as that request begins to arrive
    (its body still being written): what a llama-server that stops to restart does to a request in flight."""

    CHAT = b"POST /v1/chat/completions "  # not /v1/chat/completions/input_tokens, the proxy's own token count

    def __init__(self, target_port: int):
        super().__init__(target_port)
        self.armed, self.resets = 1, 0

    async def fault(self, data: bytes, writer: asyncio.StreamWriter) -> bool:
        if self.armed and data.startswith(self.CHAT):
            self.armed -= 1
            self.resets += 1
            reset(writer)
            return True
        return False


async def test_a_connection_closed_while_the_body_is_written_is_sent_again(aiohttp_client, own_server, tmp_path):
    """aiohttp's ``ClientOSError: Can not write request body`` (the server reset the connection mid-body) is
    retried on a fresh connection like a stale keep-alive one: the client gets its answer, not a 502."""
    from urllib.parse import urlparse

    from pflash_proxy.server.app import create_app

    fault = ClosesMidBody(urlparse(own_server.url).port)
    port = await fault.start()
    settings = make_settings(f"http://127.0.0.1:{port}", tmp_path, slot_save_path=own_server.slot_dir)
    proxy = await aiohttp_client(create_app(settings))
    body = {**CHAT, "pad": "x" * (4 << 20)}  # a body still being written when the connection is reset
    resp = await proxy.post("/v1/chat/completions", json=body)
    assert fault.resets == 1
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["choices"][0]["message"]["content"] is not None
    await fault.close()
