"""``pflash-proxy bench quality|ttft|answers``: benchmarks of the product as users meet it.

The whole feature lives here: ``cases/`` generates the long-prompt cases and checks what reached the upstream;
``quality``, ``ttft`` and ``answers`` are three benches; ``runner`` (llama-server, in-process proxies, a streaming
client), ``arms`` (PFlash on/off side by side), ``sizing`` (cases sized in the upstream's tokens) and ``report``
(JSON, markdown, PNG) are what they share.  The relevance lab (the evals on text people wrote and the code-reads
bench) lives beside the package in the repository's ``evals/`` (``python -m evals KIND``); it imports these
pieces, never the other way round.

1. ``add_parser(sub)`` adds the ``bench`` subcommand and its options to the CLI's subparsers; ``add_run_options``
   adds the options a run through the proxy shares with the evals (``python -m evals`` reuses it).
2. ``main(args)`` fills in the defaults that depend on ``--quick`` (lengths, threshold, prompts), makes a work
   directory (snapshots, session stores, llama-server log; removed afterwards unless ``--keep``), runs the
   bench (``quality``/``ttft``/``answers`` modules), writes JSON + markdown (+ PNG) under ``--out`` and prints
   the markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pflash_proxy.bench.defaults import DRAFTER_TIMEOUT_S

if TYPE_CHECKING:
    from pflash_proxy.bench.report import Written

QUICK_THRESHOLD = 1024
# --quick finishes in under 2 minutes on 2 CPU cores (measured: quality ~21 s, ttft ~100 s, answers ~90 s).
# Retention needs no forward, so quality covers 2K and 4K; ttft and answers pay for every full prefill
# (gemma-3-270m: ~200 tokens/s at 4K here), so they run at 4K only (below ~4K the lexical scores of these cases
# are flat and PFlash serves them whole, which shows nothing).
QUICK_LENGTHS = {"quality": (2048, 4096), "ttft": (4096,), "answers": (4096,)}


def _ints(text: str) -> list[int]:
    return [int(x.strip().lower().replace("k", "")) * (1024 if x.strip().lower().endswith("k") else 1)
            for x in text.split(",") if x.strip()]


KINDS = ("quality", "ttft", "answers")
# the relevance lab's kinds, moved out of the package to the repository's evals/ (`python -m evals KIND`)
LAB_KINDS = ("ruler-qa", "code-tasks", "planted", "every-x", "code-reads")


def lab_kind_moved(kind: str) -> str:
    """The one line ``pflash-proxy bench KIND`` answers for a kind that left the package."""
    return (f"pflash-proxy bench: {kind} is the relevance lab's, outside the package now: run "
            f"`python -m evals {kind}` in a checkout of the repository (docs/contributing.md)")


class _Kind(argparse.Action):
    """The ``kind`` argument: a product bench, or one line (exit 2) saying where a lab kind went (before argparse
    reports the lab's options as unknown)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[object] | None, option_string: str | None = None) -> None:
        if values in LAB_KINDS:
            parser.exit(2, lab_kind_moved(str(values)) + "\n")
        if values not in KINDS:
            parser.error(f"argument kind: invalid choice: {values!r} (choose from {', '.join(KINDS)})")
        setattr(namespace, self.dest, values)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="run a benchmark of the product (quality, ttft, answers)",
                       description="Benchmarks through the proxy against a real llama-server; see docs/results.md")
    p.add_argument("kind", action=_Kind, metavar="{" + ",".join(KINDS) + "}")
    p.add_argument("--quick", action="store_true",
                   help="a small subset, threshold 1024: quality at 2K/4K, ttft and answers at 4K "
                        "(each under 2 minutes here)")
    add_run_options(p)
    p.add_argument("--per-family", type=_per_family, default=1,
                   help="cases per family and length (quality, answers): N, or N,FAMILY=M,... "
                        "(e.g. 1,nolima=10,agent=10)")
    p.add_argument("--prompts", type=int, help="prompts per length for ttft (default 3, --quick 1)")
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
    return p


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a run through the proxy against a real llama-server, shared by ``pflash-proxy bench`` and
    the relevance lab (``python -m evals``, which rewords the help of a few)."""
    p.add_argument("--out", default="benchmarks/results", help="directory for KIND.json / KIND.md / KIND.png")
    p.add_argument("--upstream", help="use this llama-server instead of spawning one")
    p.add_argument("--model", type=Path, help="GGUF for the spawned llama-server (default gemma-3-270m)")
    p.add_argument("--lengths", type=_ints, help="comma-separated token lengths (default 16384,32768)")
    p.add_argument("--scorers", "--scorer", help="PFlash scorers to compare, comma-separated (default "
                                                 "lexical,attention,head)")
    p.add_argument("--families", type=lambda s: [x for x in s.split(",") if x],
                   help="case families, comma-separated (default every family; --quick a subset)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=int, help="PFlash admission threshold (default min(16384, shortest/2); "
                                                  "--quick 1024)")
    p.add_argument("--drafter", type=Path, help="drafter GGUF (enables the attention scorer)")
    p.add_argument("--drafter-timeout", type=float, default=DRAFTER_TIMEOUT_S,
                   help="seconds one drafter pass may take (the proxy's default is 300; a CPU attention pass over "
                        "16K tokens takes about that long, and a bench wants the score, not the fallback)")
    p.add_argument("--render", type=Path, nargs="+", metavar="KIND.json",
                   help="write the report again from an earlier run's JSON (new tables for old runs; no "
                        "llama-server, nothing measured); several quality runs of the same seed, threshold, "
                        "lengths and rows (a long run split by --families) are merged into one report")
    p.add_argument("--keep", action="store_true", help="keep the work directory (snapshots, logs)")
    p.add_argument("-v", "--verbose", action="store_true", help="progress lines")


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


def read_run(path: Path, kind: str, prog: str) -> Any:
    """An earlier run's JSON for ``--render``: None (the reason printed as ``prog``) when it cannot be read or holds
    another kind's run."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"{prog}: cannot read {path}: {exc}", file=sys.stderr)
        return None
    if not isinstance(data, dict) or data.get("bench") != kind:
        got = data.get("bench") if isinstance(data, dict) else None
        print(f"{prog}: {path} holds a {got!r} run, not {kind!r}", file=sys.stderr)
        return None
    return data


def render(args: argparse.Namespace) -> int:
    """``--render KIND.json [...]``: the report of runs already made, with this version's tables."""
    runs = []
    for path in args.render:
        data = read_run(Path(path), args.kind, "pflash-proxy bench")
        if data is None:
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
