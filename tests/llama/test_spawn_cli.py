"""``pflash-proxy serve --spawn`` as a user runs it: a real process, a real llama-server, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pflash_proxy.llama.spawn import LOG_ROTATE_BYTES, free_port, rotate_log

pytestmark = pytest.mark.llama


def http(method: str, url: str, payload=None, timeout=60):
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")


def start_proxy(home: Path, model: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PFLASH_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pflash_proxy", "serve", "--spawn", "--model", str(model), "--port", str(port),
         "--parallel", "1", "--ctx-size", "4096", "--spawn-threads", "2", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError("proxy exited during start-up")
        if "listening on" in line:
            assert url in line
            return proc, url
    raise RuntimeError("proxy did not announce its URL")


def state(pid: int) -> str | None:
    """The process's state letter (``/proc/<pid>/stat``), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def running(pid: int) -> bool:
    """Still running: present and not a zombie (an orphan that exited waits for init to reap it, and
    ``kill(pid, 0)`` still finds it meanwhile)."""
    return state(pid) not in (None, "Z", "X")


def llama_pid(home: Path) -> int:
    out = subprocess.run(["pgrep", "-f", f"slot-save-path {home}/slots"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, out.stdout
    return pids[0]


def test_spawn_serves_restarts_and_snapshots_on_sigterm(tmp_path, gemma_model):
    home = tmp_path / "home"
    home.mkdir()
    (home / "llama-server.log").write_bytes(b"an old run\n" * (LOG_ROTATE_BYTES // 11 + 1))  # past the limit
    proc, url = start_proxy(home, gemma_model)
    # the launch moved the oversized log aside and began a fresh one
    assert (home / "llama-server.log.1").read_bytes().startswith(b"an old run\n")
    assert b"an old run" not in (home / "llama-server.log").read_bytes()[:4096]
    try:
        status, headers, body = http("POST", url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0})
        assert status == 200 and body["choices"][0]["message"]["content"] is not None
        session = headers["X-PFlash-Session"]
        assert http("GET", url + "/health")[0] == 200

        # The spawned server dies: the proxy answers 503 (OpenAI-shaped) until it is back.
        os.kill(llama_pid(home), signal.SIGKILL)
        saw_503 = False
        deadline = time.time() + 90
        while time.time() < deadline:
            status, _, body = http("GET", url + "/health", timeout=5)
            if status == 503:
                saw_503 = True
                assert body["error"]["type"] == "unavailable_error"
            elif status == 200 and saw_503:
                break
            time.sleep(0.1)
        assert saw_503 and status == 200
        # Served again after the restart (history is re-read: the server lost it).
        status, headers, _ = http("POST", url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0})
        assert status == 200 and headers["X-PFlash-Session"] == session
        pid = llama_pid(home)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    # SIGTERM saved the resident session and stopped the spawned llama-server.
    snaps = list((home / "slots").glob("pf-*.bin"))
    assert len(snaps) == 1 and oct(snaps[0].stat().st_mode & 0o777) == "0o600"
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    ls = subprocess.run([sys.executable, "-m", "pflash_proxy", "ls"], env={**os.environ, "PFLASH_HOME": str(home)},
                        capture_output=True, text=True)
    assert session in ls.stdout and "1 snapshots" in ls.stdout


def test_spawned_llama_server_dies_with_a_killed_proxy(tmp_path, gemma_model):
    """kill -9 (or the OOM killer) runs none of the proxy's clean-up: the kernel must end llama-server."""
    home = tmp_path / "home"
    home.mkdir()
    proc, url = start_proxy(home, gemma_model)
    pid = llama_pid(home)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.time() + 20
    while time.time() < deadline:
        if not running(pid):
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the spawned llama-server outlived its proxy: {state(pid)}")


PARENT = """
import signal, subprocess, sys, time
from pflash_proxy.llama.spawn import LLAMA_DEATH_SIGNAL, die_with_parent
# the child ignores SIGTERM: a llama-server that gets it twice can hang in its exit instead of ending
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"],
                         stdout=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=die_with_parent(LLAMA_DEATH_SIGNAL))
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_child_that_ignores_sigterm_still_dies_with_its_parent():
    """The kernel's signal on the proxy's death must be one that no handler can turn into a hang."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    parent.kill()
    parent.communicate(timeout=30)
    deadline = time.time() + 10
    while running(pid) and time.time() < deadline:
        time.sleep(0.05)
    if running(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the child outlived its parent: {state(pid)}")


def test_invalid_configuration_is_one_clear_line(tmp_path):
    env = {**os.environ, "PFLASH_HOME": str(tmp_path), "PFLASH_PORT": "eighty"}
    out = subprocess.run([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", "http://127.0.0.1:1"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "port" in lines[0] and "PFLASH_PORT" in lines[0]


def test_rotate_log_keeps_one_old_log(tmp_path):
    log = tmp_path / "llama-server.log"
    assert rotate_log(log, limit=10) is False  # no log yet
    log.write_bytes(b"x" * 10)
    assert rotate_log(log, limit=10) is False and log.exists()  # at the limit: kept
    log.write_bytes(b"first" * 3)
    assert rotate_log(log, limit=10) is True and not log.exists()
    log.write_bytes(b"second" * 3)
    assert rotate_log(log, limit=10) is True
    assert (tmp_path / "llama-server.log.1").read_bytes() == b"second" * 3  # only the newest old log is kept
