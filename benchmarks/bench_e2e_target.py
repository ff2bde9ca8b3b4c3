"""First-token time with the drafter in front of a bigger target: full prefill vs PFlash lexical vs PFlash
head-attention, side by side in one run.

The target is a random-weight GGUF of a real gemma-3 shape (``synthetic_target.py``): its prefill time per
token is the real one for that shape, its answers are noise, so only time is measured here, never quality.
The drafter is the real gemma-3-270m GGUF with its shipped scoring head and retrieval heads.

1. Write the synthetic target (or reuse ``--target-gguf`` when it exists), start llama-server on it the way
   ``--spawn`` does (``LlamaProc``: safe flags, ``--swa-full``, ``-t --target-threads``), and build the scorers
   with the bench's own ``build_scorers`` (the drafter runs in-process, ``n_threads`` = ``--drafter-threads``).
2. Three in-process proxies on that one llama-server: ``full`` (PFlash off), ``lexical`` and ``head-attention``.
   One short request first, direct, so the target's weights are paged in before anything is timed.
3. Per length, one case (``--family``, sized in the target's own tokens, capped at one slot), sent once through
   each proxy, salted at the start so no run reuses another's prefix cache; the arm order rotates per length.
   After each run the proxy snapshots its sessions (``/pflash/save``, untimed) so no later run pays for it.
4. Per run: the client's time to the first streamed content chunk (TTFT), the target's prefill of the tokens
   it was sent (llama-server's ``timings.prompt_ms``/``prompt_n``), the drafter pass (the scorer's
   ``represent`` + ``score`` ms) and the whole compression (``pflash_ms``); the rest of TTFT is token counting
   (``/tokenize``), the proxy and the first decoded token.
5. After every run the report (``e2e.json``, ``e2e.md``) is written again, so a run cut short keeps what it
   measured (``--render E2E.JSON`` writes it again from the JSON).  The "why" table gives the costs per token:
   the target's prefill at the full length and the drafter's pass, and the speed-up they give if prefill cost
   were linear in length (the kept tokens' real prefill is cheaper per token: attention grows with length).

Threads: the drafter and the target never run at the same time (the proxy waits for the drafter's scores
before it forwards), so each gets the same cores one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from pflash_proxy.bench.quality import build_scorers
from pflash_proxy.bench.report import Table, write_report
from pflash_proxy.bench.runner import (
    LlamaProc,
    Proxy,
    bench_settings,
    chat,
    new_id,
    salted,
)
from pflash_proxy.bench.sizing import ROOM, sized_case, tokenize_counter

ARMS = ("full", "lexical", "head-attention")
HERE = Path(__file__).resolve().parent


def _synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_target", HERE / "synthetic_target.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _ints(text: str) -> list[int]:
    return [int(x.lower().rstrip("k")) * (1024 if x.lower().endswith("k") else 1) for x in text.split(",") if x]


async def _run_one(http, proxy: Proxy, arm: str, case, n: int) -> dict[str, Any]:
    key = new_id()
    t0 = time.perf_counter()
    res = await chat(http, proxy.url, salted(case.messages, new_id()), bench_id=key, max_tokens=2)
    wall = time.perf_counter() - t0
    async with http.post(proxy.url + "/pflash/save") as r:
        await r.read()
    fields = proxy.seen(key).fields if key in proxy.recorder.seen else {}
    t = res.timings or {}
    drafter = None
    if fields.get("scorer") not in (None, "lexical", "LexicalScorer") and "ms_represent" in fields:
        drafter = (fields.get("ms_represent", 0) + fields.get("ms_score", 0)) / 1000
    return {"length": n, "arm": arm, "case_id": case.case_id, "case_tokens": case.meta["real_tokens"],
            "status": res.status, "ttft_s": res.ttft_s, "wall_s": wall,
            "mode": _mode(arm, fields), "scorer": fields.get("scorer"),
            "prompt_tokens": res.prompt_n, "target_prefill_tokens": t.get("prompt_n"), "cache_n": t.get("cache_n"),
            "target_prefill_s": (t["prompt_ms"] / 1000) if t.get("prompt_ms") else None,
            "drafter_s": drafter, "compression_s": (fields["pflash_ms"] / 1000) if "pflash_ms" in fields else None,
            "stage_ms": {k: v for k, v in fields.items() if k.startswith("ms_")}, "reply": res.text[:40]}


def _mode(arm: str, fields: dict[str, Any]) -> str:
    """From the stage's log fields (a streamed answer that waited gets its X-PFlash-Mode header only as a
    last SSE comment)."""
    if arm == "full":
        return "off"
    if "tokens_kept" in fields:
        return "compressed"
    return f"served whole ({fields['pflash_reason']})" if fields.get("pflash_reason") else "served whole"


def tables(data: dict[str, Any]) -> list[Table]:
    rows, why = [], []
    for n in data["lengths"]:
        runs = {r["arm"]: r for r in data["runs"] if r["length"] == n}
        full = runs.get("full")
        for arm in ARMS:
            r = runs.get(arm)
            if r is None:
                continue
            other = None
            if r["ttft_s"] is not None:
                other = r["ttft_s"] - (r["target_prefill_s"] or 0) - (r["compression_s"] or 0)
            speed = full["ttft_s"] / r["ttft_s"] if full and full["ttft_s"] and r["ttft_s"] and arm != "full" else None
            rows.append([f"{n // 1024}K", arm, r["mode"], r["prompt_tokens"], r["target_prefill_tokens"],
                         r["drafter_s"], r["compression_s"], r["target_prefill_s"], other, r["ttft_s"], speed])
        ha = runs.get("head-attention")
        if full and ha and full.get("target_prefill_s") and ha.get("drafter_s") and full.get("target_prefill_tokens"):
            nf = full["target_prefill_tokens"]
            tgt_ms = 1000 * full["target_prefill_s"] / nf
            dr_ms = 1000 * ha["drafter_s"] / (ha["case_tokens"] or nf)
            kept = (ha["target_prefill_tokens"] or nf) / nf
            why.append([f"{n // 1024}K", nf, tgt_ms, dr_ms, tgt_ms / dr_ms, kept,
                        1 / (kept + dr_ms / tgt_ms)])
    out = [Table("First-token time, one case per length, the same target (synthetic: answers are noise, only "
                 "time is real)",
                 ["length", "arm", "mode", "prompt tokens", "target prefilled tokens", "drafter pass s",
                  "whole compression s", "target prefill s", "rest s", "TTFT s", "speed-up vs full"], rows)]
    if why:
        out.append(Table("Why: cost per token (target prefill at the full length vs the drafter's pass)",
                         ["length", "tokens", "target ms/token", "drafter ms/token", "target/drafter",
                          "kept fraction (head-attention)",
                          "speed-up if prefill were linear: 1 / (kept + drafter/target)"], why))
    return out


def _load(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f}"


def report(data: dict[str, Any], out_dir: Path):
    notes = [f"command: `{data['command']}`",
             (f"target: synthetic {data['shape']} {data['quant']} (random weights, gemma-3 hyper-parameters, "
              f"{data['target_gb']:.2f} GB): its answers are noise, only its speed is real; quality is not "
              "measured"),
             f"drafter: {data['drafter']} (gemma-3-270m Q4_K_M), scorer head-attention with its shipped head",
             (f"threads: target llama-server `-t {data['target_threads']}`, drafter n_threads "
              f"{data['drafter_threads']}; they run one after the other (the proxy waits for the scores before "
              f"it forwards); machine: {data['cpus']} CPU cores shared with other sessions' jobs, load average "
              f"{_load(data.get('load_start'))} at the start"
              + (f" and {_load(data['load_end'])} at the end" if data.get("load_end") is not None else "")),
             (f"case family {data['family']}, one case per length, sized in the target's tokens; threshold "
              f"{data['threshold']}; arm order rotates per length; every run salted (cache_n shows no reuse)"),
             ("TTFT = client time to the first streamed content chunk; target prefill = llama-server's "
              "timings.prompt_ms; drafter pass = represent + score; rest = TTFT - target prefill - whole "
              "compression (token counting via /tokenize, proxy, first decoded token)"),
             (f"run took {data['seconds']} s" if "seconds" in data else
              "the run was stopped before it ended: lengths without rows were not measured")]
    return write_report(out_dir, "e2e", "PFlash end to end: gemma-3-270m drafter in front of a synthetic "
                        f"{data['shape']} target", data, tables(data), notes)


async def run(opts, data: dict[str, Any]) -> None:
    st = _synthetic()
    target = Path(opts.target_gguf) if opts.target_gguf else Path(opts.workdir) / f"{opts.shape}-{opts.quant}.gguf"
    if not target.exists():
        t0 = time.perf_counter()
        st.write_target(target, opts.shape, opts.quant, template_from=opts.drafter)
        data["target_write_s"] = round(time.perf_counter() - t0, 1)
    data["target_gb"] = target.stat().st_size / 1e9
    sopts = SimpleNamespace(drafter=opts.drafter, lengths=opts.lengths, drafter_timeout=3600.0,
                            scoring_head=None, request_probe=None)
    scorers = build_scorers(["head-attention"], sopts)
    if isinstance(scorers["head-attention"], str):
        raise SystemExit(f"head-attention: {scorers['head-attention']}")
    drafter = scorers["head-attention"]
    from pflash_proxy.drafter.runtime import Drafter

    # build_scorers makes the bench's Drafter with its default thread count
    data["drafter_threads"] = inspect.signature(Drafter).parameters["n_threads"].default
    work = Path(opts.workdir)
    llama = LlamaProc(work / "llama", None, target, ctx_per_slot=max(opts.lengths) + 2048,
                      threads=opts.target_threads)
    await llama.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=7200)) as http:
            common = {"threshold": opts.threshold, "upstream_timeout_s": 7200}
            settings = {arm: bench_settings(llama.url, work / arm, llama.slot_dir, pflash=arm != "full", **common)
                        for arm in ARMS}
            async with Proxy(settings["full"]) as full, Proxy(settings["lexical"]) as lex, \
                    Proxy(settings["head-attention"], scorer=drafter) as ha:
                proxies = {"full": full, "lexical": lex, "head-attention": ha}
                t0 = time.perf_counter()
                warm = await chat(http, llama.url, [{"role": "user", "content": "Warm up."}], max_tokens=1)
                data["warmup_s"] = round(time.perf_counter() - t0, 1)
                data["warmup_status"] = warm.status
                cap = await llama.slot_ctx() - ROOM
                count = tokenize_counter(http, llama.url)
                for li, n in enumerate(opts.lengths):
                    case = await sized_case(count, opts.family, n, 0, opts.seed, cap)
                    order = ARMS[li % 3:] + ARMS[:li % 3]
                    for arm in order:
                        print(f"{time.strftime('%H:%M:%S')} {n} {arm} ...", file=sys.stderr, flush=True)
                        row = await _run_one(http, proxies[arm], arm, case, n)
                        brief = ("mode", "ttft_s", "target_prefill_tokens", "target_prefill_s", "drafter_s")
                        print(f"  {json.dumps({k: row[k] for k in brief})}", file=sys.stderr, flush=True)
                        data["runs"].append(row)
                        report(data, opts.out)
    finally:
        await llama.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="gemma3-4b")
    p.add_argument("--quant", default="Q4_0")
    p.add_argument("--target-gguf", help="use (or write once) the synthetic target here")
    p.add_argument("--drafter", type=Path, help="drafter GGUF (default: the shipped gemma-3-270m)")
    p.add_argument("--lengths", type=_ints, default=[8192, 16384])
    p.add_argument("--family", default="multiturn")
    p.add_argument("--threshold", type=int, help="PFlash admission threshold (default: shortest length / 2)")
    p.add_argument("--target-threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/e2e"))
    p.add_argument("--render", type=Path, metavar="E2E.JSON",
                   help="write an earlier run's report again with this version's tables (nothing is measured)")
    opts = p.parse_args(argv)
    if opts.render:
        print(report(json.loads(opts.render.read_text()), opts.render.parent).markdown)
        return 0
    opts.drafter = opts.drafter or _synthetic().default_template()
    opts.threshold = opts.threshold or min(opts.lengths) // 2
    opts.workdir = tempfile.mkdtemp(prefix="pflash-e2e-")
    data: dict[str, Any] = {"bench": "e2e", "shape": opts.shape, "quant": opts.quant, "lengths": opts.lengths,
                            "family": opts.family, "threshold": opts.threshold, "drafter": opts.drafter.name,
                            "target_threads": opts.target_threads,
                            "cpus": os.cpu_count(), "load_start": os.getloadavg()[0], "runs": [],
                            "command": "python benchmarks/bench_e2e_target.py " + shlex.join(argv or sys.argv[1:])}
    t0 = time.perf_counter()
    try:
        asyncio.run(run(opts, data))
    finally:
        data["seconds"] = round(time.perf_counter() - t0, 1)
        data["load_end"] = os.getloadavg()[0]
        if data["runs"]:
            print(report(data, opts.out).markdown)
        shutil.rmtree(opts.workdir, ignore_errors=True)  # slot snapshots (and the target unless --target-gguf)
    return 0


if __name__ == "__main__":
    sys.exit(main())
