"""The CLI answers common mistakes with one line and a non-zero exit, never a traceback (issue 14)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time


def _cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "pflash_proxy.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_a_port_in_use_is_one_line_within_seconds_every_time(tmp_path):
    """The port is bound before anything starts (it used to hang in aiohttp's start-up clean-up, 5 of 13 tries)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        for _ in range(5):
            t0 = time.monotonic()
            r = _cli("serve", "--upstream", "http://127.0.0.1:9", "--port", str(port),
                     env={"PFLASH_HOME": str(tmp_path)}, timeout=15)
            assert r.returncode == 1 and time.monotonic() - t0 < 10
            assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_warm_with_a_missing_file_is_one_line(tmp_path):
    r = _cli("warm", str(tmp_path / "nope.txt"), "--url", "http://127.0.0.1:9", env={"PFLASH_HOME": str(tmp_path)})
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_unknown_pflash_variables_are_warned_about_once_with_a_suggestion(tmp_path):
    r = _cli("ls", env={"PFLASH_HOME": str(tmp_path), "PFLASH_THRESHHOLD": "5", "PFLASH_UPSTREAM": "http://x:1"})
    assert r.stderr.count("PFLASH_THRESHHOLD") == 1
    assert "did you mean PFLASH_THRESHOLD?" in r.stderr
