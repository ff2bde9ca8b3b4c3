"""``benchmarks/bench_trace_log.py`` on tiny inputs: the trace writes of a session that compressed documents are
timed, and the log it stores names their texts rather than holding them (read back in place)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_trace_log import measure  # noqa: E402


def test_a_turn_only_write_stores_the_log_without_the_documents_texts():
    out = measure(documents=3, doc_chars=6000, writes=3)
    assert out["writes"] == 3 and out["cpu_ms_per_write_p50"] > 0
    assert out["texts_read_back"] == 3  # a reader still gets every text
    assert out["log_bytes"] < 3 * 6000  # the log holds no text: each is under a key of its own
    assert out["bytes_stored_per_write_p50"] == out["log_bytes"]  # a write that adds no text writes the log alone
