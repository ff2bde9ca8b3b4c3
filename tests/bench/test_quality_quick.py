"""One `bench quality --quick` run end to end through the proxy against a real llama-server."""

from __future__ import annotations

import json

import pytest

from pflash_proxy.cli import main

pytestmark = pytest.mark.llama


@pytest.mark.timeout(600)
def test_bench_quality_quick_end_to_end(gemma_model, tmp_path, capsys):
    # The bench spawns its own llama-server, as a user's run does: its slots hold the 4K cases at their size.
    out = tmp_path / "results"
    dump = tmp_path / "analyses.pkl"
    assert main(["bench", "quality", "--quick", "--model", str(gemma_model), "--out", str(out),
                 "--dump-analyses", str(dump)]) == 0
    md = (out / "quality.md").read_text()
    assert "| full prefill | 7/7 (100%) | – | 1.000 | 1.000 | 7/7 (100%) | – | 1.000 | 1.000 |" in md
    assert "pflash-attention | unavailable: no drafter configured" in md
    captured = capsys.readouterr()
    assert md.strip() in captured.out
    # the progress bar off a terminal: plain lines on stderr (one per tenth of the cases), no redrawing
    bar = [line for line in captured.err.splitlines() if line.startswith("quality [")]
    assert 2 <= len(bar) <= 11 and " 100% " in bar[-1] and "\r" not in captured.err
    data = json.loads((out / "quality.json").read_text())
    recs = data["records"]
    pflash = [r for r in recs if r["row"] == "pflash-lexical"]
    full = [r for r in recs if r["row"] == "full prefill"]
    assert len(pflash) == len(full) > 0 and all(r["all_gold"] for r in full)
    # cases were sized in llama-server's own tokens, within 5% of their length
    assert all(abs(n - int(cid.split("-")[-3][:-1]) * 1024) <= 0.05 * int(cid.split("-")[-3][:-1]) * 1024
               for cid, n in data["case_tokens"].items())
    assert {"compressed"} <= {r["mode"] for r in pflash}
    # compressed rows were counted by the upstream's tokenizer and kept less than they received
    for r in pflash:
        if r["mode"] == "compressed":
            assert r["kept_tokens"] < r["prompt_tokens"] and r["kept_fraction"] < 1
    # multi-turn follow-ups went through the same proxy session; the 4K one had lines left out, so recall acted
    follow = [r for r in pflash if r["turn"] > 0]
    assert follow and not {r["mode"] for r in pflash} & {"full-error", "?"}
    assert any(r["mode"] == "recall" for r in follow)
    # baselines used PFlash's budget: where PFlash compressed, they were shortened too
    for r in pflash:
        if r["mode"] == "compressed" and r["turn"] == 0:
            ht = next(x for x in recs if x["row"] == "head+tail" and x["case_id"] == r["case_id"] and x["turn"] == 0)
            assert ht["mode"] == "truncated"
    _check_replay(dump, pflash)


def _check_replay(dump, pflash):
    """--dump-analyses: each first turn replayed on the real pipeline serves what the bench saw; a scorer that
    sees nothing is served whole (on a cold request)."""
    import numpy as np

    from pflash_proxy.bench import analyses

    recs, cases = analyses.load(dump)
    first = {r["case_id"]: r for r in pflash if r["turn"] == 0}
    differs: list[str] = []
    assert {a.case_id for a in recs} == set(first) and all(a.row == "pflash-lexical" for a in recs)
    for a in recs:
        got = analyses.replay(a, cases[a.case_id], a.scores)
        assert got.mode == first[a.case_id]["mode"]
        if got.all_gold != first[a.case_id]["all_gold"]:
            differs.append(f"{a.case_id}: kept {got.kept_fraction:.3f} in the replay, "
                           f"{first[a.case_id]['kept_fraction']} in the bench")
        # each case is its own conversation (the agent cases at 2K and 4K share a prefix): judged cold
        assert not a.in_conversation
        assert analyses.replay(a, cases[a.case_id], np.zeros(len(a.units))).mode == "full-flat"
    if differs:  # known since the flat gate and named-definition changes; a replay of fusions would differ too
        pytest.xfail("the replay keeps a slightly larger share than the proxy did (its budget differs), so the "
                     "gold differs: " + "; ".join(differs))
