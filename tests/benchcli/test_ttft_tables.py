"""`bench ttft` tables and projection from recorded runs (no server)."""

from __future__ import annotations

import pytest

from pflash_proxy.benchcli.ttft import project, report


def _run(arm, n, ttft, tokens, mode, pflash_ms=None):
    return {"arm": arm, "length": n, "ttft_s": ttft, "total_s": ttft + 1, "prefill_tokens": tokens, "cache_n": 3,
            "prompt_tokens": tokens, "mode": mode, "cache": "miss", "pflash_ms": pflash_ms, "drafter_ms": None}


def test_projection_is_linear_plus_quadratic():
    assert project(1000, 1000, 1e12) == pytest.approx(1.0)
    assert project(2000, 1000, 2000) == pytest.approx(3.0)  # per-token cost doubles at Q


def test_report_tables(tmp_path):
    runs = [_run("full", 2048, 30.0, 2000, "off"), _run("pflash", 2048, 10.0, 700, "compressed", 40.0),
            _run("full", 2048, 32.0, 2100, "off"), _run("pflash", 2048, 12.0, 720, "compressed", 60.0)]
    replay = [dict(_run(arm, 0, t, 100, "off" if arm == "full" else "recall"), turn=k, kind="short follow-up")
              for k, (arm, t) in enumerate([("pflash", 1.0), ("full", 2.0)] * 2, start=1)]
    resume = [dict(_run("pflash", 0, 0.5, 20, "passthrough"), case="resume from SSD snapshot", cache="restored"),
              dict(_run("direct", 0, 9.0, 900, "off"), case="cold: same served prompt, slots erased")]
    data = {"lengths": [2048], "runs": runs, "replay": replay, "resume": resume, "scorer": "lexical",
            "upstream": "x", "threshold": 1024, "prompts": 2, "seconds": 1.0, "resume_error": None}
    w = report(data, tmp_path)
    md = w.markdown
    assert "| 2K | full | 2 | off | 2050.0 | 3 | 31.0 | 31.0 | – |" in md
    assert "| 2K | speedup (median full / median pflash) |" in md and "2.818" in md
    assert "| resume from SSD snapshot | 0.500 | 20 | 3 | restored |" in md
    assert "| lexical | no drafter | 50.0 |" in md
    assert "GPU projection (a projection, not a measurement" in md
    assert (tmp_path / "ttft.json").exists()
