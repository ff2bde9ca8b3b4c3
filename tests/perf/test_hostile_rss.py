"""``tests/perf/hostile_rss.py`` on tiny inputs: a real proxy in front of a real llama-server takes hostile
requests of every dialect without a 5xx, and the report gives its resident memory before, at the peak and after."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.llama, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_hostile_requests_are_answered_and_the_rss_is_reported():
    out = subprocess.run([sys.executable, "-m", "tests.perf.hostile_rss", "--requests", "6",
                          "--size-kb", "16", "--concurrency", "2"],
                         capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["requests"] == 6
    assert sum(report["answers"].values()) == 6
    assert {k.split()[0] for k in report["answers"]} == {"chat", "messages", "responses"}
    assert all(k.split()[1].isdigit() and int(k.split()[1]) < 500 for k in report["answers"])
    rss = report["rss_mb"]
    assert 0 < rss["start"] <= rss["peak"] and rss["end"] > 0


def test_the_hostile_bodies_are_distinct_and_of_the_size_asked():
    from tests.perf.hostile_rss import body

    bodies = [json.dumps(body(i, 40_000)[1]) for i in range(6)]
    assert len(set(bodies)) == 6
    assert all(35_000 < len(b) < 80_000 for b in bodies)
    assert [body(i, 1000)[0] for i in range(3)] == ["/v1/chat/completions", "/v1/messages", "/v1/responses"]
