"""``benchmarks/bench_session_turns.py`` on tiny inputs: every turn's lookup finds the session from a history
parsed anew, and the report gives the medians and the stored sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_tiny_session_is_looked_up_and_saved_every_turn():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_session_turns.py"), "--sources", "1",
                          "--doc-lines", "40", "--messages", "6", "--message-chars", "400", "--turns", "3"],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert report["turns"] == 3 and report["messages"] == 6
    assert report["lookup_ms_p50"] > 0 and report["save_ms_p50"] > 0
    assert 0 < report["record_bytes"] < report["stored_bytes"]
