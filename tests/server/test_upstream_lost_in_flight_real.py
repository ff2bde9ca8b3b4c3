"""A request llama-server was working on when it died (mid-prefill: nothing answered yet) is sent once more when the
server is back, however long the prefill had run; a stream whose bytes already reached the client is not."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlparse

import pytest

from tests.conftest import make_settings
from tests.server.faultrelay import FaultRelay, reset

pytestmark = pytest.mark.llama

CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2, "temperature": 0}


class DiesMidPrefill(FaultRelay):
    """A llama-server dying under a request it has taken.

    While armed, the first chat request is held ``hold_s`` without an answer (a long prefill), then every
    connection is reset (RST) at once, and with ``down_s`` the port refuses connections that long (the process
    gone, its successor loading); ``resets_after`` further chat requests (one sent again at once, meeting the dying
    server still accepting) are reset as soon as they arrive. Every other connection is relayed as it is."""

    def __init__(self, target_port: int, hold_s: float, down_s: float, resets_after: int = 0):
        super().__init__(target_port)
        self.hold_s, self.down_s = hold_s, down_s
        self.armed, self.resets_after, self.chats = True, resets_after, 0

    async def _die(self) -> None:
        assert self.server is not None
        if self.down_s:
            self.server.close()  # the port refuses from now on
        for w in list(self.writers):
            reset(w)
        if self.down_s:
            await asyncio.sleep(self.down_s)
            await self.start()  # the successor listens on the same port

    async def fault(self, data: bytes, writer: asyncio.StreamWriter) -> bool:
        if not data.startswith(b"POST /v1/chat/completions"):
            return False
        self.chats += 1
        if self.armed:
            self.armed = False
            await asyncio.sleep(self.hold_s)  # llama-server prefilling: nothing is answered
            await self._die()
            return True
        if self.resets_after:
            self.resets_after -= 1
            reset(writer)
            return True
        return False


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("down_s,resets_after", [(0.5, 0), (0, 1)], ids=["refused-then-back", "still-accepting"])
async def test_a_request_cut_mid_prefill_is_sent_again_once_the_server_is_back(aiohttp_client, llama_server, tmp_path,
                                                                             stream, down_s, resets_after):
    """The prefill outlasts ``--upstream-wait-s``: the wait for the server to come back starts when the request was
    lost, not when it was sent; and a request whose immediate resend is cut too (the dying server still accepted
    it) waits for the server and is sent once more (before: ``502 upstream_unreachable`` in both cases)."""
    from pflash_proxy.server.app import create_app

    fault = DiesMidPrefill(urlparse(llama_server.url).port, hold_s=3.0, down_s=down_s,
                           resets_after=resets_after)
    port = await fault.start()
    settings = make_settings(f"http://127.0.0.1:{port}", tmp_path, slot_save_path=llama_server.slot_dir,
                             upstream_wait_s=2)
    proxy = await aiohttp_client(create_app(settings))
    try:
        resp = await proxy.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        text = await resp.text()
        assert resp.status == 200, text
        assert fault.chats == 2 + resets_after  # the lost one, (its reset immediate resend,) the one answered
        if stream:
            events = [json.loads(line[5:]) for line in text.splitlines()
                      if line.startswith("data:") and line[5:].strip().startswith("{")]
            assert events and not any("error" in e for e in events), text
        else:
            assert (await resp.json())["choices"][0]["message"]["content"] is not None
    finally:
        await fault.close()


async def test_a_request_lost_twice_is_not_sent_a_third_time(aiohttp_client, llama_server, tmp_path):
    """Once: a request that each time meets a server going away (the request may be what kills it) gets 502."""
    from pflash_proxy.server.app import create_app

    fault = DiesMidPrefill(urlparse(llama_server.url).port, hold_s=0.2, down_s=0, resets_after=3)
    port = await fault.start()
    settings = make_settings(f"http://127.0.0.1:{port}", tmp_path, slot_save_path=llama_server.slot_dir,
                             upstream_wait_s=5)
    proxy = await aiohttp_client(create_app(settings))
    try:
        resp = await proxy.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 502, await resp.text()
        assert fault.chats == 4  # the lost one, its immediate resend, the one after the wait and its immediate one
    finally:
        await fault.close()
