"""A benchmark stopped with SIGTERM stops the servers it started (the real llama-server, and the proxy it runs as a
process of its own) before it exits, instead of leaving them running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.llama, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``: pid -> command name."""
    out = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            out[int(status.parent.name)] = fields.get("Name", "").strip()
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("bench,args,expect", [
    ("bench_sessions.py", ["--mixes", "fit", "--turns", "1", "--doc-lines", "2", "--max-tokens", "1"],
     {"llama-server"}),
    ("soak.py", ["--minutes", "2", "--sessions", "1", "--concurrency", "1"], {"llama-server", "python"}),
])
def test_a_bench_stopped_with_sigterm_stops_what_it_started(tmp_path, gemma_model, bench, args, expect):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PFLASH_HOME": str(tmp_path / "home")}
    log = open(tmp_path / "bench.log", "wb")
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / bench), *args, "--out", str(tmp_path / "out")],
                            env=env, stdout=log, stderr=log)
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 300  # a loaded machine imports and loads the model slowly
        while not all(any(name.startswith(e) for name in seen.values()) for e in expect):
            assert proc.poll() is None, (tmp_path / "bench.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (seen, (tmp_path / "bench.log").read_text()[-3000:])
            seen.update(children(proc.pid))
            time.sleep(0.5)
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        assert rc == 143, (rc, (tmp_path / "bench.log").read_text()[-3000:])
        left = {pid: name for pid, name in seen.items() if alive(pid)}
        assert not left, f"still running after the bench exited: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
