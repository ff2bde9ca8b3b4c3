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
    assert main.headers[1:5] == ["4K gold whole", "4K served flat", "4K kept", "4K median kept"]
    assert main.rows[0][2] == "–" and main.rows[0][4] == 1.0  # a baseline has no fallback; keeps everything
    assert negative.rows[0][1] == "1/1 (100%)" and "aggregation" in negative.title
    assert follow.rows[0][1] == "3/3 (100%)"
    assert main.rows[3][1].startswith("unavailable")
    assert chart.series["full prefill"] == [100.0, 100.0]


def test_family_table_counts_gold_and_flat_fallbacks(cases):
    records = [r for c in cases for r in _baselines(c, c.messages, seed=0)]
    first = [r for r in records if r["row"] == "full prefill" and r["turn"] == 0 and not r["negative_control"]]
    for i, r in enumerate(first):  # a PFlash row: every other case served whole by the flat fallback
        flat = i % 2 == 0
        records.append({**r, "row": "pflash-lexical", "mode": "full-flat" if flat else "compressed",
                        "all_gold": flat})
    data = {"lengths": [4096, 8192], "rows": ["full prefill", "head+tail", "random units", "pflash-lexical"],
            "unavailable": {}, "records": records}
    ts, _ = tables(data)
    fam = next(t for t in ts if t.title.startswith("Main families"))
    assert fam.headers[3] == "pflash-lexical"
    by = {(row[0], row[1]): row for row in fam.rows}
    assert len(by) == len(first)  # one case per family and length here
    cells = [row[3] for row in fam.rows]
    assert cells.count("1/1 (1 flat)") == (len(first) + 1) // 2 and cells.count("0/1") == len(first) // 2
    assert ts[-1].title.startswith("Per case")
    main = ts[0]
    lex = next(row for row in main.rows if row[0] == "pflash-lexical")
    assert lex[2] == sum(r["mode"] == "full-flat" and r["length"] == 4096 for r in records)  # 4K served flat


def test_render_rewrites_a_report_from_its_json_and_refuses_another_bench(cases, tmp_path):
    import json
    import subprocess
    import sys

    records = [r for c in cases for r in _baselines(c, c.messages, seed=0)]
    data = {"bench": "quality", "quick": False, "lengths": [4096, 8192], "threshold": 1024, "seed": 0,
            "families": sorted({c.family for c in cases}), "rows": ["full prefill", "head+tail", "random units"],
            "case_tokens": {}, "unavailable": {}, "seconds": 1.0, "records": records}
    src = tmp_path / "old.json"
    src.write_text(json.dumps(data))
    cmd = [sys.executable, "-m", "pflash_proxy", "bench", "quality", "--render", str(src), "--out", str(tmp_path / "o")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "o" / "quality.md").read_text()
    assert "Main families, first turn" in md and "run took 1.0 s" in md
    assert json.loads((tmp_path / "o" / "quality.json").read_text())["records"] == records
    wrong = subprocess.run([*cmd[:4], "ttft", *cmd[5:]], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "holds a 'quality' run, not 'ttft'" in wrong.stderr
    missing = subprocess.run([*cmd[:6], str(tmp_path / "nope.json"), *cmd[7:]], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_render_merges_runs_split_by_family_and_refuses_what_does_not_compare(cases, tmp_path):
    import json
    import subprocess
    import sys

    def run_of(fams, **over):
        recs = [r for c in cases if c.family in fams for r in _baselines(c, c.messages, seed=0)]
        return {"bench": "quality", "quick": False, "lengths": [4096, 8192], "threshold": 1024, "seed": 0,
                "families": sorted(fams), "rows": ["full prefill", "head+tail", "random units"],
                "case_tokens": {}, "unavailable": {}, "seconds": 2.5, "records": recs, **over}

    families = sorted({c.family for c in cases})
    paths = []
    for i, part in enumerate((families[:3], families[3:], families[:1])):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(run_of(part)))
    seed9 = tmp_path / "seed9.json"
    seed9.write_text(json.dumps(run_of(families[3:], seed=9)))
    cmd = [sys.executable, "-m", "pflash_proxy", "bench", "quality", "--out", str(tmp_path / "o"), "--render"]
    out = subprocess.run([*cmd, str(paths[0]), str(paths[1])], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    merged = json.loads((tmp_path / "o" / "quality.json").read_text())
    whole = run_of(families)
    assert sorted(merged["records"], key=json.dumps) == sorted(whole["records"], key=json.dumps)
    assert merged["families"] == families and merged["seconds"] == 5.0
    md = (tmp_path / "o" / "quality.md").read_text()
    assert "merged from 2 runs" in md and "9/9 (100%)" in md  # every case of both runs in one table
    twice = subprocess.run([*cmd, str(paths[0]), str(paths[2])], capture_output=True, text=True, timeout=120)
    assert twice.returncode == 2 and "is in both" in twice.stderr
    other = subprocess.run([*cmd, str(paths[0]), str(seed9)], capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "seed 9 != 0" in other.stderr
