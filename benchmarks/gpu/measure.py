"""The GPU measurement behind PFlash's headline, run by ``benchmarks/gpu/run.sh`` after it built llama.cpp.

A drafter in front of a bigger target: the seed pairs a ~0.8B drafter with a 27B target.  Weights cannot be
downloaded on the GPU machine, so both are random-weight GGUFs of real gemma-3 shapes
(``benchmarks/gpu/synthetic_target.py``, tokenizer copied from the shipped gemma-3-270m so the two tokenize alike):
their answers are noise, their speed per token is that shape's real speed.  gemma-3 stands in for the seed's
Qwen pair because drafter and target must share a tokenizer and gemma-3's is the one the project ships.

1. Plan (``PLANS[mode]``): the shapes, the lengths, the proxy turn's length, and a seconds estimate per step.
   Steps run most important first and each is time-boxed against the deadline (``--budget`` seconds from the
   start): a step whose estimate (scaled from what this run already measured) does not fit what is left is
   recorded as skipped with the reason, never started.  The report is rewritten after every step, so a run cut
   short still leaves everything it measured.
2. GGUFs (``gen``): the target (gemma3-27b Q4_0, ~15 GB) and the drafters (gemma3-1b, the seed-sized one, and
   gemma3-270m, the shipped drafter's shape; Q4_K, i.e. Q5_0 for their 640/1152-wide rows as llama-quantize
   does), skipped when a file is already there (``run.sh`` writes them in the background during the build).
3. llama-server on the target, started as the proxy spawns it (``spawn.server_args``: one slot, the safe flags,
   ``--swa-full`` for gemma-3) plus ``-ngl 999 -fa on``; one short warm-up request.
4. Per length (16K, 32K, 64K, 128K = 130,048 tokens so it fits the 131,072-token context), in this order:
   the target's full prefill (``/completion``, ``cache_prompt`` off, one token generated; ``timings.prompt_ms``);
   its prefill of the kept tokens (the proxy's default prefill curve ``budget(n)`` at that length); the
   drafter's cold ``head-attention`` pass over the same text through the project's code (``Drafter`` +
   ``AttentionScorer`` + ``HeadAttentionScorer``, as ``stages.scorers.drafter_scorer`` builds it; the drafter at
   the proxy's defaults: 32K context windows, batch 512, 2 threads; every layer on the GPU).  The scorer head
   is a random one of the drafter's width (``probe_writer``): the shipped head is bound to the real
   gemma-3-270m file, and its cost depends only on the shape.  The attention heads: the shipped calibration
   for the 270m shape, the same number of heads on the global layers for other shapes.
5. One compressed turn through the real proxy (``bench.runner.Proxy``, in process, with that scorer) vs the
   same chat sent to llama-server directly: first-token time of each, the served prompt size, the proxy's
   ``pflash_ms`` and drafter milliseconds.
6. Extras while time is left: the 270m drafter's pass at every length.
7. Report: ``gpu-report.json`` (every number, the plan, what was skipped and why) and ``gpu-report.md``.

``--mode cpu-tiny`` runs the same steps with CUDA off and tiny shapes (a 2-layer target, a 6-layer drafter,
1K/2K tokens) to test the script end to end; its numbers say nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]  # run.sh puts the checkout on PYTHONPATH; this folder is the script's

QUESTION = "Which ledger entry names the copper vault and the harbor clerk?"
RESERVE_S = 20.0  # kept for the report and stopping llama-server

# mode -> plan. est_s: seconds a step is expected to take on that machine (the budget plan; README.md).
PLANS: dict[str, dict[str, Any]] = {
    "gpu": {
        "target": {"shape": "gemma3-27b", "quant": "Q4_0"},
        "drafters": [{"shape": "gemma3-1b", "quant": "Q4_K"}, {"shape": "gemma3-270m", "quant": "Q4_K"}],
        "lengths": [16384, 32768, 65536, 130048],
        "proxy_tokens": 32768,
        "ctx": 131072,
        "drafter_ctx": 32768,
        "gpu_layers": 999,
        "server_args": ["-ngl", "999", "-fa", "on"],
        "threshold": 16384,
        "est_s": {"gen": 60, "server": 40, "prefill_per_16k": 4.0, "drafter_per_16k": 3.0, "proxy": 40},
    },
    "cpu-tiny": {
        "target": {"shape": "tiny", "quant": "Q4_0"},
        "drafters": [{"shape": "tiny", "quant": "Q4_K", "layers": 6}, {"shape": "tiny", "quant": "Q8_0", "layers": 6}],
        "lengths": [1024, 2048],
        "proxy_tokens": 2048,
        "ctx": 4096,
        "drafter_ctx": 1536,  # < the longest length: the windowed path of a 128K pass on the GPU runs here too
        "gpu_layers": 0,
        "server_args": [],
        "threshold": 1024,
        "est_s": {"gen": 20, "server": 20, "prefill_per_16k": 20.0, "drafter_per_16k": 40.0, "proxy": 30},
    },
}


def model_name(spec: dict[str, Any]) -> str:
    layers = f"-L{spec['layers']}" if spec.get("layers") else ""
    return f"{spec['shape']}{layers}-{spec['quant']}.gguf"


def dkey(spec: dict[str, Any]) -> str:
    """A drafter's name in the report: its GGUF's file name without the suffix."""
    return model_name(spec).removesuffix(".gguf")


def kept_tokens(n: int) -> int:
    """The proxy's default prefill curve: tokens the target prefills after compression of an n-token prompt."""
    from pflash_proxy.compress.budget import DEFAULT_CURVE, BudgetCurve

    return BudgetCurve.parse(DEFAULT_CURVE).budget(n)


# ------------------------------------------------------------------------------------------------ report


class Report:
    """Everything measured so far; ``save`` rewrites the JSON and the markdown after every step."""

    def __init__(self, out: Path, mode: str, plan: dict[str, Any], budget: float):
        self.out, self.mode, self.plan = out, mode, plan
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget
        self.data: dict[str, Any] = {"mode": mode, "plan": plan, "budget_s": budget, "env": {}, "steps": [],
                                     "rows": {}, "drafters": {}, "proxy_turn": None, "skipped": []}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    def fits(self, name: str, est_s: float) -> bool:
        if est_s * 1.2 <= self.left():
            return True
        self.data["skipped"].append({"step": name, "estimate_s": round(est_s, 1), "left_s": round(self.left(), 1)})
        print(f"measure: skip {name}: needs ~{est_s:.0f} s, {self.left():.0f} s left", flush=True)
        self.save()
        return False

    def step(self, name: str, seconds: float, ok: bool = True, **extra: Any) -> None:
        self.data["steps"].append({"step": name, "ok": ok, "s": round(seconds, 2),
                                   "at_s": round(time.monotonic() - self.t0, 1), **extra})
        print(f"measure: {name}: {'ok' if ok else 'FAILED'} in {seconds:.1f} s {extra or ''}", flush=True)
        self.save()

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "gpu-report.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "gpu-report.md").write_text(render(self.data))


def _f(x: Any, nd: int = 2) -> str:
    return "–" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def render(d: dict[str, Any]) -> str:
    p = d["plan"]
    gpu = d["mode"] == "gpu"
    env = d.get("env", {})
    lines = [f"# PFlash on {'the GPU' if gpu else 'the CPU (tiny shapes, a test of the script)'}: drafter pass, "
             f"full and kept prefill", ""]
    if gpu:
        lines += ["Measured by `benchmarks/gpu/run.sh` (one command, README.md there) on "
                  f"{env.get('gpu', 'the GPU machine')}. **Random-weight GGUFs** of gemma-3 shapes "
                  "(`benchmarks/gpu/synthetic_target.py`): their answers are noise, their speed per token is the "
                  "shape's real speed. gemma-3 shapes stand in for the seed's Qwen3.5-0.8B drafter / 27B target "
                  "because drafter and target must share a tokenizer (the shipped gemma-3 one).", ""]
    else:
        lines += ["`benchmarks/gpu/run.sh --cpu-tiny`: CUDA off, tiny random-weight shapes. These numbers only show "
                  "that every step runs; they say nothing about speed.", ""]
    t, dr = p["target"], p["drafters"][0]
    lines += [f"- target: {model_name(t)} (llama-server b11434, {' '.join(p['server_args']) or 'CPU'}, one slot, "
              f"context {p['ctx']}, the proxy's spawn flags); drafter: {model_name(dr)} through llama-cpp-python "
              f"0.3.36's bindings on the same build (context {p['drafter_ctx']}, batch 512, 2 threads, "
              f"{'every layer on the GPU' if p['gpu_layers'] else 'CPU'})",
              "- kept tokens: the proxy's default prefill curve; PFlash first-token estimate = drafter pass + "
              "prefill of the kept tokens (compression glue outside the drafter is in the proxy turn below)",
              f"- build: {json.dumps(env.get('build')) if env.get('build') else 'kept from an earlier command'}", ""]
    lines += ["| tokens | full prefill s | full tok/s | kept tokens | kept prefill s | drafter pass s | "
              "PFlash est. s | speed-up |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, r in sorted(d["rows"].items(), key=lambda kv: int(kv[0])):
        full, kept, dp = r.get("full_s"), r.get("kept_s"), r.get("drafter_s")
        est = kept + dp if kept is not None and dp is not None else None
        tps = int(n) / full if full else None
        sp = full / est if full and est else None
        lines.append(f"| {n} | {_f(full)} | {_f(tps, 0)} | {r.get('kept_tokens')} | {_f(kept)} | {_f(dp)} | "
                     f"{_f(est)} | {_f(sp)}× |" if sp else
                     f"| {n} | {_f(full)} | {_f(tps, 0)} | {r.get('kept_tokens')} | {_f(kept)} | {_f(dp)} | "
                     f"{_f(est)} | – |")
    for name, rows in d["drafters"].items():
        lines += ["", f"Drafter {name}, cold head-attention pass (represent + score):", "",
                  "| tokens | pass s | drafter forward s | tok/s |", "|---:|---:|---:|---:|"]
        for n, r in sorted(rows.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {n} | {_f(r.get('total_s'))} | {_f(r.get('drafter_forward_s'))} | "
                         f"{_f(int(n) / r['total_s'], 0) if r.get('total_s') else '–'} |")
    pt = d.get("proxy_turn")
    if pt:
        lines += ["", f"One compressed turn through the proxy ({pt.get('case_tokens')} tokens, scorer "
                  f"{pt.get('scorer')}):", "",
                  "| arm | first token s | prompt tokens served | pflash ms | drafter ms | mode |",
                  "|---|---:|---:|---:|---:|---|"]
        for arm in ("direct", "pflash"):
            a = pt.get(arm) or {}
            lines.append(f"| {arm} | {_f(a.get('ttft_s'))} | {a.get('prompt_tokens')} | {_f(a.get('pflash_ms'), 0)} | "
                         f"{_f(a.get('drafter_ms'), 0)} | {a.get('mode', '')} |")
    if d["skipped"]:
        lines += ["", "Skipped (time box): " + "; ".join(f"{s['step']} (needs ~{s['estimate_s']} s, "
                                                          f"{s['left_s']} s left)" for s in d["skipped"])]
    failed = [s for s in d["steps"] if not s["ok"]]
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{s['step']}: {s.get('error', '')}" for s in failed)]
    lines += ["", f"Steps (seconds from the start of measure.py; budget {d['budget_s']:.0f} s): " +
              ", ".join(f"{s['step']} {s['s']} s" for s in d["steps"]), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ steps


def generate(work: Path, specs: list[dict[str, Any]], template: Path) -> dict[str, float]:
    """Step 2: every GGUF that is not there yet; returns seconds per file written."""
    from synthetic_target import write_target

    done = {}
    for spec in specs:
        path = work / "models" / model_name(spec)
        if path.is_file():
            continue
        t0 = time.perf_counter()
        write_target(path, spec["shape"], spec["quant"], template_from=template, layers=spec.get("layers"))
        done[path.name] = round(time.perf_counter() - t0, 1)
        print(f"measure: wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {done[path.name]} s", flush=True)
    return done


class Server:
    """llama-server on the target, with the proxy's own spawn arguments (step 3)."""

    def __init__(self, binary: Path, model: Path, work: Path, ctx: int, extra: list[str]):
        from pflash_proxy.config import Settings
        from pflash_proxy.llama.spawn import free_port, gguf_sliding_window, server_args

        self.slot_dir = work / "slots"
        self.slot_dir.mkdir(parents=True, exist_ok=True)
        settings = Settings(spawn=True, home=work, parallel=1, ctx_size=ctx, slot_save_path=self.slot_dir,
                            llama_server_args=extra)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = server_args(settings, binary, model, self.port, bool(gguf_sliding_window(model)))
        self.log = work / "llama-server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> None:
        import urllib.request

        self.proc = subprocess.Popen(self.args, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"llama-server not healthy in {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def text_of(n_lines: int, seed: int = 0) -> str:
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ("alpha beta gamma delta ledger copper crate audit clerk harbor vault code report district north "
             "river invoice margin signal tower").split()
    return "".join(f"{i}: " + " ".join(rng.choice(words, 14)) + ".\n" for i in range(n_lines))


def text_with_tokens(tokenize: Callable[[str], Any], n: int, seed: int = 0) -> str:
    """Whole lines whose token count is just under n (gemma's tokenizer: ~30 tokens a line here)."""
    text = text_of(max(8, n // 20), seed)
    while len(tokenize(text)) < n:
        text += text_of(max(8, n // 40), seed + len(text))
    while len(tokenize(text)) > n:
        text = text[:text.rfind("\n", 0, int(len(text) * min(0.995, n / len(tokenize(text)) + 0.002))) + 1]
    return text


async def prefill(http, url: str, text: str, salt: str, timeout: float) -> dict[str, Any]:
    """The target's prefill of ``text`` (plus a salt line): one generated token, no prompt cache."""
    import aiohttp

    body = {"prompt": f"[run {salt}]\n{text}", "n_predict": 1, "cache_prompt": False, "temperature": 0}
    t0 = time.perf_counter()
    async with http.post(url + "/completion", json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        data = await r.json(content_type=None)
    wall = time.perf_counter() - t0
    t = data.get("timings") or {}
    if r.status != 200 or not t:
        raise RuntimeError(f"/completion answered {r.status}: {str(data)[:300]}")
    return {"wall_s": round(wall, 3), "prompt_n": t.get("prompt_n"), "prompt_s": round(t["prompt_ms"] / 1000, 3),
            "prompt_tok_s": round(t.get("prompt_per_second") or 0, 1)}


class DrafterBench:
    """The drafter and the scorer the proxy would serve with it (step 4)."""

    def __init__(self, path: Path, work: Path, n_ctx: int, gpu_layers: int):
        from pflash_proxy.drafter.attention import AttentionScorer
        from pflash_proxy.drafter.probe_writer import random_head_weights, write_scorer_head
        from pflash_proxy.drafter.probes import load_scorer_head
        from pflash_proxy.drafter.runtime import Drafter
        from pflash_proxy.drafter.trained import sets
        from pflash_proxy.stages.scorers import drafter_scorer

        self.path = path
        self.drafter = Drafter(str(path), n_ctx=n_ctx, n_threads=2, n_gpu_layers=gpu_layers, timeout=600,
                               cache_mb=512)
        n_layer, n_head, d = self.drafter.n_layer, self.drafter.n_head, self.drafter.n_embd
        shipped = next(iter(sets().values()), None)
        heads_270m = json.loads((shipped / "attention-heads.json").read_text())["heads"] if shipped else []
        tap, rank = 14, 64
        if shipped is not None:
            meta = load_scorer_head(shipped / "scorer-head.gguf").meta
            tap, rank = int(meta.tap_block), int(meta.extra.get("rank", rank))
        if heads_270m and n_layer == 18 and d == 640:
            heads = [tuple(h) for h in heads_270m]
        else:  # as many heads, spread over the global layers (every 6th), first heads first
            glob = [L for L in range(n_layer) if (L + 1) % 6 == 0] or [n_layer - 1]
            want = max(1, len(heads_270m) or 8)
            heads = [(L, h) for h in range(n_head) for L in glob][:want]
        tap = min(max(1, round(tap * n_layer / 18)), n_layer - 2)
        head_path = work / f"{path.stem}-random-scorer-head.gguf"
        write_scorer_head(head_path, random_head_weights(d, rank), tap_block=tap)
        self.attention = AttentionScorer(self.drafter, heads=heads)
        self.scorer = drafter_scorer("head-attention", self.attention, load_scorer_head(head_path), None)
        self.setup = {"heads": [f"{L}.{h}" for L, h in heads], "tap_block": tap, "rank": rank, "width": d,
                      "layers": n_layer, "n_ctx": n_ctx, "gpu_layers": gpu_layers, "threads": 2, "n_batch": 512}

    def tokenize(self, text: str):
        return self.drafter.tokenize(text)

    def cold_pass(self, text: str, timeout: float) -> dict[str, Any]:
        """One cold represent + score of ``text``; a drafter call past ``timeout`` seconds is aborted."""
        from pflash_proxy.compress.text import TokenizedText
        from pflash_proxy.compress.units import UnitSegmenter
        from pflash_proxy.drafter.taps import text_key

        tt = TokenizedText.from_text(text)
        units = UnitSegmenter(32, 512).segment(tt, None)
        self.drafter.timeout = max(5.0, timeout)
        self.attention.keys.clear()  # cold: no kept keys, no kept drafter state
        self.drafter.forget("attn:" + text_key(text))
        before = self.drafter.stats["seconds"]
        t0 = time.perf_counter()
        reps = self.scorer.represent(tt, units)
        t1 = time.perf_counter()
        scores = self.scorer.score(reps, QUESTION)
        t2 = time.perf_counter()
        return {"tokens": int(len(self.drafter.tokenize(text))), "units": len(units),
                "represent_s": round(t1 - t0, 3), "score_s": round(t2 - t1, 3), "total_s": round(t2 - t0, 3),
                "drafter_forward_s": round(self.drafter.stats["seconds"] - before, 3),
                "finite": bool(__import__("numpy").isfinite(scores).all())}

    def close(self) -> None:
        self.drafter.close()


async def proxy_turn(server_url: str, slot_dir: Path, work: Path, scorer: Any, text: str, threshold: int,
                     timeout: float) -> dict[str, Any]:
    """Step 5: one compressed chat turn through the proxy vs the same chat to llama-server directly."""
    import aiohttp

    from pflash_proxy.bench.runner import Proxy, bench_settings, chat, new_id, salted

    messages = [{"role": "user", "content": f"{text}\nQuestion: {QUESTION}"}]
    out: dict[str, Any] = {}
    tmo = aiohttp.ClientTimeout(total=timeout)
    # fallback_spread=1: the flat-relevance fallback off, since random weights give noise relevance that the
    # proxy may judge flat and serve whole; the turn then times the compressed path it is meant to time
    settings = bench_settings(server_url, work / "proxy-home", slot_dir, threshold=threshold,
                              upstream_timeout_s=timeout, fallback_spread=1.0)
    async with aiohttp.ClientSession(timeout=tmo, connector=aiohttp.TCPConnector(force_close=True)) as http, \
            Proxy(settings, scorer=scorer) as px:
        key = new_id()
        res = await chat(http, px.url, salted(messages, "pflash-" + key), bench_id=key, max_tokens=2)
        fields = px.seen(key).fields if key in px.recorder.seen else {}
        out["pflash"] = {"status": res.status, "ttft_s": round(res.ttft_s or 0, 3), "total_s": round(res.total_s, 3),
                         "prompt_tokens": res.prompt_n, "mode": fields.get("pflash"),
                         "reason": fields.get("pflash_reason"),
                         "pflash_ms": fields.get("pflash_ms"),
                         "drafter_ms": round(fields.get("ms_represent", 0) + fields.get("ms_score", 0), 1),
                         "fields": {k: v for k, v in fields.items() if isinstance(v, (int, float, str))}}
        res = await chat(http, server_url, salted(messages, "direct-" + key), max_tokens=2)
        out["direct"] = {"status": res.status, "ttft_s": round(res.ttft_s or 0, 3), "total_s": round(res.total_s, 3),
                         "prompt_tokens": res.prompt_n, "mode": "llama-server direct"}
    return out


# ------------------------------------------------------------------------------------------------ main


def environment(binary: Path, out: Path) -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(), "host": platform.node()}
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
        env["gpu"] = q.stdout.strip() or q.stderr.strip()
    v = subprocess.run([str(binary / "llama-server"), "--version"], capture_output=True, text=True)
    env["llama_server_version"] = (v.stdout + v.stderr).strip()[-300:]
    try:
        env["build"] = json.loads((out / "build.json").read_text())
    except (OSError, ValueError):
        env["build"] = None
    return env


async def run(a: argparse.Namespace) -> int:
    plan = PLANS[a.mode]
    est = plan["est_s"]
    work, out = Path(a.work), Path(a.out)
    template = ROOT / ".gpu" / "gemma3-tokenizer.gguf"
    specs = [plan["target"]] + plan["drafters"]
    if a.gen_only:  # run.sh, in the background during the build: no report of its own
        generate(work, specs, template)
        return 0
    rep = Report(out, a.mode, plan, a.budget)
    rep.data["env"] = environment(Path(a.bin), out)
    rep.save()

    t0 = time.perf_counter()
    try:  # 2. GGUFs (usually already written by run.sh during the build)
        files = generate(work, specs, template)
        rep.step("gen", time.perf_counter() - t0, files=files)
    except Exception as exc:  # noqa: BLE001 - every failure goes into the report
        rep.step("gen", time.perf_counter() - t0, ok=False, error=repr(exc))
        return 1

    server = Server(Path(a.bin) / "llama-server", work / "models" / model_name(plan["target"]), work,
                    plan["ctx"], plan["server_args"])
    drafters: dict[str, DrafterBench] = {}
    try:
        t0 = time.perf_counter()
        try:  # 3. target server + first drafter
            server.start(timeout=max(30.0, rep.left()))
            rep.step("server", time.perf_counter() - t0, args=" ".join(server.args[1:]))
        except Exception as exc:  # noqa: BLE001
            rep.step("server", time.perf_counter() - t0, ok=False, error=repr(exc))
            return 1
        t0 = time.perf_counter()
        dspec = plan["drafters"][0]
        try:
            if os.environ.get("PFLASH_GPU_SKIP_DRAFTER"):  # the bindings crashed this build: time the target alone
                raise RuntimeError("drafter skipped (PFLASH_GPU_SKIP_DRAFTER)")
            drafters[dkey(dspec)] = DrafterBench(work / "models" / model_name(dspec), work, plan["drafter_ctx"],
                                                    plan["gpu_layers"])
            rep.step("drafter load", time.perf_counter() - t0, **drafters[dkey(dspec)].setup)
        except Exception as exc:  # noqa: BLE001
            rep.step("drafter load", time.perf_counter() - t0, ok=False, error=repr(exc))
            traceback.print_exc()
        first = drafters.get(dkey(dspec))
        import aiohttp

        # a fresh connection per request: llama-server drops idle keep-alive ones during a long drafter pass
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            tok = first.tokenize if first else (lambda s: s.split())
            t0 = time.perf_counter()
            await prefill(http, server.url, text_of(20), "warm-up", timeout=max(30.0, rep.left()))
            rep.step("warm-up", time.perf_counter() - t0)
            texts: dict[int, str] = {}
            scale_prefill, scale_drafter = est["prefill_per_16k"], est["drafter_per_16k"]
            for n in plan["lengths"]:  # 4. most important first: the shortest length's whole row
                f = n / 16384
                texts[n] = text_with_tokens(tok, n, seed=n)
                row = rep.data["rows"].setdefault(str(n), {"kept_tokens": kept_tokens(n)})
                if rep.fits(f"full prefill {n}", scale_prefill * f ** 1.3):
                    t0 = time.perf_counter()
                    try:
                        r = await prefill(http, server.url, texts[n], f"full-{n}", timeout=rep.left())
                        row.update(full_s=r["prompt_s"], full=r)
                        scale_prefill = max(scale_prefill * 0.3, r["prompt_s"] / f ** 1.3)
                        rep.step(f"full prefill {n}", time.perf_counter() - t0, **r)
                    except Exception as exc:  # noqa: BLE001
                        rep.step(f"full prefill {n}", time.perf_counter() - t0, ok=False, error=repr(exc))
                k = row["kept_tokens"]
                if rep.fits(f"kept prefill {n}", scale_prefill * (k / 16384) ** 1.3):
                    t0 = time.perf_counter()
                    try:
                        r = await prefill(http, server.url, text_with_tokens(tok, k, seed=n + 1), f"kept-{n}",
                                          timeout=rep.left())
                        row.update(kept_s=r["prompt_s"], kept=r)
                        rep.step(f"kept prefill {n}", time.perf_counter() - t0, **r)
                    except Exception as exc:  # noqa: BLE001
                        rep.step(f"kept prefill {n}", time.perf_counter() - t0, ok=False, error=repr(exc))
                if first is not None and rep.fits(f"drafter {dkey(dspec)} {n}", scale_drafter * f ** 1.2):
                    t0 = time.perf_counter()
                    try:
                        r = first.cold_pass(texts[n], timeout=rep.left())
                        row.update(drafter_s=r["total_s"], drafter=r)
                        rep.data["drafters"].setdefault(dkey(dspec), {})[str(n)] = r
                        scale_drafter = max(scale_drafter * 0.3, r["total_s"] / f ** 1.2)
                        rep.step(f"drafter {dkey(dspec)} {n}", time.perf_counter() - t0, **r)
                    except Exception as exc:  # noqa: BLE001
                        rep.step(f"drafter {dkey(dspec)} {n}", time.perf_counter() - t0, ok=False,
                                 error=repr(exc))
            # 5. one compressed turn through the proxy
            n = plan["proxy_tokens"]
            f = n / 16384
            guess = est["proxy"] * f + scale_prefill * f ** 1.3 + scale_drafter * f ** 1.2
            if first is not None and rep.fits("proxy turn", guess):
                t0 = time.perf_counter()
                first.drafter.timeout = max(5.0, rep.left())
                try:
                    r = await proxy_turn(server.url, server.slot_dir, work, first.scorer,
                                         texts.get(n) or text_with_tokens(tok, n, seed=n), plan["threshold"],
                                         timeout=rep.left())
                    r.update(case_tokens=n, scorer=f"head-attention ({dkey(dspec)} drafter)")
                    rep.data["proxy_turn"] = r
                    rep.step("proxy turn", time.perf_counter() - t0,
                             pflash_ttft_s=r["pflash"]["ttft_s"], direct_ttft_s=r["direct"]["ttft_s"])
                except Exception as exc:  # noqa: BLE001
                    rep.step("proxy turn", time.perf_counter() - t0, ok=False, error=repr(exc))
                    traceback.print_exc()
        # 6. extras: the other drafter shapes
        for dspec in plan["drafters"][1:]:
            name = dkey(dspec)
            if not rep.fits(f"drafter load {name}", 20):
                break
            if first is not None:  # one drafter on the GPU at a time
                first.close()
                drafters.pop(dkey(plan["drafters"][0]), None)
                first = None
            t0 = time.perf_counter()
            try:
                drafters[name] = DrafterBench(work / "models" / model_name(dspec), work, plan["drafter_ctx"],
                                              plan["gpu_layers"])
                rep.step(f"drafter load {name}", time.perf_counter() - t0, **drafters[name].setup)
            except Exception as exc:  # noqa: BLE001
                rep.step(f"drafter load {name}", time.perf_counter() - t0, ok=False, error=repr(exc))
                continue
            for n in plan["lengths"]:
                if not rep.fits(f"drafter {name} {n}", est["drafter_per_16k"] * (n / 16384) ** 1.2):
                    break
                t0 = time.perf_counter()
                try:
                    r = drafters[name].cold_pass(texts.get(n) or text_with_tokens(drafters[name].tokenize, n, n),
                                                 timeout=rep.left())
                    rep.data["drafters"].setdefault(name, {})[str(n)] = r
                    rep.step(f"drafter {name} {n}", time.perf_counter() - t0, **r)
                except Exception as exc:  # noqa: BLE001
                    rep.step(f"drafter {name} {n}", time.perf_counter() - t0, ok=False, error=repr(exc))
    finally:
        for d in drafters.values():
            d.close()
        server.stop()
        (out / "llama-server-tail.log").write_text(server.tail(20000))
        rep.save()
    print(render(rep.data), flush=True)
    return 0 if all(s["ok"] for s in rep.data["steps"]) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=list(PLANS), default="gpu")
    p.add_argument("--bin", required=True, help="folder with llama-server and the shared libraries")
    p.add_argument("--work", required=True, help="folder for the GGUFs, logs and proxy state")
    p.add_argument("--out", required=True, help="report folder ($OUT on the GPU machine)")
    p.add_argument("--budget", type=float, default=540, help="seconds from now by which the report is final")
    p.add_argument("--gen-only", action="store_true", help="only write the GGUFs (run.sh: during the build)")
    a = p.parse_args(argv)
    return asyncio.run(run(a))


if __name__ == "__main__":
    sys.exit(main())
