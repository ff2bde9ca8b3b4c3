"""One serving proxy per state directory (``cli/home.py``): a second ``serve`` on a directory in use is refused in
one line naming the first, the lock dies with its holder (``kill -9`` included), and ``wrap`` finds the proxy
serving from the directory when it listens on another port than the configured one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pflash_proxy.cli.home import LOCK_NAME, holder
from pflash_proxy.llama.spawn import free_port


def _serve(home: Path, upstream: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", upstream, "--port",
                             str(port), "--home", str(home)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    for line in proc.stdout:
        if "listening on" in line:
            return proc, f"http://127.0.0.1:{port}"
    raise AssertionError(f"serve exited {proc.wait()} before it listened")


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pflash_proxy", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_a_second_proxy_on_a_state_directory_in_use_is_refused_in_one_line(tmp_path):
    home = tmp_path / "home"
    first, url = _serve(home, "http://127.0.0.1:9")
    try:
        assert holder(home) == url
        assert oct((home / LOCK_NAME).stat().st_mode & 0o777) == "0o600"
        port = free_port()
        r = _cli("serve", "--upstream", "http://127.0.0.1:9", "--port", str(port), "--home", str(home))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"another pflash-proxy (pid {first.pid} at {url}) serves from {home}" in r.stderr
        assert "--home or PFLASH_HOME" in r.stderr
        assert first.poll() is None  # the first one serves on
        r = _cli("ls", env={**os.environ, "PFLASH_HOME": str(home)})  # reading the directory takes no lock
        assert r.returncode == 0, r.stderr
    finally:
        first.kill()  # no clean-up runs: the kernel frees the lock
        first.wait()
    assert holder(home) is None
    second, url2 = _serve(home, "http://127.0.0.1:9")
    try:
        assert holder(home) == url2
    finally:
        second.terminate()
        second.wait(timeout=60)


@pytest.mark.llama
def test_wrap_finds_the_proxy_serving_from_its_state_directory_on_another_port(tmp_path, llama_server):
    home = tmp_path / "home"
    proxy, url = _serve(home, llama_server.url)
    out = tmp_path / "seen.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aider").write_text(f"#!/bin/sh\npython3 - \"$@\" <<'EOF'\nimport json, sys\n"
                                   f"json.dump(sys.argv[1:], open({str(out)!r}, 'w'))\nEOF\n")
    (bin_dir / "aider").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PFLASH_HOME": str(home),
           "PFLASH_PORT": str(free_port())}  # the configured port is not the one it serves on
    try:
        r = _cli("wrap", "aider", "--message", "hi", env=env, timeout=180)
        assert r.returncode == 0, r.stderr
        argv = json.loads(out.read_text())
        assert argv[argv.index("--openai-api-base") + 1] == url + "/v1"
        assert "starting a proxy" not in r.stderr
        assert proxy.poll() is None  # not the wrap's to stop
    finally:
        proxy.terminate()
        proxy.wait(timeout=60)


def test_a_file_system_without_locks_serves_unlocked_and_says_so(tmp_path, monkeypatch, caplog):
    import errno

    from pflash_proxy.cli import home as home_module

    def no_locks(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(home_module.fcntl, "flock", no_locks)
    assert home_module.hold(tmp_path, ["http://127.0.0.1:1"]) is None
    assert "serving without the one-proxy-per-directory lock" in caplog.text and "No locks available" in caplog.text
