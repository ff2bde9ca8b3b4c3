"""Path spellings and listening addresses against the real llama-server (b11434, cpp-httplib 0.59).

Issue 26 item 2: ``/./slots/0``, ``/slots/./0``, ``/slots/0/`` and ``/slots%2F0`` reached llama-server's slot
actions past the proxy's 403, and ``/./v1/chat/completions`` skipped sessions and compression. Issue 25 item 7:
llama-server's ``--host 127.0.0.1,::1`` (llama.cpp's test_server_multiple_addresses) had no equivalent.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from pflash_proxy.server.app import create_app
from pflash_proxy.llama.spawn import free_port
from tests.conftest import make_settings
from tests.server.test_gate import SPELLINGS, _raw

pytestmark = pytest.mark.llama

# What cpp-httplib 0.59 (b11434) itself does with each spelling of POST /slots/0 (sent to it as written): it
# percent-decodes the path (%XX, %uXXXX) and matches literally, except that ``/slots/:id_slot`` takes one trailing
# "/" and decodes the id again. Dot segments and empty segments are not resolved by llama-server, but the proxy's
# upstream client (yarl) resolved the dot segments when it forwarded them: through the proxy every one reached it.
ROUTED_BY_LLAMA_SERVER = {"/slots/0/", "/slots%2F0", "/slots%2f0", "/slots/%30", "/slots/0%2F", "/slots%u002F0"}


async def test_llama_server_routes_these_spellings_to_its_slot_action(llama_server):
    """The table above, checked with the real binary (erase: nothing is written)."""
    port = int(llama_server.url.rsplit(":", 1)[1])
    routed = set()
    for path in SPELLINGS:
        status, body = await _raw(port, path + "?action=erase")
        assert status in (200, 404), (path, status, body)
        if status == 200:
            routed.add(path)
    assert routed == ROUTED_BY_LLAMA_SERVER


@pytest.mark.parametrize("allow", [False, True])
async def test_no_spelling_of_a_slot_action_reaches_llama_server(aiohttp_client, llama_server, tmp_path, allow):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir,
                             allow_slot_actions=allow)
    proxy = await aiohttp_client(create_app(settings))
    tag = uuid.uuid4().hex[:8]
    for i, path in enumerate(SPELLINGS):
        body = json.dumps({"filename": f"evil-{tag}-{i}.bin"}).encode()
        status, answer = await _raw(proxy.port, path + "?action=save", body=body)
        assert status == 400 and json.loads(answer)["error"]["code"] == "non_canonical_path", (path, status)
    status, answer = await _raw(proxy.port, "/slots/0x?action=save",
                                body=json.dumps({"filename": f"evil-{tag}-x.bin"}).encode())
    assert status == (400 if allow else 403), answer  # stoi("0x") would be slot 0
    status, _ = await _raw(proxy.port, "/slots/0?action=save", body=json.dumps({"filename": f"ok-{tag}.bin"}).encode())
    assert status == (200 if allow else 403)  # the canonical path: refused or leased, as before
    written = sorted(p.name for p in llama_server.slot_dir.iterdir() if tag in p.name)
    assert written == ([f"ok-{tag}.bin"] if allow else [])
    for name in written:
        (llama_server.slot_dir / name).unlink()


async def test_a_dotted_completion_path_gets_400_not_an_unmanaged_slot(aiohttp_client, llama_server, tmp_path):
    """/./v1/chat/completions skipped sessions, leases and compression and could name its own id_slot."""
    proxy = await aiohttp_client(create_app(make_settings(llama_server.url, tmp_path,
                                                          slot_save_path=llama_server.slot_dir)))
    body = json.dumps({"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2, "id_slot": 0}).encode()
    for path in ("/./v1/chat/completions", "/v1/./chat/completions", "//v1/chat/completions", "/v1/chat/completions/",
                 "/v1%2Fchat%2Fcompletions", "/./v1/messages", "/./v1/responses", "/./completion"):
        status, answer = await _raw(proxy.port, path, body=body)
        assert status == 400, (path, status, answer)
        assert b"non-canonical request path" in answer  # in the dialect of the route it spells
    r = await proxy.post("/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    await r.read()
    assert r.status == 200 and "X-PFlash-Session" in r.headers  # the canonical path is managed


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_the_proxy_listens_on_every_address_of_host(llama_server, tmp_path):
    """llama.cpp's test_server_multiple_addresses through the proxy: --host 127.0.0.1,::1, health and a streamed
    completion on each address."""
    hosts = ["127.0.0.1", "::1"] if _ipv6_loopback() else ["127.0.0.1"]
    port = free_port()
    env = {**os.environ, "PFLASH_HOME": str(tmp_path / "home"), "PFLASH_HOST": "192.0.2.1"}  # the flag wins
    proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", llama_server.url,
                             "--host", ",".join(hosts), "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        line = ""
        while "listening on" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the proxy exited during start-up"
            assert time.time() < deadline
        for host in hosts:
            url = f"http://{'[::1]' if host == '::1' else host}:{port}"
            assert url in line
            with urllib.request.urlopen(url + "/health", timeout=30) as r:
                assert r.status == 200
            req = urllib.request.Request(url + "/v1/completions", method="POST",
                                         data=json.dumps({"prompt": "Once upon a time", "max_tokens": 8,
                                                          "stream": True}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                events = [ln for ln in r.read().decode().splitlines() if ln.startswith("data: ")]
            assert len(events) > 1, host
            with urllib.request.urlopen(url + "/pflash/metrics", timeout=30) as r:  # Host [::1]:port is local
                assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(30)
