"""The CLI answers common mistakes with one line and a non-zero exit, never a traceback (issue 14)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "pflash_proxy.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _cli("serve", "--upstream", "http://127.0.0.1:9", "--port", str(port), env={"PFLASH_HOME": str(tmp_path)})
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_warm_with_a_missing_file_is_one_line(tmp_path):
    r = _cli("warm", str(tmp_path / "nope.txt"), "--url", "http://127.0.0.1:9", env={"PFLASH_HOME": str(tmp_path)})
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_unknown_pflash_variables_are_warned_about_once_with_a_suggestion(tmp_path):
    r = _cli("ls", env={"PFLASH_HOME": str(tmp_path), "PFLASH_THRESHHOLD": "5", "PFLASH_UPSTREAM": "http://x:1"})
    assert r.stderr.count("PFLASH_THRESHHOLD") == 1
    assert "did you mean PFLASH_THRESHOLD?" in r.stderr
