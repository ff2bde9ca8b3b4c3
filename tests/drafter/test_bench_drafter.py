"""``benchmarks/bench_drafter.py``'s attention row on a tiny input (the real runs are in benchmarks/README.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conftest import HAVE_LLAMA

pytestmark = [pytest.mark.drafter, pytest.mark.skipif(not HAVE_LLAMA, reason="llama_cpp not importable")]


def test_attention_row_times_the_scorer_against_a_plain_forward(gemma) -> None:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_drafter.py"
    spec = importlib.util.spec_from_file_location("bench_drafter", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (row,) = mod.bench_attention(gemma, [700], runs=1)
    assert 600 < row["tokens"] <= 760  # content trimmed to 700 drafter tokens, plus BOS and the question
    assert row["flash_forward_s"][0] > 0 and row["attention_scorer_s"][0] > 0
    assert 0 < row["outside_drafter_passes_s"][0] < row["attention_scorer_s"][0]
    assert row["ratio"] == pytest.approx(row["attention_scorer_s"][0] / row["flash_forward_s"][0])
    # gemma has a shipped head: its cold pass is timed too, through the proxy's own constructor
    assert len(row["head_attention_scorer_s"]) == 1
    assert row["head_attention_ratio"] == pytest.approx(row["head_attention_scorer_s"][0] / row["flash_forward_s"][0])
