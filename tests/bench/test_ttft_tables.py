"""`bench ttft` tables and projection from recorded runs (no server)."""

from __future__ import annotations

import pytest

from pflash_proxy.bench.ttft import project, report


def _run(arm, n, ttft, tokens, mode, pflash_ms=None, case_id="c"):
    return {"arm": arm, "length": n, "case_id": case_id, "case_tokens": tokens + 5, "ttft_s": ttft, "total_s": ttft + 1, "prefill_tokens": tokens, "cached_tokens": 3,
            "prompt_tokens": tokens, "mode": mode, "cache": "miss", "pflash_ms": pflash_ms, "drafter_ms": None}


def test_projection_is_linear_plus_quadratic():
    assert project(1000, 1000, 1e12) == pytest.approx(1.0)
    assert project(2000, 1000, 2000) == pytest.approx(3.0)  # per-token cost doubles at Q


def test_report_tables(tmp_path):
    runs = [_run("full", 2048, 30.0, 2000, "off", case_id="a"), _run("pflash", 2048, 10.0, 700, "compressed", 40.0, "a"),
            _run("full", 2048, 32.0, 2100, "off", case_id="b"), _run("pflash", 2048, 12.0, 720, "full-flat", 60.0, "b")]
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
    assert "| a | 2005 | 30.0 | 10.0 | compressed | 700 | 3.000 |" in md  # per prompt, with its mode
    assert "| b | 2105 | 32.0 | 12.0 | full-flat | 720 | 2.667 |" in md
    assert "GPU projection (a projection, not a measurement" in md
    assert (tmp_path / "ttft.json").exists()


def test_chart_has_median_per_length_and_whole_chat_sum():
    from pflash_proxy.bench.ttft import chart

    runs = [_run("full", 4096, 30.0, 4000, "off"), _run("full", 4096, 40.0, 4000, "off"),
            _run("full", 4096, 90.0, 4000, "off"), _run("pflash", 4096, 10.0, 1300, "compressed", 30.0)]
    replay = [dict(_run(arm, 0, t, 100, "off"), turn=1, kind="long document") for arm, t in
              (("full", 50.0), ("pflash", 20.0), ("full", 2.0), ("pflash", 5.0))]
    c = chart({"lengths": [4096], "runs": runs, "replay": replay})
    assert c.categories == ["4K", "chat replay (sum)"]
    assert c.series == {"full prefill": [40.0, 52.0], "PFlash": [10.0, 25.0]}


def test_quick_presets_per_bench():
    from pflash_proxy.bench import apply_defaults
    from pflash_proxy.cli import build_parser

    def parsed(*argv):
        return apply_defaults(build_parser().parse_args(["bench", *argv]))

    quick_ttft = parsed("ttft", "--quick")
    assert (quick_ttft.lengths, quick_ttft.threshold, quick_ttft.prompts) == ([4096], 1024, 1)
    assert parsed("quality", "--quick").lengths == [2048, 4096]
    full = parsed("ttft")
    assert (full.lengths, full.threshold, full.prompts) == ([16384, 32768], 8192, 3)
    assert parsed("ttft", "--lengths", "8k", "--prompts", "5").prompts == 5
    assert parsed("quality", "--scorers", "lexical,attention").scorers == ["lexical", "attention"]


async def test_replay_first_turn_stands_in_for_the_same_prompt():
    """The replay's opening turn is the shortest length's first prompt: `_lengths` reuses its two rows instead of
    sending that case again, and sends every other prompt (no server: a send would fail on `http=None`)."""
    from types import SimpleNamespace

    from pflash_proxy.bench.sizing import sized_case
    from pflash_proxy.bench.ttft import _lengths

    async def count(text: str) -> int:
        return len(text.encode()) // 4

    doc = await sized_case(count, "multiturn", 4096, 0, 0, None)
    replay = [dict(_run(arm, 0, t, 4000, mode), turn=1, kind="long document", case_id=doc.case_id)
              for arm, t, mode in (("pflash", 5.0, "compressed"), ("full", 20.0, "off"))]
    replay.append(dict(_run("pflash", 0, 1.0, 50, "recall"), turn=2, kind="short follow-up"))
    arms = SimpleNamespace(http=None, full=None, pflash=None, count=count, cap=None)
    opts = SimpleNamespace(lengths=[4096], prompts=1, seed=0, verbose=False)
    rows = await _lengths(arms, opts, replay)
    assert [(r["arm"], r["ttft_s"], r["length"], r["from_replay"]) for r in rows] == [
        ("pflash", 5.0, 4096, True), ("full", 20.0, 4096, True)]
    opts.prompts = 2  # the second prompt (a retrieval case) is not in the replay: it must be sent
    with pytest.raises(AttributeError):
        await _lengths(arms, opts, replay)
