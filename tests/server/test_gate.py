"""server/gate.py without a model: /pflash/* only under a local Host (DNS rebinding), no cross-site writes,
/pflash/stats and /pflash/save with the inspector's access rule, non-canonical paths refused before any routing
(issue 26 items 2 and 3), and the listen/public host options (issue 25 item 7)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from aiohttp import web

from pflash_proxy.cli import build_parser
from pflash_proxy.config import ConfigError, load_settings
from pflash_proxy.server.app import create_app
from pflash_proxy.server.gate import canonical_path, host_name, path_problem
from tests.conftest import make_settings

PFLASH_GETS = ("/pflash/stats", "/pflash/metrics", "/pflash/ui", "/pflash/ui/", "/pflash/ui/static/session.js",
               "/pflash/api/overview", "/pflash/api/sessions")


@pytest.fixture
async def upstream(aiohttp_client):
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.rel_url.raw_path_qs}")
        return web.json_response({"upstream": True}, headers={"Access-Control-Allow-Origin": "*"})

    fake = web.Application()
    fake.router.add_route("*", "/{tail:.*}", anything)
    client = await aiohttp_client(fake)
    client.seen = seen
    return client


async def _proxy(aiohttp_client, upstream, tmp_path, peer: str | None = None, **kw):
    app = create_app(make_settings(str(upstream.make_url("")).rstrip("/"), tmp_path, sessions=False, **kw))
    if peer is not None:
        @web.middleware
        async def from_peer(request, handler):  # the socket's peer as another host would have it
            return await handler(request.clone(remote=peer))
        app.middlewares.insert(0, from_peer)
    return await aiohttp_client(app)


async def test_pflash_answers_only_under_a_loopback_host_or_a_public_host(aiohttp_client, upstream, tmp_path):
    """Issue 26.3: a page of evil.example (resolved to 127.0.0.1) sends Host: evil.example and read /pflash/api."""
    proxy = await _proxy(aiohttp_client, upstream, tmp_path)
    for host in ("evil.example", "evil.example:8090", "127.0.0.1.nip.io:8090", "localhost.evil.example",
                 "[::2]:8090", "10.0.0.1", "bad host", "[::1", "x:y"):
        for path in PFLASH_GETS:
            r = await proxy.get(path, headers={"Host": host})
            assert r.status == 403, (host, path, r.status)
            assert (await r.json())["error"]["code"] == "host_forbidden", (host, path)
        r = await proxy.post("/pflash/save", headers={"Host": host}, json={})
        assert r.status == 403, host
    for host in ("localhost", "LOCALHOST:8090", "localhost.:1", "127.0.0.1", "127.0.0.1:8090", "127.9.9.9:1",
                 "[::1]", "[::1]:8090"):
        for path in PFLASH_GETS:
            r = await proxy.get(path, headers={"Host": host})
            assert r.status == 200, (host, path, r.status)
    assert not upstream.seen  # none of it reached llama-server
    public = await _proxy(aiohttp_client, upstream, tmp_path, public_host=["proxy.lan", "gpu-box"])
    for host in ("proxy.lan", "Proxy.Lan:8090", "gpu-box:1", "localhost:8090"):
        r = await public.get("/pflash/api/overview", headers={"Host": host})
        assert r.status == 200, host
    r = await public.get("/pflash/api/overview", headers={"Host": "evil.proxy.lan"})
    assert r.status == 403


async def test_the_completion_routes_are_not_host_checked(aiohttp_client, upstream, tmp_path):
    """Only /pflash/* is the proxy's own: llama-server's routes behave as they do without the proxy."""
    proxy = await _proxy(aiohttp_client, upstream, tmp_path)
    r = await proxy.get("/v1/models", headers={"Host": "evil.example"})
    assert r.status == 200 and upstream.seen == ["GET /v1/models"]


async def test_unknown_pflash_paths_and_their_preflights_never_reach_llama_server(aiohttp_client, upstream, tmp_path):
    """llama-server answers an OPTIONS pre-flight for any path; forwarded, it would let another site's fetch()
    send its custom headers to /pflash/save."""
    proxy = await _proxy(aiohttp_client, upstream, tmp_path)
    for method, path in (("OPTIONS", "/pflash/save"), ("OPTIONS", "/pflash/api/overview"), ("GET", "/pflash/nope"),
                         ("PUT", "/pflash/save"), ("GET", "/pflash")):
        r = await proxy.request(method, path, headers={"Origin": "http://127.0.0.1:1"} if method == "OPTIONS" else {})
        assert r.status == 404, (method, path, r.status)
        assert "Access-Control-Allow-Origin" not in r.headers
    assert not upstream.seen


async def test_save_is_not_callable_cross_site(aiohttp_client, upstream, tmp_path):
    """Issue 26.3: an HTML form on any site could POST /pflash/save (Host 127.0.0.1 passes the Host rule)."""
    proxy = await _proxy(aiohttp_client, upstream, tmp_path)
    host = f"127.0.0.1:{proxy.port}"
    form = {"Host": host, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site",
            "Content-Type": "application/x-www-form-urlencoded"}
    r = await proxy.post("/pflash/save", data=b"a=1", headers=form)
    assert r.status == 403 and (await r.json())["error"]["code"] == "cross_site_refused"
    for one in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": f"http://localhost:{proxy.port}"},
                {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                {"Content-Type": "text/plain"}, {"Content-Type": "multipart/form-data; boundary=x"},
                {"Content-Type": "application/x-www-form-urlencoded"}):
        r = await proxy.post("/pflash/save", data=b"", headers={"Host": host, **one})
        assert r.status == 403, one
    for fine in ({}, {"Content-Type": "application/json"}, {"Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"},
                 {"Sec-Fetch-Site": "none"}):
        r = await proxy.post("/pflash/save", data=b"{}", headers={"Host": host, **fine})
        assert r.status == 200 and await r.json() == {"saved": 0}, fine


async def test_stats_and_save_follow_the_inspectors_access_rule(aiohttp_client, upstream, tmp_path):
    """/pflash/stats names sessions and slots: like /pflash/api, loopback peers or the --api-key's bearer."""
    afar = await _proxy(aiohttp_client, upstream, tmp_path, peer="203.0.113.9")
    for method, path in (("GET", "/pflash/stats"), ("POST", "/pflash/save"), ("GET", "/pflash/api/overview")):
        r = await afar.request(method, path)
        assert r.status == 403 and (await r.json())["error"]["code"] == "inspector_forbidden", path
    assert (await afar.get("/pflash/metrics")).status == 200  # counts only, for scrapers
    keyed = await _proxy(aiohttp_client, upstream, tmp_path, peer="203.0.113.9", api_key="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    assert (await keyed.get("/pflash/stats", headers=auth)).status == 200
    assert (await keyed.post("/pflash/save", headers=auth)).status == 200
    assert (await keyed.get("/pflash/stats")).status == 403


async def _raw(port: int, target: str, method: str = "POST", headers: dict | None = None, body: bytes = b"{}"):
    """One request with the request target exactly as given (aiohttp's client would normalise it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", "Content-Length": str(len(body)),
            "Connection": "close", **(headers or {})}
    writer.write(f"{method} {target} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()
                                                                     ).encode() + b"\r\n" + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    status = int(raw.split(b" ", 2)[1])
    return status, raw.partition(b"\r\n\r\n")[2]


SPELLINGS = ["/./slots/0", "/slots/./0", "/slots/0/", "/slots%2F0", "/slots%2f0", "//slots/0", "/slots//0",
             "/slots/%30", "/slots/0%2F", "/x/../slots/0", "/slots/x/../0", "/%2E/slots/0", "/slots%u002F0",
             "/slots/0/.", "/./slots/../slots/0"]


async def test_every_spelling_of_a_guarded_route_is_refused_before_routing(aiohttp_client, upstream, tmp_path):
    """Issue 26.2 with a fake upstream: nothing of these reaches it (the real llama-server: test_path_spelling_real)."""
    proxy = await _proxy(aiohttp_client, upstream, tmp_path, allow_slot_actions=True)
    for path in SPELLINGS:
        status, body = await _raw(proxy.port, path + "?action=save", body=b'{"filename": "x.bin"}')
        assert status == 400 and b"non_canonical_path" in body, (path, status, body)
    for path in ("/./v1/chat/completions", "/v1//chat/completions", "/v1/chat/completions/", "/v1%2Fchat/completions",
                 "/v1/chat/x/../completions", "/./pflash/api/overview", "/pflash//stats"):
        status, body = await _raw(proxy.port, path, body=b'{"messages": []}')
        assert status == 400 and b"non_canonical_path" in body, (path, status)
    status, body = await _raw(proxy.port, "/./v1/messages", body=b'{"messages": []}')
    assert status == 400 and b'"type":"error"' in body.replace(b" ", b"")  # the Anthropic client's own shape
    assert not upstream.seen
    status, _ = await _raw(proxy.port, "/", method="GET", body=b"")  # the web UI's root still passes
    # passed through to llama-server's web UI, after one probe of whether it serves `/` (kept ROOT_PROBE_S)
    assert status == 200 and upstream.seen == ["GET /", "GET /"]
    status, _ = await _raw(proxy.port, "/", method="GET", body=b"")
    assert status == 200 and upstream.seen == ["GET /"] * 3


async def test_allowed_slot_actions_need_a_plain_integer_slot_id(aiohttp_client, upstream, tmp_path):
    """int() takes ' 1', '+1', '1_0' and '١'; llama-server's stoi reads other numbers from some of them."""
    proxy = await _proxy(aiohttp_client, upstream, tmp_path, allow_slot_actions=True)
    for slot in ("+0", "0x1", "1_0", "0abc", "-1", "١", "0.0"):
        status, body = await _raw(proxy.port, f"/slots/{slot}?action=save".replace("١", "%D9%A1"))
        assert status == 400, (slot, status, body)
        r = await proxy.post(f"/slots/{slot}?action=save", json={})
        assert r.status == 400, slot
    assert not upstream.seen
    r = await proxy.post("/slots/0?action=save", json={"filename": "ok.bin"})
    assert r.status == 200 and upstream.seen == ["POST /slots/0?action=save"]


def test_path_problem_and_host_name():
    for ok in ("/", "/v1/chat/completions", "/slots/0", "/pflash/ui/", "/health", "/v1/models"):
        assert path_problem(ok) is None, ok
    for bad in SPELLINGS + ["/v1/chat/completions/", "relative"]:
        assert path_problem(bad) is not None, bad
    assert canonical_path("/./v1//chat/x/../completions/") == "/v1/chat/completions"
    assert canonical_path("/slots%2F0") == "/slots/0"
    assert host_name("[::1]:8090") == "::1" and host_name("LocalHost.:80") == "localhost"
    assert host_name("127.0.0.1") == "127.0.0.1" and host_name("a:b") is None and host_name("[::1]x") is None


def test_host_takes_llama_servers_comma_separated_forms_and_public_host_repeats(tmp_path):
    s = load_settings({"host": "127.0.0.1, ::1,,[::2]", "upstream": "http://127.0.0.1:9"}, environ={})
    assert s.proxy.hosts == ["127.0.0.1", "::1", "::2"] and s.proxy.tcp_hosts == s.proxy.hosts
    assert s.proxy.local_url == "http://127.0.0.1:8090"
    assert load_settings({"host": "::1", "upstream": "http://x:1"}, environ={}).proxy.local_url == "http://[::1]:8090"
    assert load_settings({"host": "0.0.0.0", "upstream": "http://x:1"}, environ={}).proxy.local_url == \
        "http://127.0.0.1:8090"
    s = load_settings({"host": "/tmp/p.sock,127.0.0.1", "upstream": "http://x:1"}, environ={})
    assert s.proxy.unix_paths == ["/tmp/p.sock"] and s.proxy.tcp_hosts == ["127.0.0.1"]
    with pytest.raises(ConfigError, match="host"):
        load_settings({"host": " , ", "upstream": "http://x:1"}, environ={})
    with pytest.raises(ConfigError, match="port 0"):
        load_settings({"host": "127.0.0.1,::1", "port": 0, "upstream": "http://x:1"}, environ={})
    env = {"PFLASH_HOST": "127.0.0.1,::1", "PFLASH_PUBLIC_HOST": "proxy.lan, GPU-Box.", "PFLASH_UPSTREAM": "http://x:1"}
    s = load_settings({}, environ=env)
    assert s.proxy.hosts == ["127.0.0.1", "::1"] and s.inspector.public_host == ["proxy.lan", "gpu-box"]
    args = build_parser().parse_args(["serve", "--public-host", "a.lan", "--public-host", "b.lan,c.lan",
                                      "--host", "127.0.0.1,::1"])
    s = load_settings({k: v for k, v in vars(args).items() if k in ("public_host", "host")} |
                      {"upstream": "http://x:1"}, environ=env)  # the flag replaces the variable
    assert s.inspector.public_host == ["a.lan", "b.lan", "c.lan"]
    with pytest.raises(ConfigError, match="public_host"):
        load_settings({"public_host": ["http://a.lan:80"], "upstream": "http://x:1"}, environ={})


def test_several_addresses_with_port_0_are_refused(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", "http://127.0.0.1:9",
                        "--host", "127.0.0.1,::1", "--port", "0"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PFLASH_HOME": str(tmp_path)})
    assert r.returncode == 2 and "port 0" in r.stderr and "Traceback" not in r.stderr
