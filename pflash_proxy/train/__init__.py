"""``pflash-proxy train``: the segment probe, the request probe and the scorer head for any GGUF drafter.

Everything is generated on this machine (``corpus``: structured text from the standard library, its
docstrings, WordNet; ``tasks``: questions with known evidence), read once by the drafter (``features``,
resumable), fitted in numpy (``fit``), written in the formats of ``docs/probes.md`` (``write``) and measured on
held-out examples against the model-free stages (``evaluate``). ``run`` ties the steps together.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("train", help="train the segment probe, request probe and scorer head for a drafter",
                       description=__doc__.split("\n")[0])
    p.add_argument("--drafter", required=True, help="the drafter GGUF the probes will read")
    p.add_argument("--out", required=True, help="output directory (files, metrics.json, resumable cache/)")
    p.add_argument("--examples", type=int, default=600, help="generated examples (15%% held out; default 600)")
    p.add_argument("--seed", type=int, default=20261130, help="corpus seed (the bench never uses it)")
    p.add_argument("--tap-block", type=int, default=None,
                   help="residual block to read (default: 7/12 of the depth, 14 for a 24-block drafter)")
    p.add_argument("--epochs", type=int, default=12, help="probe epochs (request probe: twice as many)")
    p.add_argument("--head-epochs", type=int, default=40, help="scorer head epochs (best held-out kept)")
    p.add_argument("--rank", type=int, default=64, help="scorer head rank r")
    p.add_argument("--ctx", type=int, default=8192, help="drafter context for the reading passes")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for the drafter")
    p.add_argument("--min-chars", type=int, default=3000, help="shortest generated document, characters")
    p.add_argument("--max-chars", type=int, default=9000, help="longest generated document, characters")
    p.add_argument("--budget", type=float, default=0.30, help="kept fraction for the held-out relevance metric")


def main(args: argparse.Namespace) -> int:
    from .run import TrainConfig, train

    drafter = Path(args.drafter)
    if not drafter.is_file():
        print(f"pflash-proxy train: drafter file {drafter} does not exist", file=sys.stderr)
        return 2
    if args.examples < 8 or not 0 < args.budget < 1 or args.min_chars > args.max_chars:
        print("pflash-proxy train: need --examples >= 8, 0 < --budget < 1 and --min-chars <= --max-chars",
              file=sys.stderr)
        return 2
    cfg = TrainConfig(drafter, Path(args.out), args.examples, args.seed, args.tap_block, args.epochs,
                      args.head_epochs, args.rank, args.ctx, args.threads, args.min_chars, args.max_chars,
                      args.budget)
    from pflash_proxy.drafter.runtime import DrafterError

    try:
        metrics = train(cfg)
    except (ValueError, OSError, DrafterError) as exc:  # DrafterError: e.g. the `drafter` extra is missing
        print(f"pflash-proxy train: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pflash-proxy train: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    json.dump(metrics, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
