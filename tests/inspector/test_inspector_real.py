"""The inspector's JSON, access rules and ``pflash-proxy show`` after real compressed turns (issue 14).

A real llama-server (gemma-3-270m) and a proxy with the threshold lowered to ~1K tokens, as in
``test_compress_real``: one compressed turn and one recall turn, then ``/pflash/api`` and the CLI must show what
the model read — the original lines, which units were omitted, every unit's score, the request span, the budget.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pflash_proxy.inspector.routes import allowed, is_loopback
from pflash_proxy.server.app import create_app
from tests.conftest import make_settings
from tests.stages.test_compress_real import CURVE, SAMPLING, TOPICS, document

QUESTION = "What was the name of the silver eagle, the prize bird?"


async def compressed_session(aiohttp_client, llama_server, tmp_path, **kw):
    """A proxy, one compressed turn and one recall turn; returns (client, session id, original, served turn 1)."""
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             prefill_curve=CURVE, query_pin=32, **kw)
    app = create_app(settings)
    client = await aiohttp_client(app)
    original = document() + "\n\n" + QUESTION
    turn1 = [{"role": "user", "content": original}]
    resp = await client.post("/v1/chat/completions", json={"messages": turn1, **SAMPLING})
    body = await resp.json()
    assert resp.status == 200 and resp.headers["X-PFlash-Mode"] == "compressed", body
    sid = resp.headers["X-PFlash-Session"]
    data = await (await client.get(f"/pflash/api/sessions/{sid}")).json()
    served = data["messages"][0]["text"]
    omitted_topic = next(t for t in TOPICS if f"the {t} records list" not in served)
    turn2 = turn1 + [body["choices"][0]["message"],
                     {"role": "user", "content": f"What about the {omitted_topic} keepers and their {omitted_topic} "
                                                 "ledgers?"}]
    resp2 = await client.post("/v1/chat/completions", json={"messages": turn2, **SAMPLING})
    assert resp2.status == 200 and resp2.headers["X-PFlash-Mode"] == "recall"
    return client, sid, original, served, omitted_topic


@pytest.mark.llama
async def test_session_api_shows_omitted_units_scores_and_the_original(aiohttp_client, llama_server, tmp_path):
    client, sid, original, served, omitted_topic = await compressed_session(aiohttp_client, llama_server, tmp_path)
    resp = await client.get(f"/pflash/api/sessions/{sid}")
    assert resp.status == 200
    data = await resp.json()
    assert data["session"]["id"] == sid and data["session"]["turns"] == 2
    assert data["session"]["compressed"] == 1 and data["session"]["tokens_saved"] > 0
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user"]

    comp = next(t for t in data["traces"] if t["kind"] == "compression")
    assert comp["message"] == 0 and comp["turn"] == 1 and comp["mode"] == "compressed"
    assert comp["scorer"] == "lexical" and comp["budget"] > 0 and comp["served_tokens"] < comp["message_tokens"]
    assert abs(comp["served_tokens"] - comp["budget"]) <= 0.02 * comp["budget"]  # the message's budget, landed on
    assert "\n".join(comp["lines"]) == original  # the original, line for line
    units = comp["units"]
    assert [u["index"] for u in units] == list(range(len(units)))
    assert units[0]["lines"][0] == 0 and units[-1]["lines"][1] == len(comp["lines"])
    assert all(a["lines"][1] == b["lines"][0] for a, b in zip(units, units[1:]))  # they tile the message
    assert all(isinstance(u["score"], float) and u["score"] >= 0 for u in units)
    omitted = [u for u in units if not u["kept"]]
    assert omitted and any(u["kept"] for u in units)
    for u in omitted:  # omitted lines are in the original and not in what the model read
        text = "\n".join(comp["lines"][u["lines"][0]:u["lines"][1]]).strip()
        if text:
            assert text in original and text not in served
    needle = next(u for u in units if any("silver eagle named Orrin" in comp["lines"][i]
                                          for i in range(*u["lines"])))
    assert needle["kept"] and needle["score"] >= max(u["score"] for u in omitted)
    # the request span: the question at the message's tail, found by its form (issue 48), pinned
    req = comp["request"]
    assert req["source"] == "question" and QUESTION in req["text"]
    a, b = req["lines"]
    assert QUESTION in comp["lines"][a:b] and b == len(comp["lines"])
    assert units[-1]["pinned"] and units[-1]["kept"]

    recall = next(t for t in data["traces"] if t["kind"] == "recall")
    assert recall["message"] == 2 and recall["turn"] == 2 and recall["share"] > 0
    ex = recall["excerpts"]
    assert ex and all(e["from_message"] == "1" for e in ex)
    assert any(f"the {omitted_topic} records list" in e["text"] for e in ex)
    for e in ex:  # where it came from: those lines of message 1, all omitted units
        assert e["text"].rstrip("\n") == "\n".join(comp["lines"][e["lines"][0]:e["lines"][1]]).rstrip("\n")
        assert all(not units[i]["kept"] for i in e["units"])

    # the overview lists the session, its slot and the totals
    ov = await (await client.get("/pflash/api/overview")).json()
    assert ov["upstream"]["ready"] and len(ov["slots"]) == 2
    assert any(s["session"] == sid for s in ov["slots"])
    listed = next(s for s in ov["sessions"] if s["id"] == sid)
    assert listed["turns"] == 2 and listed["compressed"] == 1 and listed["recalls"] == 1
    assert ov["totals"]["compressed"] == 1 and ov["totals"]["tokens_saved"] == listed["tokens_saved"]
    assert ov["counters"]["requests"]["total"] >= 2

    # pages and their files; unknown or malformed ids are 404 JSON
    page = await client.get(f"/pflash/ui/session/{sid}")
    assert page.status == 200 and page.content_type == "text/html"
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert (await client.get("/pflash/ui")).status == 200
    js = await client.get("/pflash/ui/static/session.js")
    assert js.status == 200 and "details" in await js.text()
    for path in ("/pflash/api/sessions/" + "0" * 32, "/pflash/api/sessions/nope", "/pflash/ui/session/" + "0" * 32,
                 "/pflash/ui/static/routes.py", "/pflash/ui/static/nothing.js"):
        r = await client.get(path)
        assert r.status == 404, path
        assert "error" in await r.json()

    # pflash-proxy show: the list, one session, an unknown one, an unreachable proxy
    base = str(client.make_url("")).rstrip("/")
    listing = await show("--proxy", base)
    assert listing.returncode == 0 and sid in listing.stdout
    one = await show(sid[:10], "--proxy", base)
    assert one.returncode == 0, one.stderr
    assert re.search(r"… \d+ lines? omitted \(units? \d+(–\d+)?, scores? [\d.e+-]+", one.stdout)
    assert "silver eagle named Orrin" in one.stdout and f"the {omitted_topic} records list" not in \
        one.stdout.split("── message 2")[0]  # the omitted section is folded in message 1
    assert "[compressed · " in one.stdout and "budget" in one.stdout and "scorer lexical" in one.stdout
    assert "from message 1, lines" in one.stdout
    unknown = await show("f" * 32, "--proxy", base)
    assert unknown.returncode == 1 and "404" in unknown.stderr and "Traceback" not in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1


async def show(*args):
    return await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
        [sys.executable, "-m", "pflash_proxy.cli", "show", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ}))


def test_show_with_an_unreachable_proxy_is_one_line():
    r = subprocess.run([sys.executable, "-m", "pflash_proxy.cli", "show", "--proxy", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PFLASH_UPSTREAM": "http://127.0.0.1:9"})
    assert r.returncode == 1 and "cannot reach the proxy at http://127.0.0.1:9" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _request_from(peer: str, app: web.Application, headers: dict | None = None) -> web.Request:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (peer, 40000) if name == "peername" else default
    return make_mocked_request("GET", "/pflash/api/overview", headers=headers or {}, app=app, transport=transport)


def test_loopback_only_unless_a_key_is_given(tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("203.0.113.9") and not is_loopback("10.0.0.1") and not is_loopback(None)
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path))
    assert allowed(_request_from("127.0.0.1", app)) is None
    refused = allowed(_request_from("203.0.113.9", app))
    assert refused is not None and refused.status == 403 and b"loopback clients only" in refused.body
    keyed = create_app(make_settings("http://127.0.0.1:9", tmp_path, api_key="s3cret"))
    assert allowed(_request_from("203.0.113.9", keyed, {"Authorization": "Bearer s3cret"})) is None
    for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        r = allowed(_request_from("203.0.113.9", keyed, bad))
        assert r is not None and r.status == 403
    assert allowed(_request_from("127.0.0.1", keyed)) is None  # loopback needs no key


async def test_a_non_loopback_peer_gets_403_json_on_every_inspector_route(aiohttp_client, tmp_path):
    @web.middleware
    async def from_afar(request, handler):  # the socket's peer as a remote host would have it
        return await handler(request.clone(remote="203.0.113.9"))

    app = create_app(make_settings("http://127.0.0.1:9", tmp_path, sessions=False))
    app.middlewares.insert(0, from_afar)
    client = await aiohttp_client(app)
    for path in ("/pflash/ui", "/pflash/ui/session/" + "a" * 32, "/pflash/ui/static/session.js",
                 "/pflash/api/overview", "/pflash/api/sessions", "/pflash/api/sessions/" + "a" * 32):
        r = await client.get(path)
        assert r.status == 403, path
        assert (await r.json())["error"]["code"] == "inspector_forbidden"


def test_every_page_file_is_package_data():
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "pflash_proxy.inspector"]
    files = [p.relative_to(root / "pflash_proxy" / "inspector").as_posix()
             for p in (root / "pflash_proxy" / "inspector" / "static").iterdir()]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), files
