"""``benchmarks/ab_overhead.py`` on tiny inputs: two proxies (here of the same tree) beside one real llama-server,
their turns interleaved; and its bootstrap interval on numbers whose answer is known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ab_overhead import median_diff_ci  # noqa: E402


def test_the_interval_holds_the_difference_and_narrows_with_rounds():
    a = [10.0 + (i % 7) * 0.1 for i in range(400)]
    b = [9.0 + (i % 5) * 0.1 for i in range(400)]
    point, lo, hi = median_diff_ci(a, b)
    assert lo <= point <= hi and abs(point - 1.1) < 1e-9  # medians 10.3 and 9.2
    _, lo_few, hi_few = median_diff_ci(a[:20], b[:20])
    assert hi - lo <= hi_few - lo_few


@pytest.mark.llama
@pytest.mark.timeout(300)
def test_two_trees_side_by_side_on_a_real_server(tmp_path):
    out = tmp_path / "ab.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab_overhead.py"), "--tree", f"a={ROOT}",
                          "--tree", f"b={ROOT}", "--rounds", "4", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"direct", "a parsed", "a passthrough", "b parsed", "b passthrough"}
    assert result["rounds"] == 4 and set(result["proxy_cpu_ms_per_round"]) == {"a", "b"}
    assert all(v > 0 for v in result["proxy_cpu_ms_per_round"].values())
    for tree in ("a", "b"):
        r = result["parsed_over_passthrough_net"][tree]
        assert r["ci95"][0] <= r["median"] <= r["ci95"][1]
    assert "b − a" in result["between_trees"]
    assert "parsed over passthrough" in run.stdout
