"""``python -m evals KIND [options]``: the relevance lab's command line, run from a checkout of the repository.

KIND is an eval on text people wrote (``ruler-qa``, ``code-tasks``, ``planted``, ``every-x``: ``evals/__init__``)
or the code-reads bench (``code-reads``: ``evals/code_reads``). The options a run through the proxy shares with
``pflash-proxy bench`` are the bench's own (``pflash_proxy.bench.add_run_options``); the lab's are added here. The
options, their defaults and the reports are what ``pflash-proxy bench KIND`` had for these kinds before they left
the package. The lab imports the product; the product never imports the lab (tests/test_layout.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pflash_proxy.bench import add_run_options

from evals import EVALS

KINDS = (*EVALS, "code-reads")
CODE_READS_SPLITS = ("test", "train", "all")
# the shared options' help, as it reads for the lab's kinds
HELP = {
    "scorers": "PFlash scorers to compare, comma-separated (default: lexical, and with --drafter auto for "
               "ruler-qa/planted/code-reads, head-attention for code-tasks/every-x)",
    "families": "ruler-qa: datasets squad,hotpotqa; planted: code,prose; code-tasks: the task kinds "
                "bug,how,why,change,mined",
    "lengths": "comma-separated token lengths (ruler-qa default 16384,32768,65536; planted 4096-65536)",
    "threshold": "PFlash admission threshold (default: ruler-qa 8192, the others 2048)",
    "out": "directory for the reports (default benchmarks/results/KIND, git-ignored)",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evals",
                                description="The relevance lab: evals on text people wrote and the code-reads "
                                            "bench, through the proxy against a real llama-server; see "
                                            "docs/results.md")
    p.add_argument("kind", choices=KINDS)
    add_run_options(p)
    for action in p._actions:
        if action.dest in HELP:
            action.help = HELP[action.dest]
    p.add_argument("--split", choices=("dev", "held-out", "held-out-2", "held-out-3", "held-out-4", "spent",
                                         *CODE_READS_SPLITS),
                   default=None,
                   help="the evals: dev (default, tune on it) or held-out (run once, at the end); code-tasks and "
                        "every-x also held-out-2 (tasks and wordings written later: code-tasks over packages in "
                        "neither split, every-x over the held-out files), code-tasks also held-out-3 and held-out-4 "
                        "(evals/cases/code_tasks_held_out_3.json and _4.json; held-out-4's packages: "
                        "scripts/eval-packages.sh, then --site its directory), ruler-qa also held-out-2 (questions "
                        "over documents no earlier run used, for --followup), code-tasks also spent (dev and the held-out "
                        "splits already run, held-out to held-out-3, as one set to tune on); code-reads: test/train/all "
                        "(default all)")
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
    p.add_argument("--site", type=Path, help="code-reads, code-tasks, every-x: the site-packages to read from "
                                             "(default this interpreter's)")
    p.add_argument("--concurrency", type=int, default=4,
                   help="code-reads: reads in flight together (each its own session; default 4)")
    p.add_argument("--drafter-limit", type=int, default=0,
                   help="code-reads: drafter scorers only on the first N cases (0 = all)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kind == "code-reads":
        from evals.code_reads.run import main as code_reads

        args.split = args.split or "all"
        args.shapes = args.shapes or "claude,opencode,cat"
        args.variants = args.variants or "warm,cold"
        if args.split not in CODE_READS_SPLITS:
            print(f"evals: code-reads splits are test, train or all (got {args.split})", file=sys.stderr)
            return 2
        return code_reads(args)
    from evals import main as evals

    return evals(args)


if __name__ == "__main__":
    raise SystemExit(main())
