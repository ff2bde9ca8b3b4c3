"""The code-reads cases replayed through the compression pipeline in process: no proxy, no llama-server.

Usage: ``python benchmarks/code_reads_replay.py --split train --out DIR [--cases FILE] [--root TREE]``

``bench code-reads`` (``pflash_proxy/bench/code_reads/``) is the product measurement (real proxy, real token
counts); this replay gives the same cases' answer in seconds (tuning on the train split, comparing two versions
of the compression code on one machine: ``--root`` is the source tree whose ``pflash_proxy.compress`` is measured,
e.g. an older commit unpacked with ``git archive``). Token counts are ``approx_tokens`` (bytes / 4), the scorer is
``lexical`` with the settings ``serve`` gives it (``--threshold``, the registry's flat thresholds).
1. Cases: ``generator.generate(split=...)`` over this interpreter's site-packages (``--site``; ``--cases FILE``: a
   JSON list written by an earlier run, so both versions read the same cases; written there when missing).
2. Each case's file as the bench's three clients send it (``run.render``: Claude Code ``N<TAB>line``, opencode
   ``N: line`` in its wrapper, raw ``cat``), in the bench's request (``run.request``) parsed by the route's
   dialect; the request found by ``RequestFinder`` as the proxy finds it; the prompt is the read plus the
   approximate tokens of everything else in the body (system line, task, call, tools) and ``TEMPLATE`` tokens
   a message, as in the bench, where nothing is cached yet.
3. Compressed ``warm`` (a running conversation) and ``cold`` (no earlier turn: the flat gate applies), then landed
   on the budget as the proxy's stage does (``CompressStage._land_on_budget``, ``pipeline.Landing``: the served
   text counted, the selection re-run with the error taken off while it is off the accepted band; a tree from
   before ``Landing``: its rule, within 1.5 % either side).
4. Measured: the function's lines as the shape prints them (``run.gold_block``) in one piece in the served text;
   kept = served message tokens over the message's; served over budget.
Writes ``DIR/replay-SPLIT.json`` (cases and reads) and ``DIR/replay-SPLIT.md`` (function whole per kind x shape x
variant, median kept, served whole, and the served/budget quantiles).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

KINDS = ("named", "qualified", "described")
SHAPES = ("claude", "opencode", "cat")
TEMPLATE = 8  # tokens the chat template adds around each message (role markers)
ROUTES = {"claude": "/v1/messages", "opencode": "/v1/chat/completions", "cat": "/v1/responses"}


def _land(comp: Any, tt: Any, req: Any, prompt: int, warm: bool, out: Any) -> tuple[Any, int]:
    """Step 3: ``CompressStage._land_on_budget`` with approximate counts."""
    from pflash_proxy.compress import pipeline
    from pflash_proxy.compress.text import approx_line_tokens, split_lines
    from pflash_proxy.stages.compress import _BUDGET_ROUNDS

    def count(text: str) -> int:  # the served text as the message's lines were counted (bytes / 4 a line)
        return sum(approx_line_tokens(split_lines(text)))

    Landing = getattr(pipeline, "Landing", None) or _OldLanding  # a tree from before Landing: its ±1.5 % rule
    landing = Landing(out.budget_tokens, (out, count(out.text)))
    for _ in range(_BUDGET_ROUNDS):
        adjust = landing.next_adjust()
        if adjust is None:
            break
        retry = comp.compress(tt, req, prompt, warm, "tool", "4", budget_adjust=adjust, analysis=out.analysis)
        if retry.mode != "compressed":
            break
        landing.offer(retry, count(retry.text))
    return landing.best


class _OldLanding:
    """The stage's landing before ``pipeline.Landing``: accepted within 1.5 % either side, closest kept."""

    def __init__(self, target: int, best: tuple[Any, int]) -> None:
        self.target, self.best, self.adjust = target, best, 0

    def next_adjust(self) -> int | None:
        error = self.best[1] - self.target
        if abs(error) <= 0.015 * self.target:
            return None
        self.adjust += error
        return self.adjust

    def offer(self, outcome: Any, count: int) -> None:
        if abs(count - self.target) < abs(self.best[1] - self.target):
            self.best = (outcome, count)
        else:
            self.adjust -= (self.best[1] - self.target) // 2


def replay(cases: list[dict], site: Path, threshold: int, kinds: tuple[str, ...] = KINDS) -> list[dict]:
    from pflash_proxy.bench.code_reads.generator import CodeCase
    from pflash_proxy.bench.code_reads.run import WORKDIR, gold_block, render, request
    from pflash_proxy.compress import Compressor, CompressionSettings, TokenizedText
    from pflash_proxy.compress.request import RequestFinder, message_text
    from pflash_proxy.compress.text import approx_tokens
    from pflash_proxy.dialects.registry import BY_PATH
    from pflash_proxy.stages.scorers import default_spread

    comp = Compressor(CompressionSettings(threshold=threshold, fallback_spread=default_spread("lexical")))
    finder = RequestFinder()
    out = []
    for c in cases:
        if c["kind"] not in kinds:
            continue
        case = CodeCase(**c)
        text = (site / c["path"]).read_text(encoding="utf-8")
        for shape in SHAPES:
            tool_text = render(text, shape, f"{WORKDIR}/{case.path}")
            _, body, _ = request(shape, case, tool_text, "replay", True)
            messages = BY_PATH[ROUTES[shape]]().parse(body).messages
            idx = max(i for i, m in enumerate(messages) if m.get("role") == "tool")
            tt = TokenizedText.from_text(message_text(messages[idx]))
            rest = [message_text(m) for i, m in enumerate(messages) if i != idx]
            rest += [c["function"]["name"] + c["function"]["arguments"] for m in messages
                     for c in m.get("tool_calls") or ()]
            prompt = (tt.total_tokens + approx_tokens("\n".join(rest) + json.dumps(body.get("tools", [])))
                      + TEMPLATE * len(messages))
            req = finder.find(messages, idx, tt)
            gold = gold_block(text, case.span, shape)
            for variant in ("warm", "cold"):
                o = comp.compress(tt, req, prompt, variant == "warm", "tool", "4")
                served, budget = tt.total_tokens, o.budget_tokens
                if o.mode == "compressed":
                    o, served = _land(comp, tt, req, prompt, variant == "warm", o)
                out.append({"case": c["case_id"], "kind": c["kind"], "shared": c.get("shared", False),
                            "shape": shape, "variant": variant, "mode": o.mode, "whole": gold in o.text,
                            "tokens": tt.total_tokens, "budget": budget, "served": served,
                            "kept": served / tt.total_tokens, "reason": o.reason})
    return out


def _q(xs: list[float], n: int = 10) -> str:
    if len(xs) < 2:
        return "-"
    qs = statistics.quantiles(xs, n=n)
    return f"{min(xs):.3f} / {qs[0]:.3f} / {statistics.median(xs):.3f} / {qs[-1]:.3f} / {max(xs):.3f}"


def report(rows: list[dict], split: str) -> str:
    md = [f"# Code reads replayed in process ({split} split, lexical)", "",
          "Cell: function whole · median kept fraction (served message tokens / message tokens; 1.0 when served "
          "whole).", "",
          "| variant | kind | " + " | ".join(SHAPES) + " | served whole |", "|---|---|---|---|---|---|"]
    groups = [(k, lambda r, k=k: r["kind"] == k) for k in KINDS]
    groups.insert(2, ("qualified: dunder/shared", lambda r: r["kind"] == "qualified" and r["shared"]))
    groups.append(("all", lambda r: True))
    for variant in ("warm", "cold"):
        for label, pick in groups:
            rs = [r for r in rows if r["variant"] == variant and pick(r)]
            if not rs:
                continue
            cells = []
            for shape in SHAPES:
                s = [r for r in rs if r["shape"] == shape]
                w = sum(r["whole"] for r in s)
                cells.append(f"{w}/{len(s)} ({100 * w / len(s):.0f} %) · {statistics.median(r['kept'] for r in s):.3f}")
            md.append(f"| {variant} | {label} | " + " | ".join(cells)
                      + f" | {sum(r['mode'] != 'compressed' for r in rs)}/{len(rs)} |")
    comp = [r for r in rows if r["mode"] == "compressed"]
    md += ["", "Compressed reads: min / p10 / median / p90 / max", "",
           f"- served / budget: {_q([r['served'] / r['budget'] for r in comp])}",
           f"- budget / message: {_q([r['budget'] / r['tokens'] for r in comp])}",
           f"- over budget: {sum(r['served'] > r['budget'] for r in comp)}/{len(comp)}"]
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="train", choices=("train", "test", "all"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--cases", type=Path, help="the cases as JSON (written by an earlier run; written when missing)")
    ap.add_argument("--site", type=Path)
    ap.add_argument("--threshold", type=int, default=2048)
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(here))
    from pflash_proxy.bench.code_reads.generator import generate, site_packages

    site = args.site or site_packages()
    if args.cases and args.cases.exists():
        cases = json.loads(args.cases.read_text())
    else:
        cases = [asdict(c) for c in generate(site, split=args.split)]
        if args.cases:
            args.cases.write_text(json.dumps(cases))
    sys.path.insert(0, str(args.root))  # the compression code measured
    for name in [m for m in sys.modules if m.startswith("pflash_proxy")]:
        del sys.modules[name]
    rows = replay(cases, site, args.threshold, tuple(args.kinds.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"replay-{args.split}.json").write_text(json.dumps({"cases": cases, "reads": rows}))
    text = report(rows, args.split)
    (args.out / f"replay-{args.split}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
