"""The overhead benchmarks on tiny inputs (``make test``): each measures, reports, and checks what it measured.

- ``proxy_overhead``: the proxy's added latency against llama-server direct, per request kind (``make bench``);
- ``ab_overhead``: two trees' proxies side by side, their turns interleaved, with bootstrap intervals;
- ``session_turns``: a session's index lookup and save per turn as its history grows;
- ``trace_log``: a session's trace write once it compressed documents;
- ``index_backends``: the embedded (SQLite) index on a turn's calls, opening, a crash and pruning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.perf import ab_overhead, index_backends, proxy_overhead, session_turns, trace_log

ROOT = Path(__file__).resolve().parents[2]


def test_the_interval_holds_the_difference_and_narrows_with_rounds():
    a = [10.0 + (i % 7) * 0.1 for i in range(400)]
    b = [9.0 + (i % 5) * 0.1 for i in range(400)]
    point, lo, hi = ab_overhead.median_diff_ci(a, b)
    assert lo <= point <= hi and abs(point - 1.1) < 1e-9  # medians 10.3 and 9.2
    _, lo_few, hi_few = ab_overhead.median_diff_ci(a[:20], b[:20])
    assert hi - lo <= hi_few - lo_few


@pytest.mark.llama
@pytest.mark.timeout(300)
def test_two_trees_side_by_side_on_a_real_server(tmp_path, gemma_model, capsys):
    out = tmp_path / "ab.json"
    ab_overhead.main(["--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--rounds", "4", "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"direct", "a parsed", "a passthrough", "b parsed", "b passthrough"}
    assert result["rounds"] == 4 and set(result["proxy_cpu_ms_per_round"]) == {"a", "b"}
    assert all(v > 0 for v in result["proxy_cpu_ms_per_round"].values())
    for tree in ("a", "b"):
        r = result["parsed_over_passthrough_net"][tree]
        assert r["ci95"][0] <= r["median"] <= r["ci95"][1]
    assert "b − a" in result["between_trees"]
    assert "parsed over passthrough" in capsys.readouterr().out


@pytest.mark.llama
@pytest.mark.timeout(300)
def test_the_proxys_added_latency_on_a_few_requests(tmp_path, gemma_model, capsys):
    results = proxy_overhead.main(["--requests", "4", "--chat-requests", "3", "--streams", "1",
                                   "--out", str(tmp_path / "proxy.json")])
    assert json.loads((tmp_path / "proxy.json").read_text()) == results
    over = results["parsed_over_passthrough"]
    assert over["proxy_cpu_ms_per_request"] == over["proxy_cpu_ms_per_request"]  # a number, not NaN
    assert results["proxy_rss_kb"]["VmRSS"] > 0 and results["stream"]["events"] > 0
    assert "the parsed chat turn over the same turn passed through" in capsys.readouterr().out


def test_a_tiny_session_is_looked_up_and_saved_every_turn(capsys):
    # 200 lines (~4K tokens): a smaller document leaves the pinned tail most of the budget and is served whole
    report = session_turns.main(["--sources", "1", "--doc-lines", "200", "--messages", "6", "--message-chars", "400",
                                 "--turns", "3"])
    assert report["turns"] == 3 and report["messages"] == 6
    assert report["lookup_ms_p50"] > 0 and report["save_ms_p50"] > 0
    assert 0 < report["record_bytes"] < report["stored_bytes"]
    assert json.loads(capsys.readouterr().out) == report


def test_a_turn_only_trace_write_stores_the_log_without_the_documents_texts():
    out = trace_log.measure(documents=3, doc_chars=6000, writes=3)
    assert out["writes"] == 3 and out["cpu_ms_per_write_p50"] > 0
    assert out["texts_read_back"] == 3  # a reader still gets every text
    assert out["log_bytes"] < 3 * 6000  # the log holds no text: each is under a key of its own
    assert out["bytes_stored_per_write_p50"] == out["log_bytes"]  # a write that adds no text writes the log alone


@pytest.mark.timeout(900)
def test_the_embedded_index_on_a_turns_calls(tmp_path, capsys):
    """Tiny in ``make test``; ``PFLASH_INDEX_BENCH=full`` runs the default sizes (200 sessions x 20 turns)."""
    full = os.environ.get("PFLASH_INDEX_BENCH") == "full"
    argv = [] if full else ["--sessions", "4", "--turns", "3", "--doc-lines", "200", "--recall-every", "2",
                            "--opens", "2", "--crashes", "1", "--crash-saves", "10"]
    report = index_backends.main([*argv, "--out", str(tmp_path / "index.json")])
    calls = report["calls"]
    assert set(calls) >= {"lookup", "save", "trace", "response", "cold get", "open", "reopen after kill", "prune half"}
    for call in calls.values():
        assert set(call) == set(index_backends.BACKENDS)
        assert all(r["ops_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] for r in call.values())
    sessions, turns = (200, 20) if full else (4, 3)
    assert calls["lookup"]["sqlite"]["n"] == calls["save"]["sqlite"]["n"] == sessions * turns
    # every save a killed writer reported committed was read back (the run asserts it, and counts them)
    assert report["crash_saves_read_back"] == {b: 600 if full else 10 for b in index_backends.BACKENDS}
    assert json.loads((tmp_path / "index.json").read_text()) == report
    assert "sqlite ops/s" in capsys.readouterr().out
