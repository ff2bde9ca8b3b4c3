"""The code-reads cases replayed through the compression pipeline in process: no proxy, no llama-server.

Usage: ``python benchmarks/code_reads_replay.py --split test --out DIR [--root TREE]``

``bench code-reads`` (``pflash_proxy/bench/code_reads/``) is the product measurement (real proxy, real token
counts); this replay gives the same cases' answer in seconds, for comparing two versions of the compression code
on one machine (``--root``: the source tree whose ``pflash_proxy.compress`` is measured, e.g. an older commit
unpacked with ``git archive``). Token counts are ``approx_tokens`` (bytes / 4), the scorer is ``lexical``.
1. Cases: ``generator.generate(split=...)`` over this interpreter's site-packages (``--cases FILE``: a JSON list
   written by an earlier run, so both versions read the same cases).
2. Each case's file in the three read shapes (Claude Code ``N<TAB>line``, opencode ``N: line`` inside
   ``<file>``, raw ``cat``), as a tool result whose request is the task and the call; compressed ``warm`` (a
   running conversation) and ``cold`` (no earlier turn: the flat gate applies), the prompt 1,500 tokens longer
   than the file (instructions and tools).
3. Measured: the function's lines (decorators through the last line, with the shape's line prefixes) in one
   piece in the served text; kept = served message tokens over the file's.
Writes ``DIR/replay-SPLIT.json`` and ``DIR/replay-SPLIT.md`` (function whole per kind x shape x variant, median
kept, modes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

KINDS = ("named", "qualified", "described")
SHAPES = ("claude", "opencode", "cat")


def shaped(lines: list[str], shape: str) -> str:
    if shape == "claude":
        return "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, 1))
    if shape == "opencode":
        return "<file>\n" + "\n".join(f"{n}: {line}" for n, line in enumerate(lines, 1)) + "\n</file>"
    return "\n".join(lines)


def replay(cases: list[dict], site: Path, cold: bool) -> list[dict]:
    from pflash_proxy.compress import Compressor, RequestSpec, TokenizedText

    comp = Compressor()
    out = []
    for c in cases:
        lines = (site / c["path"]).read_text(encoding="utf-8").rstrip("\n").split("\n")
        a, b = c["span"]
        for shape in SHAPES:
            body = shaped(lines, shape)
            gold = "\n".join(shaped(lines, shape).split("\n")[a - (0 if shape == "opencode" else 1):
                                                           b + (1 if shape == "opencode" else 0)])
            tt = TokenizedText.from_text(body)
            task = f"Read {Path(c['path']).name} and answer: {c['question']}"
            req = RequestSpec(f"{task}\nRead({json.dumps({'file_path': c['path']})})", 0, "tool-call")
            o = comp.compress(tt, req, tt.total_tokens + 1500, not cold, "tool", "4")
            out.append({"case": c["case_id"], "kind": c["kind"], "shape": shape, "variant": "cold" if cold else "warm",
                        "mode": o.mode, "whole": gold in o.text, "kept": o.served_message_tokens / tt.total_tokens})
    return out


def report(rows: list[dict], split: str) -> str:
    md = [f"# Code reads replayed in process ({split} split, lexical)", "",
          "| variant | kind | " + " | ".join(SHAPES) + " | median kept | served whole |", "|---|---|---|---|---|---|---|"]
    for variant in ("warm", "cold"):
        for kind in KINDS:
            rs = [r for r in rows if r["variant"] == variant and r["kind"] == kind]
            if not rs:
                continue
            cells = []
            for shape in SHAPES:
                s = [r for r in rs if r["shape"] == shape]
                cells.append(f"{sum(r['whole'] for r in s)}/{len(s)} ({100 * sum(r['whole'] for r in s) / len(s):.0f} %)")
            comp = [r["kept"] for r in rs if r["mode"] == "compressed"]
            med = f"{statistics.median(comp):.3f}" if comp else "-"
            md.append(f"| {variant} | {kind} | " + " | ".join(cells)
                      + f" | {med} | {sum(r['mode'] != 'compressed' for r in rs)}/{len(rs)} |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="train", choices=("train", "test", "all"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--cases", type=Path, help="the cases as JSON (written by an earlier run)")
    ap.add_argument("--site", type=Path)
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(here))
    from pflash_proxy.bench.code_reads.generator import generate, site_packages

    site = args.site or site_packages()
    if args.cases and args.cases.exists():
        cases = json.loads(args.cases.read_text())
    else:
        cases = [asdict(c) for c in generate(site, split=args.split)]
    sys.path.insert(0, str(args.root))  # the compression code measured
    for name in [m for m in sys.modules if m.startswith("pflash_proxy")]:
        del sys.modules[name]
    rows = replay(cases, site, False) + replay(cases, site, True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"replay-{args.split}.json").write_text(json.dumps({"cases": cases, "reads": rows}))
    text = report(rows, args.split)
    (args.out / f"replay-{args.split}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
