"""``pflash-proxy bench quality|ttft|answers|code-reads``: benchmarks of the product as users meet it.

The whole feature lives here: ``cases/`` generates the long-prompt cases and checks what reached the upstream;
``quality``, ``ttft`` and ``answers`` are three benches; ``code_reads/`` is the fourth (agent reads of the
installed third-party packages' sources, questions generated, split by package); ``runner`` (llama-server, in-process proxies, a
streaming client), ``arms`` (PFlash on/off side by side), ``sizing`` (cases sized in the upstream's tokens) and
``report`` (JSON, markdown, PNG) are what they share.  ``benchmarks/`` beside the package holds the scripts that
measure the proxy itself and the reports kept in the repository.

1. ``add_parser(sub)`` adds the ``bench`` subcommand and its options to the CLI's subparsers.
2. ``main(args)`` fills in the defaults that depend on ``--quick`` (lengths, threshold, prompts), makes a work
   directory (snapshots, session stores, llama-server log; removed afterwards unless ``--keep``), runs the
   bench (``quality``/``ttft``/``answers`` modules), writes JSON + markdown (+ PNG) under ``--out`` and prints
   the markdown. ``code-reads`` has its own defaults and writes ``report.md``, ``results.json`` and
   ``command.txt`` (``code_reads.run``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pflash_proxy.bench.report import Written

QUICK_THRESHOLD = 1024
DRAFTER_TIMEOUT_S = 1800.0  # `--drafter-timeout`'s default: a bench wants the drafter's score, not its fallback
# --quick finishes in under 2 minutes on 2 CPU cores (measured: quality ~21 s, ttft ~100 s, answers ~90 s).
# Retention needs no forward, so quality covers 2K and 4K; ttft and answers pay for every full prefill
# (gemma-3-270m: ~200 tokens/s at 4K here), so they run at 4K only (below ~4K the lexical scores of these cases
# are flat and PFlash serves them whole, which shows nothing).
QUICK_LENGTHS = {"quality": (2048, 4096), "ttft": (4096,), "answers": (4096,)}


def _ints(text: str) -> list[int]:
    return [int(x.strip().lower().replace("k", "")) * (1024 if x.strip().lower().endswith("k") else 1)
            for x in text.split(",") if x.strip()]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="run a benchmark (quality, ttft, answers, code-reads) or an eval (ruler-qa, "
                                     "code-tasks, planted, every-x)",
                       description="Benchmarks through the proxy against a real llama-server; see docs/results.md")
    p.add_argument("kind", choices=("quality", "ttft", "answers", "code-reads", "ruler-qa", "code-tasks", "planted",
                                    "every-x"))
    p.add_argument("--quick", action="store_true",
                   help="a small subset, threshold 1024: quality at 2K/4K, ttft and answers at 4K "
                        "(each under 2 minutes here)")
    p.add_argument("--out", default="benchmarks/results", help="directory for KIND.json / KIND.md / KIND.png")
    p.add_argument("--upstream", help="use this llama-server instead of spawning one")
    p.add_argument("--model", type=Path, help="GGUF for the spawned llama-server (default gemma-3-270m)")
    p.add_argument("--lengths", type=_ints, help="comma-separated token lengths (default 16384,32768)")
    p.add_argument("--scorers", "--scorer", help="PFlash scorers to compare, comma-separated (default "
                                                 "lexical,attention,head; code-reads: lexical, and auto with "
                                                 "--drafter; the evals: lexical, and with --drafter auto for "
                                                 "ruler-qa/planted, head-attention for code-tasks/every-x)")
    p.add_argument("--families", type=lambda s: [x for x in s.split(",") if x],
                   help="case families (ruler-qa: squad,hotpotqa; planted: code,prose; code-tasks: the task kinds "
                        "bug,how,why,change,mined)")
    p.add_argument("--per-family", type=_per_family, default=1,
                   help="cases per family and length (quality, answers): N, or N,FAMILY=M,... "
                        "(e.g. 1,nolima=10,agent=10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=int, help="PFlash admission threshold (default min(16384, shortest/2); "
                                                  "--quick 1024)")
    p.add_argument("--prompts", type=int, help="prompts per length for ttft (default 3, --quick 1)")
    p.add_argument("--drafter", type=Path, help="drafter GGUF (enables the attention scorer)")
    p.add_argument("--drafter-timeout", type=float, default=DRAFTER_TIMEOUT_S,
                   help="seconds one drafter pass may take (the proxy's default is 300; a CPU attention pass over "
                        "16K tokens takes about that long, and a bench wants the score, not the fallback)")
    p.add_argument("--scoring-head", type=Path, help="scorer head GGUF (with --drafter: the head scorer)")
    p.add_argument("--request-probe", type=Path, help="request probe GGUF (optional, head scorer)")
    p.add_argument("--gpu-prefill-tps", type=float, default=8000.0,
                   help="projection: target prefill tokens/s on the GPU at short lengths (ttft)")
    p.add_argument("--gpu-quadratic-at", type=float, default=65536.0,
                   help="projection: tokens at which attention doubles the per-token prefill cost (ttft)")
    p.add_argument("--max-tokens", type=int, default=48, help="answer length for `answers`")
    p.add_argument("--dump-analyses", type=Path, metavar="FILE",
                   help="quality: pickle every scorer's first-turn units and scores with the cases, to replay "
                        "score fusions offline (the fusion study of docs/results.md)")
    p.add_argument("--render", type=Path, nargs="+", metavar="KIND.json",
                   help="write the report again from an earlier run's JSON (new tables for old runs; no "
                        "llama-server, nothing measured); several quality runs of the same seed, threshold, "
                        "lengths and rows (a long run split by --families) are merged into one report")
    p.add_argument("--split", choices=("test", "train", "all", "dev", "held-out", "held-out-2"), default=None,
                   help="code-reads: test/train/all (default all); the evals (ruler-qa, code-tasks, planted, every-x): "
                        "dev (default, tune on it) or held-out (run once, at the end); code-tasks and every-x also "
                        "held-out-2 (tasks and wordings written later: code-tasks over packages in neither split, "
                        "every-x over the held-out files)")
    p.add_argument("--forward", action="store_true",
                   help="the evals: forward each request to llama-server (one output token) and check the body it "
                        "received, captured in front of it, instead of stopping before the forward (slow on CPU)")
    p.add_argument("--followup", action="store_true",
                   help="ruler-qa: ask a second question whose evidence the first compression left out (recall)")
    p.add_argument("--limit", type=int, default=0,
                   help="code-reads, code-tasks, planted, every-x: the first N cases only (0 = all); ruler-qa: "
                        "questions per dataset (default 30)")
    p.add_argument("--shapes", default=None,
                   help="code-reads: read shapes (claude N<TAB>line, opencode N: line, cat raw; default all three); "
                        "code-tasks also claude-arrow (N→line) and codex (raw, Responses)")
    p.add_argument("--variants", default=None,
                   help="code-reads: warm (the task first, as its own turn), cold (the read alone); default "
                        "warm,cold (code-tasks: warm)")
    p.add_argument("--no-mined", dest="mined", action="store_false",
                   help="code-tasks: only the hand-written tasks, no sentences mined from the packages' docs")
    p.add_argument("--ids", default=None,
                   help="code-tasks: only the cases whose id matches one of these, comma-separated, each an id or a "
                        "glob (e.g. 'anyio-3,h11-*,*-mined-*'); applied before --limit")
    p.add_argument("--site", type=Path, help="code-reads: the site-packages to generate from (default this "
                                             "interpreter's)")
    p.add_argument("--concurrency", type=int, default=4,
                   help="code-reads: reads in flight together (each its own session; default 4)")
    p.add_argument("--drafter-limit", type=int, default=0,
                   help="code-reads: drafter scorers only on the first N cases (0 = all)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (snapshots, logs)")
    p.add_argument("-v", "--verbose", action="store_true", help="progress lines")
    return p


def _per_family(v: str) -> int | dict[str, int]:
    """``3`` → 3; ``1,nolima=10,agent=10`` → {"*": 1, "nolima": 10, "agent": 10}."""
    out: dict[str, int] = {}
    try:
        for item in v.split(","):
            name, _, n = item.rpartition("=")
            out[name.strip() or "*"] = int(n)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,FAMILY=M,... (got {v!r})") from None
    if any(n < 0 for n in out.values()):
        raise argparse.ArgumentTypeError("counts must be >= 0")
    return out["*"] if list(out) == ["*"] else out


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in what depends on the bench and ``--quick``: lengths, threshold, prompts, the scorer list."""
    args.lengths = list(args.lengths or (QUICK_LENGTHS[args.kind] if args.quick else (16_384, 32_768)))
    if args.threshold is None:
        args.threshold = QUICK_THRESHOLD if args.quick else min(16_384, min(args.lengths) // 2)
    if args.prompts is None:
        args.prompts = 1 if args.quick else 3
    args.scorers = args.scorers or "lexical,attention,head"
    args.scorers = [s for s in args.scorers.split(",") if s] if isinstance(args.scorers, str) else args.scorers
    return args


def main(args: argparse.Namespace) -> int:
    from pflash_proxy.bench.evals import EVALS

    if args.kind in EVALS:
        from pflash_proxy.bench.evals import main as evals

        return evals(args)
    if args.kind == "code-reads":
        from pflash_proxy.bench.code_reads.run import main as code_reads

        args.split = args.split or "all"
        args.shapes = args.shapes or "claude,opencode,cat"
        args.variants = args.variants or "warm,cold"
        if args.split not in ("test", "train", "all"):
            print(f"pflash-proxy bench: code-reads splits are test, train or all (got {args.split})", file=sys.stderr)
            return 2
        return code_reads(args)
    apply_defaults(args)
    if getattr(args, "render", None) is not None:
        return render(args)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    workdir = Path(tempfile.mkdtemp(prefix=f"pflash-bench-{args.kind}-"))
    args.workdir = workdir
    from pflash_proxy.bench.runner import BenchError
    from pflash_proxy.llama.spawn import SpawnError

    try:
        written = asyncio.run(run(args))
    except (BenchError, SpawnError) as exc:  # no llama-server (extra missing), or it would not start
        print(f"pflash-proxy bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(written.markdown)
    for path in written.paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def render(args: argparse.Namespace) -> int:
    """``--render KIND.json [...]``: the report of runs already made, with this version's tables."""
    import json

    runs = []
    for path in args.render:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"pflash-proxy bench: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        if data.get("bench") != args.kind:
            print(f"pflash-proxy bench: {path} holds a {data.get('bench')!r} run, not {args.kind!r}",
                  file=sys.stderr)
            return 2
        runs.append((str(path), data))
    data = runs[0][1]
    if len(runs) > 1:
        if args.kind != "quality":
            print(f"pflash-proxy bench: only quality runs can be merged, not {args.kind!r}", file=sys.stderr)
            return 2
        from pflash_proxy.bench.quality import merge_runs

        try:
            data = merge_runs(runs)
        except ValueError as exc:
            print(f"pflash-proxy bench: {exc}", file=sys.stderr)
            return 2
    written = _module(args.kind).report(data, Path(args.out), args)
    print(written.markdown)
    for path in written.paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _module(kind: str) -> ModuleType:
    if kind == "quality":
        from pflash_proxy.bench import quality as mod
    elif kind == "ttft":
        from pflash_proxy.bench import ttft as mod  # type: ignore[no-redef]
    else:
        from pflash_proxy.bench import answers as mod  # type: ignore[no-redef]
    return mod


async def run(args: argparse.Namespace) -> Written:
    mod = _module(args.kind)
    data = await mod.run(args)
    written: Written = mod.report(data, Path(args.out), args)
    return written
