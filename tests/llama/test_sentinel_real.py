"""The upstream sentinel (``llama/sentinel.py``) against a real llama-server: it holds one connection across
cpp-httplib's keep-alive count without a new epoch, and a restart of the server ends the epoch at once."""

from __future__ import annotations

import asyncio
import http.server
import threading

import pytest

from pflash_proxy.llama import sentinel as sentinel_mod
from pflash_proxy.llama.sentinel import Sentinel, loopback_http
from tests.conftest import start_llama_server


@pytest.fixture
def own_server(gemma_model, tmp_path):
    server = start_llama_server(gemma_model, tmp_path / "llama")
    yield server
    server.stop()


def test_only_a_plain_http_loopback_upstream_is_watched():
    assert loopback_http("http://127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert loopback_http("http://localhost:9") == ("localhost", 9)
    assert loopback_http("http://[::1]:8080") == ("::1", 8080)
    assert loopback_http("https://127.0.0.1:8080") is None  # TLS: something terminates it
    assert loopback_http("http://10.0.0.5:8080") is None  # another host: it may sit behind a balancer
    assert loopback_http("http://llama.internal:8080") is None
    assert loopback_http("") is None


class _Http10Health(http.server.BaseHTTPRequestHandler):  # HTTP/1.0: the server closes after every answer
    connections = 0

    def setup(self) -> None:
        type(self).connections += 1
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


async def test_a_server_that_closes_every_connection_is_never_held_nor_hammered(monkeypatch):
    """An HTTP/1.0 upstream (the install test's fake) answered each poll and closed: the sentinel reconnected in a
    tight loop and the proxy could not stop within 30 s."""
    monkeypatch.setattr(sentinel_mod, "POLL_S", 0.1)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http10Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    s = Sentinel(lambda: f"http://127.0.0.1:{server.server_port}")
    s.start()
    try:
        await asyncio.sleep(1.0)
        assert not s.alive
        assert _Http10Health.connections <= 12  # one try per POLL_S, not thousands
    finally:
        await s.stop()
        server.shutdown()


async def _until(cond, s: float = 10.0) -> None:
    for _ in range(int(s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


@pytest.mark.llama
async def test_rotation_keeps_the_epoch_and_a_restart_ends_it(own_server, monkeypatch):
    monkeypatch.setattr(sentinel_mod, "POLL_S", 0.05)
    monkeypatch.setattr(sentinel_mod, "ROTATE_AFTER", 3)  # cpp-httplib ends a connection after 100 requests
    s = Sentinel(lambda: own_server.url)
    s.start()
    try:
        await _until(lambda: s.alive)
        epoch = s.current()
        assert s.vouches(epoch)
        await _until(lambda: s.rotations >= 3)
        assert s.current() == epoch and s.breaks == 0  # handed over while the old connection was open
        await asyncio.get_running_loop().run_in_executor(None, own_server.restart)
        assert not s.vouches(epoch)
        assert s.breaks >= 1
        await _until(lambda: s.alive)
        assert s.current() != epoch and not s.vouches(epoch)
        now = s.current()
        s.end_epoch()  # the proxy learnt the state was lost some other way
        assert s.alive and not s.vouches(now)
    finally:
        await s.stop()
    assert not s.alive
