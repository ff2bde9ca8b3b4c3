"""Quality rows without a server: the full-prefill row keeps all gold; baselines use PFlash's budget."""

from __future__ import annotations

import pytest

from pflash_proxy.bench.cases import default_count_tokens, generate, head_tail_truncate, messages_text
from pflash_proxy.bench.quality import _baselines, _longest_index, tables


@pytest.fixture(scope="module")
def cases():
    return generate(lengths=(4096, 8192), seed=3)


def test_full_prefill_row_keeps_all_gold(cases):
    for case in cases:
        for rec in _baselines(case, case.messages, seed=3):
            if rec["row"] == "full prefill":
                assert rec["all_gold"], rec
                assert rec["kept_fraction"] == 1.0 and rec["mode"] == "full"
    assert any(c.followups for c in cases)  # follow-up turns are covered too


def test_baselines_shorten_to_the_budget_pflash_used(cases):
    case = next(c for c in cases if c.family == "ruler_single" and c.target_tokens == 8192)
    idx = _longest_index(case.messages)
    served = [dict(m) for m in case.messages]
    budget_text = head_tail_truncate(served[idx]["content"], 2000)
    served[idx]["content"] = budget_text  # stands in for PFlash's served message
    budget = default_count_tokens(messages_text([served[idx]]))
    recs = {r["row"]: r for r in _baselines(case, served, seed=1)}
    for row in ("head+tail", "random units"):
        assert recs[row]["mode"] == "truncated" and recs[row]["budget"] == budget
        assert recs[row]["kept_fraction"] < 0.35
    assert recs["full prefill"]["all_gold"]


def test_tables_separate_negative_control_and_followups(cases):
    records = [r for c in cases for r in _baselines(c, c.messages, seed=0)]
    data = {"lengths": [4096, 8192], "rows": ["full prefill", "head+tail", "random units", "pflash-attention"],
            "unavailable": {"pflash-attention": "unavailable: no drafter configured (--drafter GGUF)"},
            "records": records}
    ts, chart = tables(data)
    main, negative, follow = ts[0], ts[1], ts[2]
    assert main.rows[0][:2] == ["full prefill", "9/9 (100%)"]
    assert negative.rows[0][1] == "1/1 (100%)" and "aggregation" in negative.title
    assert follow.rows[0][1] == "3/3 (100%)"
    assert main.rows[3][1].startswith("unavailable")
    assert chart.series["full prefill"] == [100.0, 100.0]
