"""What the turns saved (``stages.savings``): per turn, per session and overall, in ``/pflash/api``, the metrics,
``pflash-proxy show`` and the pages (headless Chromium).

A real llama-server (gemma-3-270m) with one slot, so that sessions displace each other: session A's first turn
is compressed (a miss), session B's long flat message is served whole, A's second turn is restored from its
snapshot, B's second turn too (an uncompressed session whose savings are the cache's).
"""

from __future__ import annotations

import re
import shutil

import pytest

from pflash_proxy.sessions import traces as tr
from pflash_proxy.stages.savings import client_name, plain_reason, session_rate
from pflash_proxy.server.app import create_app
from pflash_proxy.server.metrics import Metrics
from pflash_proxy.sessions.index import SessionRecord, TraceLog
from pflash_proxy.stats import BodyStats, ByCause, ProxyStats, RequestStats, SavingsStats, UpstreamStats
from tests.conftest import make_settings, start_llama_server
from tests.inspector.test_inspector_browser import CHROMIUM, KEEP, REPORTED
from tests.inspector.test_inspector_real import show
from tests.stages.test_compress_real import CURVE, SAMPLING, document

QUESTION = "What was the name of the silver eagle, the prize bird?"
CLAUDE = {"User-Agent": "claude-cli/2.1.3 (external, cli)", "x-app": "cli"}
FLAT = "\n".join(f"invoice {i}: customer {i % 17} paid the invoice amount of {i * 3} euros"
                 for i in range(80)) + "\n\nList every invoice."  # ~1.3K tokens: over the threshold, flat


@pytest.fixture(scope="module")
def one_slot(gemma_model, tmp_path_factory):
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("llama-savings"), parallel=1, ctx_per_slot=4096)
    yield server
    server.stop()


async def _ask(client, messages, headers=None):
    resp = await client.post("/v1/chat/completions", json={"messages": messages, **SAMPLING}, headers=headers or {})
    body = await resp.json()
    assert resp.status == 200, body
    return resp.headers, body


async def four_turns(aiohttp_client, server, tmp_path):
    """A1 compressed (miss), B1 served whole (A saved), A2 restored, B2 restored; returns (client, A, B)."""
    settings = make_settings(server.url, tmp_path, slot_save_path=server.slot_dir, threshold=1000,
                             prefill_curve=CURVE, query_pin=32)
    client = await aiohttp_client(create_app(settings))
    a1 = [{"role": "user", "content": document() + "\n\n" + QUESTION}]
    h, body = await _ask(client, a1, CLAUDE)
    assert h["X-PFlash-Mode"] == "compressed" and h["X-PFlash-Cache"] == "miss"
    sid_a = h["X-PFlash-Session"]
    b1 = [{"role": "user", "content": FLAT}]
    h, bbody = await _ask(client, b1, {"originator": "codex_exec"})
    assert h["X-PFlash-Mode"] == "full-flat"
    sid_b = h["X-PFlash-Session"]
    a2 = a1 + [body["choices"][0]["message"], {"role": "user", "content": "Thanks. Who kept the eagle?"}]
    h, _ = await _ask(client, a2, CLAUDE)
    assert h["X-PFlash-Session"] == sid_a and h["X-PFlash-Cache"] == "restored"
    b2 = b1 + [bbody["choices"][0]["message"], {"role": "user", "content": "And invoice 7?"}]
    h, _ = await _ask(client, b2, {"originator": "codex_exec"})
    assert h["X-PFlash-Session"] == sid_b and h["X-PFlash-Cache"] == "restored"
    return client, sid_a, sid_b


@pytest.mark.llama
@pytest.mark.timeout(900)  # four real turns; a loaded 2-core machine needs more than the default 300 s
async def test_turns_show_cache_prefill_and_time_saved_by_cause(aiohttp_client, one_slot, tmp_path):
    client, sid_a, sid_b = await four_turns(aiohttp_client, one_slot, tmp_path)
    a = await (await client.get(f"/pflash/api/sessions/{sid_a}")).json()
    t1, t2 = a["turns"]
    comp = next(t for t in a["traces"] if t["kind"] == "compression")
    # turn 1: a miss, compressed: the tokens compression kept from the prefill and their time at the session's rate
    assert t1["turn"] == 1 and t1["cache"] == "miss" and t1["client"] == "claude-cli"
    assert t1["prefilled_tokens"] > 500 and t1["prefill_ms"] > 0 and t1["cached_tokens"] >= 0
    assert t1["tokens_avoided"]["compression"] == comp["message_tokens"] - comp["served_tokens"] > 0
    assert t1["rate_tps"] > 0 and t1["saved_s"]["compression"] > 0
    assert t1["messages"] == [{"message": 0, "mode": "compressed", "tokens": comp["message_tokens"],
                               "served_tokens": comp["served_tokens"], "why": None}]
    # turn 2: restored from the snapshot: the tokens the server reused are what the cache saved
    assert t2["turn"] == 2 and t2["cache"] == "restored" and t2["cached_tokens"] > 500
    assert t2["tokens_avoided"] == {"compression": 0, "cache": t2["cached_tokens"]}
    assert t2["saved_s"]["cache"] == pytest.approx(t2["cached_tokens"] / t2["rate_tps"], rel=0.01)
    s = a["session"]
    assert s["client"] == "claude-cli" and s["first_words"].startswith(document().split()[0])
    assert s["last_cache"] == "restored"
    v = s["savings"]
    assert v["turns_timed"] == 2 and v["prefilled_tokens"] == t1["prefilled_tokens"] + t2["prefilled_tokens"]
    assert v["tokens_avoided"] == {"compression": t1["tokens_avoided"]["compression"],
                                   "cache": t1["cached_tokens"] + t2["cached_tokens"]}
    assert v["saved_s"]["cache"] > 0 and "estimate" in v["note"]

    b = await (await client.get(f"/pflash/api/sessions/{sid_b}")).json()
    whole = b["turns"][0]["messages"][0]
    assert whole["mode"] == "full-flat" and "stood out" in whole["why"]  # why it was served whole, in plain words
    assert b["session"]["client"] == "codex_exec" and b["session"]["first_words"].startswith("invoice 0:")
    assert b["session"]["tokens_saved"] == 0 and b["session"]["savings"]["saved_s"]["cache"] > 0
    assert "nothing to shorten" in b["turns"][1]["why"]  # a short question: nothing to compress, said in words

    # the overview's totals count what the table counts (all new long messages, compressed or served whole)
    ov = await (await client.get("/pflash/api/overview")).json()
    listed = {x["id"]: x for x in ov["sessions"]}
    assert ov["totals"]["tokens_in"] == listed[sid_a]["tokens_in"] + listed[sid_b]["tokens_in"]
    assert ov["totals"]["tokens_served"] == listed[sid_a]["tokens_served"] + listed[sid_b]["tokens_served"]
    assert ov["totals"]["tokens_avoided"]["cache"] == v["tokens_avoided"]["cache"] + \
        b["session"]["savings"]["tokens_avoided"]["cache"]
    assert listed[sid_b]["client"] == "codex_exec" and listed[sid_a]["first_words"]

    metrics = await (await client.get("/pflash/metrics")).text()
    avoided = float(re.search(r'pflash_prefill_tokens_avoided_total\{cause="compression"\} (\S+)', metrics)[1])
    assert avoided == t1["tokens_avoided"]["compression"]
    assert float(re.search(r'pflash_prefill_seconds_saved_total\{cause="cache"\} (\S+)', metrics)[1]) > 0

    base = str(client.make_url("")).rstrip("/")
    listing = await show("--url", base)
    assert listing.returncode == 0 and "claude-cli" in listing.stdout and "codex_exec" in listing.stdout
    one = await show(sid_b, "--url", base)
    assert one.returncode == 0, one.stderr
    assert re.search(r"turn 2: restored, cached [\d,]+, prefilled", one.stdout)
    assert re.search(r"time saved ≈ \d[^;]*cache [1-9][\d.]*m?s for [\d,]+ tokens", one.stdout)  # not "0 saved"
    assert "stood out" in one.stdout


@pytest.mark.llama
@pytest.mark.timeout(900)
async def test_pages_show_time_saved_on_a_compressed_and_a_restored_turn(aiohttp_client, one_slot, tmp_path):
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    client, sid_a, _ = await four_turns(aiohttp_client, one_slot, tmp_path)
    base = str(client.make_url("")).rstrip("/")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{base}/pflash/ui/session/{sid_a}")
            await page.wait_for_selector("tr.turn")
            compressed = await page.locator("tr.turn[data-turn='1']").inner_text()
            restored = await page.locator("tr.turn[data-turn='2']").inner_text()
            assert "miss" in compressed and re.search(r"≈ \d+(\.\d+)? m?s \(compression [1-9]", compressed)
            assert "restored" in restored and re.search(r"≈ \d+(\.\d+)? m?s \(compression 0 ms · cache [1-9]",
                                                        restored)
            assert "estimate" in await page.locator("#turns").inner_text()
            assert "time saved (estimate)" in await page.locator("#meta").inner_text()
            shot = tmp_path / "session-turns.png"
            await page.screenshot(path=str(shot), full_page=False)
            await page.goto(f"{base}/pflash/ui")
            await page.wait_for_selector(f"#sessions a[href='/pflash/ui/session/{sid_a}']")
            table = await page.locator("#sessions").inner_text()
            assert "claude-cli" in table and "codex_exec" in table and "invoice 0:" in table
            totals = await page.locator("#totals").inner_text()
            assert "time saved (estimate)" in totals and "compressed or served whole" in totals
            over = tmp_path / "overview-savings.png"
            await page.screenshot(path=str(over))
            assert errors == []
            if KEEP:
                REPORTED.mkdir(parents=True, exist_ok=True)
                shutil.copy(shot, REPORTED / "test-session-turns.png")
                shutil.copy(over, REPORTED / "test-overview-savings.png")
        finally:
            await browser.close()


def test_client_names_from_headers():
    assert client_name(CLAUDE) == "claude-cli"
    assert client_name({"originator": "codex_exec", "User-Agent": "codex_exec/0.1"}) == "codex_exec"
    assert client_name({"User-Agent": "opencode/0.3.1 ai-sdk/4"}) == "opencode"
    assert client_name({"User-Agent": "OpenAI/Python 1.40.0"}) == "OpenAI"
    assert client_name({"x-app": "cli"}) == "cli" and client_name({}) is None
    assert client_name({"User-Agent": "<script>"}) is None  # only a product token, never markup


def test_reasons_in_plain_words():
    assert plain_reason("compressed", None) is None and plain_reason("recall", None) is None
    assert "stood out" in plain_reason("full-flat", "relevance too flat: spread 0.9 > 0.11")
    assert "at least 1,000 tokens" in plain_reason("passthrough", None, 1000)
    assert "--no-pflash" in plain_reason(None, None)
    assert "failed" in plain_reason("full-error", "ValueError: x")


def test_traces_written_out_of_turn_order_are_kept_in_turn_order():
    """A session moved to another node within its first node's trace wait: turn 4's traces are written before
    turns 2 and 3's; the log reads 1, 2, 3, 4 (each turn's own traces in their order), and the newest kept."""
    kept = TraceLog()
    for n in (1, 4, 2, 3):
        turn = tr.TurnTraces(n)
        turn.add({"kind": "compression", "turn": n, "message": 0, "text": None, "step": "a"})
        turn.add({"kind": "recall", "turn": n, "message": 0, "text": None, "step": "b"})
        turn.add({"kind": "turn", "turn": n}, {"turns_timed": 1})
        kept = tr.append(kept, turn)
    assert [t["turn"] for t in kept.traces if t["kind"] == "turn"] == [1, 2, 3, 4]
    rest = [(t["turn"], t["step"]) for t in kept.traces if t["kind"] != "turn"]
    assert rest == [(n, s) for n in (1, 2, 3, 4) for s in "ab"][-tr.MAX_TRACES:]
    assert kept.totals["turns_timed"] == 4


def test_turn_traces_are_bounded_apart_from_the_compression_traces(monkeypatch):
    monkeypatch.setattr(tr, "MAX_TURNS", 2)
    kept = TraceLog([{"kind": "compression", "turn": 1, "message": 0, "text": None, "message_tokens": 10,
                      "served_tokens": 5, "mode": "compressed"}])
    for n in range(1, 5):
        turn = tr.TurnTraces(n)
        turn.add({"kind": "turn", "turn": n}, {"turns_timed": 1, "prefilled_tokens": 100,
                                               "timed_prefilled_tokens": 100, "timed_prefill_ms": 50})
        kept = tr.append(kept, turn)
    assert [t["kind"] for t in kept.traces] == ["turn", "turn", "compression"]  # the newest compression trace last
    assert [t["turn"] for t in kept.traces[:2]] == [3, 4]
    assert kept.totals["turns_timed"] == 4 and session_rate(kept.totals) == 2000


def test_a_session_of_trace_version_1_is_read_under_the_new_names():
    """Version 1 traces and totals named a turn's counts after llama-server's timings: read, they have the names
    of version 2, and a new turn adds to the old totals."""
    rec = SessionRecord(id="f" * 32, seed="s")
    rec.traces = [{"v": 1, "kind": "turn", "turn": 1, "cache_n": 7, "prompt_n": 3, "prompt_ms": 1.5,
                   "predicted_n": 1, "predicted_ms": 0.5}]
    rec.trace_totals = {"turns_timed": 1, "prompt_n": 300, "cache_n": 7, "timed_prompt_n": 300,
                        "timed_prompt_ms": 100}
    assert tr.current(rec.traces[0]) == {"v": 1, "kind": "turn", "turn": 1, "cached_tokens": 7,
                                         "prefilled_tokens": 3, "prefill_ms": 1.5, "generated_tokens": 1,
                                         "generate_ms": 0.5}
    turn = tr.TurnTraces(2)  # a turn of this version: written to the session's trace log
    turn.add({"kind": "turn", "turn": 2}, {"turns_timed": 1, "prefilled_tokens": 100,
                                           "timed_prefilled_tokens": 100, "timed_prefill_ms": 100})
    both = tr.log_of(rec, tr.append(TraceLog(), turn))
    assert both.totals == {"turns_timed": 2, "prefilled_tokens": 400, "cached_tokens": 7,
                           "timed_prefilled_tokens": 400, "timed_prefill_ms": 200}
    assert session_rate(both.totals) == 2000 and [t["turn"] for t in both.traces] == [1, 2]


def test_savings_metrics_by_cause():
    savings = SavingsStats(turns=2, turns_timed=2, prompt_tokens=1500, prefilled_tokens=300, cached_tokens=1200,
                           message_tokens=1000, message_served_tokens=300, prefill_s=0.2,
                           tokens_avoided=ByCause(compression=700, cache=1200),
                           seconds_saved=ByCause(compression=0.5, cache=0.9), seconds_saved_note="estimate")
    stats = ProxyStats(RequestStats(0, {}), UpstreamStats("http://127.0.0.1:9", True, None), BodyStats(0, 0, 0),
                       {"savings": savings})
    m = Metrics()
    m.bind(lambda: stats)
    text = m.prometheus().decode()
    assert 'pflash_prefill_tokens_avoided_total{cause="compression"} 700.0' in text
    assert 'pflash_prefill_seconds_saved_total{cause="cache"} 0.9' in text
    assert "pflash_prefill_tokens_total 300.0" in text
