"""One serving proxy per state directory and per slot folder (``cli/home.py``): a second ``serve`` on a directory in
use is refused in one line naming the first, the lock dies with its holder (``kill -9`` included), and ``wrap``
finds the proxy serving from the directory when it listens on another port than the configured one.  Trusting
nothing else: a home another user owns or others can write into, a ``serve.lock`` that is a link, a FIFO, a
directory, a device or another user's file are refused in one line, and ``wrap`` uses the URL a lock file names
only when that URL proves it is the proxy holding the lock (tests that need another uid run only as root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pflash_proxy.cli.home import LOCK_NAME, holder
from pflash_proxy.llama.spawn import free_port


def _serve(home: Path, upstream: str, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", upstream, "--port",
                             str(port), "--home", str(home), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
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
        assert holder(home) is not None and holder(home)[0] == url
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
        assert holder(home) is not None and holder(home)[0] == url2
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


# A state directory and a lock file that are not to be trusted ------------------------------------------------
ROOT = os.geteuid() == 0
NOBODY = 65534


def _serve_once(home: Path, *extra: str, wait_s: float = 20) -> tuple[int | None, str]:
    """``serve`` on ``home`` (in front of nothing): its exit status and stderr, or None when it was still serving
    after ``wait_s`` (then stopped)."""
    proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", "http://127.0.0.1:9",
                             "--port", str(free_port()), "--home", str(home), *extra], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=wait_s)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return None, err


def _refused(rc: int | None, err: str, *needles: str) -> None:
    assert rc is not None, f"served instead of refusing:\n{err}"
    assert rc == 1 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700, parents=True)
    return home


def test_a_serve_lock_planted_as_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    home = _home(tmp_path)
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    precious.chmod(0o600)
    (home / LOCK_NAME).symlink_to(precious)
    _refused(*_serve_once(home), str(home / LOCK_NAME), "symbolic link")
    assert precious.read_text() == "keep me\n"


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-full", "hard-link"])
def test_a_serve_lock_that_is_not_a_regular_file_of_ours_is_refused_in_one_line(tmp_path, kind):
    """Each let two proxies share a home (the lock was skipped with a warning), or crashed ``serve``."""
    home = _home(tmp_path)
    lock = home / LOCK_NAME
    if kind == "fifo":
        os.mkfifo(lock)
        why = "not a regular file"
    elif kind == "directory":
        lock.mkdir()
        why = "is a directory"
    elif kind == "dev-full":
        lock.symlink_to("/dev/full")
        why = "symbolic link"
    else:
        other = tmp_path / "other"
        other.write_text("mine\n")
        os.link(other, lock)
        why = "hard links"
    first = _serve_once(home, wait_s=15)
    _refused(*first, str(lock), why)
    _refused(*_serve_once(home, wait_s=15), why)  # a second one too: never two proxies on one home


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o703])
def test_a_home_others_can_write_into_is_refused_by_serve_and_wrap(tmp_path, mode):
    home = _home(tmp_path)
    home.chmod(mode)
    _refused(*_serve_once(home), str(home), "writable by others", "chmod 700")
    assert home.stat().st_mode & 0o777 == mode  # refused, not repaired: what it holds may be someone else's
    assert not (home / LOCK_NAME).exists()
    env = {**os.environ, "PFLASH_HOME": str(home), "PFLASH_PORT": str(free_port())}
    r = _cli("wrap", "--upstream", "http://127.0.0.1:9", "aider", env=env)
    _refused(r.returncode, r.stderr.replace("pflash-proxy wrap: ", ""), "writable by others")


@pytest.mark.skipif(not ROOT, reason="needs another uid: runs as root only (the mode-bit checks run for everyone)")
def test_a_home_or_lock_file_of_another_user_is_refused(tmp_path):
    """What the hostile round saw: user nobody's home holding a ``serve.lock`` link to a root-owned 0600 file,
    which ``serve`` as root overwrote."""
    home = _home(tmp_path)
    precious = tmp_path / "root-only"
    precious.write_text("root's\n")
    precious.chmod(0o600)
    os.chown(home, NOBODY, NOBODY)
    os.symlink(precious, home / LOCK_NAME)
    os.lchown(home / LOCK_NAME, NOBODY, NOBODY)
    _refused(*_serve_once(home), str(home), f"belongs to uid {NOBODY}")
    assert precious.read_text() == "root's\n"
    assert holder(home) is None  # nor does wrap read it
    # a home of ours holding another user's lock file (a regular one)
    home2 = _home(tmp_path / "2")
    (home2 / LOCK_NAME).write_text("")
    os.chown(home2 / LOCK_NAME, NOBODY, NOBODY)
    _refused(*_serve_once(home2), str(home2 / LOCK_NAME), f"belongs to uid {NOBODY}")
    # a home reached through another user's symbolic link
    link = tmp_path / "link"
    link.symlink_to(home2)
    os.lchown(link, NOBODY, NOBODY)
    _refused(*_serve_once(link), "symbolic link owned by uid")


class LookAlike:
    """Another HTTP server that answers like a pflash-proxy would (metrics, health, models), recording every
    request: what a lock file naming the wrong URL would hand the agent to."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                seen.append(self.path)
                body = {"/pflash/metrics": b"pflash_requests_total 1\n", "/health": b'{"status":"ok"}',
                        "/v1/models": b'{"data":[{"id":"look-alike"}]}'}.get(self.path.split("?")[0], b"{}")
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_wrap_does_not_use_a_lock_files_url_that_does_not_prove_it_holds_the_lock(tmp_path):
    """A live lock (held by another process of ours) whose file names a look-alike: the agent is not started
    against it; the proxy really serving from the home (next test) is used."""
    import fcntl

    home = _home(tmp_path)
    fake = LookAlike()
    out = tmp_path / "ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aider").write_text(f"#!/bin/sh\necho \"$@\" > {out}\n")
    (bin_dir / "aider").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PFLASH_HOME": str(home),
           "PFLASH_PORT": str(free_port())}
    try:
        for line in (f"{os.getpid()} {fake.url}\n", f"{os.getpid()} {fake.url} nonce=0123456789abcdef\n"):
            with open(home / LOCK_NAME, "w") as f:
                f.write(line)
                f.flush()
                fcntl.flock(f, fcntl.LOCK_EX)
                r = _cli("wrap", "aider", "--message", "hi", env=env)
            assert r.returncode == 1 and "no proxy at" in r.stderr, r.stderr
            assert not out.exists(), "the agent ran against the look-alike"
            assert not [p for p in fake.seen if p.startswith("/v1")], fake.seen
        assert f"not using {fake.url}" in r.stderr  # the one with a nonce was checked, and said so
    finally:
        fake.close()


def test_the_proxy_serving_from_a_home_proves_it_holds_its_lock(tmp_path):
    from pflash_proxy.cli.wrap import answers_as_holder

    home = tmp_path / "home"
    proc, url = _serve(home, "http://127.0.0.1:9")
    try:
        found = holder(home)
        assert found is not None and found[0] == url
        assert answers_as_holder(url, found[1])
        assert not answers_as_holder(url, "0" * 32)  # another nonce: another proxy's lock
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# One slot folder, one proxy ----------------------------------------------------------------------------------
def test_a_second_proxy_on_the_same_slot_folder_is_refused_in_one_line_naming_the_first(tmp_path):
    """Different homes, one --slot-save-path: each reconciled the folder at start-up and deleted the other's
    snapshots (its index does not name them)."""
    slots = tmp_path / "slots"
    slots.mkdir()
    proc, url = _serve(tmp_path / "home1", "http://127.0.0.1:9", "--slot-save-path", str(slots))
    try:
        rc, err = _serve_once(tmp_path / "home2", "--slot-save-path", str(slots))
        _refused(rc, err, f"pid {proc.pid} at {url}", str(slots), "--slot-save-path")
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    rc, err = _serve_once(tmp_path / "home2", "--slot-save-path", str(slots), wait_s=8)
    assert rc is None, err  # the folder is free again: the second one serves


def test_nodes_of_a_shared_index_share_a_slot_folder_and_exclude_a_proxy_with_its_own(tmp_path):
    from pflash_proxy.cli.home import HomeTaken, SLOTS_LOCK_NAME, hold_slots

    a = hold_slots(tmp_path, ["http://a"], tmp_path / "ha", shared=True)
    b = hold_slots(tmp_path, ["http://b"], tmp_path / "hb", shared=True)
    assert a is not None and b is not None
    with pytest.raises(HomeTaken, match="slot folder of its own"):
        hold_slots(tmp_path, ["http://c"], tmp_path / "hc", shared=False)
    a.close()
    b.close()
    own = hold_slots(tmp_path, ["http://c"], tmp_path / "hc", shared=False)
    assert own is not None and f"{os.getpid()} http://c home={tmp_path / 'hc'}" in (tmp_path / SLOTS_LOCK_NAME).read_text()
    with pytest.raises(HomeTaken, match=f"pid {os.getpid()} at http://c"):
        hold_slots(tmp_path, ["http://a"], tmp_path / "ha", shared=True)
    own.close()


@pytest.mark.parametrize("command", [["ls"], ["rm", "--all"]])
def test_ls_and_rm_read_nothing_from_a_home_others_can_write_into(tmp_path, command):
    """An index in a directory others can write into could name files for ``rm`` to delete or show planted
    sessions: ``ls``/``rm`` refuse it in one line, as ``serve`` does, and touch nothing in it."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o777)
    r = _cli(*command, env={**os.environ, "PFLASH_HOME": str(home)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"pflash-proxy {command[0]}: the state directory {home} is writable by others" in r.stderr
    assert list(home.iterdir()) == []  # no index opened (created) in it
    home.chmod(0o700)
    r = _cli(*command, env={**os.environ, "PFLASH_HOME": str(home)})
    assert r.returncode == 0, r.stderr
