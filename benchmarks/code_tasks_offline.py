"""Users'-words code tasks (``pflash_proxy/bench/cases/code_tasks.json``, the evals' cases), offline: the compress
package on each task's file read as Claude Code sends it (``N<TAB>line`` tool result after the task and the Read
call), ``approx_tokens`` counts, no llama-server. For tuning on the **dev** split only (``--split dev``, the
default); the held-out split is for the evals' own ``bench code-tasks`` run, once.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/code_tasks_offline.py [--cases PATH] [--threshold 2048] [-v]

Prints the gold definition kept whole per read-size bucket and the median kept fraction, and with ``-v`` each
miss (task id, gold, read tokens, kept fraction, the gold's best unit rank).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.pipeline import CompressionSettings

BUCKETS = ((0, 4096, "<4K"), (4096, 8192, "4-8K"), (8192, 16384, "8-16K"), (16384, 1 << 40, ">=16K"))


def site_dirs() -> list[str]:
    dirs = [p for p in sys.path if p.endswith("site-packages")]
    venv = Path(".venv/lib")
    if venv.exists():
        dirs += [str(p) for p in venv.glob("python3*/site-packages")]
    return dirs


def gold_span(text: str, gold: str) -> tuple[int, int] | None:
    found = []

    def walk(body: list[ast.stmt], cls: str | None) -> None:
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any((isinstance(d, ast.Name) and d.id == "overload")
                       or (isinstance(d, ast.Attribute) and d.attr == "overload") for d in n.decorator_list):
                    continue
                name = f"{cls}.{n.name}" if cls else n.name
                if name == gold:
                    start = n.decorator_list[0].lineno if n.decorator_list else n.lineno
                    found.append((start, n.end_lineno or n.lineno))
            elif isinstance(n, ast.ClassDef) and cls is None:
                walk(n.body, n.name)

    walk(ast.parse(text).body, None)
    return found[0] if len(found) == 1 else None


def messages_for(task: str, path: str, text: str) -> list[dict[str, object]]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    read = "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, 1))
    fp = f"/home/user/project/.venv/lib/python3.11/site-packages/{path}"
    return [{"role": "system", "content": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"role": "user", "content": task},
            {"role": "assistant", "content": f"I'll read {os.path.basename(path)} first.", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "Read",
                                                              "arguments": json.dumps({"file_path": fp})}}]},
            {"role": "tool", "tool_call_id": "t1", "content": read}]


def run(cases: Path, split: str, threshold: int, verbose: bool, comp: Compressor | None = None) -> dict[str, list]:
    data = json.loads(cases.read_text())
    dirs = site_dirs()
    comp = comp or Compressor(CompressionSettings(threshold=threshold))
    finder = RequestFinder()
    out: dict[str, list] = defaultdict(list)
    for c in data["cases"]:
        if c["split"] != split:
            continue
        src = next((Path(d) / c["path"] for d in dirs if (Path(d) / c["path"]).exists()), None)
        if src is None:
            out["missing"].append(c["id"])
            continue
        text = src.read_text(encoding="utf-8")
        span = gold_span(text, c["gold"])
        if span is None:
            out["unresolved"].append(c["id"])
            continue
        msgs = messages_for(c["task"], c["path"], text)
        tt = TokenizedText.from_text(str(msgs[3]["content"]))
        if tt.total_tokens < threshold:
            out["small"].append(c["id"])
            continue
        request = finder.find(msgs, 3, tt)
        o = comp.compress(tt, request, tt.total_tokens + 40, True, "tool", "4")
        gold_lines = tt.lines[span[0] - 1:span[1]]
        kept = o.mode != "compressed" or "".join(gold_lines).rstrip("\n") in o.text
        frac = o.served_message_tokens / tt.total_tokens if o.mode == "compressed" else 1.0
        bucket = next(b[2] for b in BUCKETS if b[0] <= tt.total_tokens < b[1])
        out[bucket].append((c["id"], kept, frac, o.mode))
        if verbose and not kept:
            a = o.analysis
            rank = None
            if a is not None:
                order = sorted(range(len(a.units)), key=lambda i: -a.scores[i])
                gold_units = [i for i, u in enumerate(a.units) if u.start_line < span[1] and u.end_line >= span[0]]
                rank = min(order.index(i) for i in gold_units) if gold_units else None
            print(f"  miss {c['id']} {c['kind']} {c['gold']} {tt.total_tokens} tok kept {frac:.2f} rank {rank}: "
                  f"{c['task'][:90]!r}")
    return out


def table(out: dict[str, list]) -> str:
    rows = ["| read size | gold whole | median kept | served whole |", "|---|---|---|---|"]
    allr = []
    for _, _, b in BUCKETS:
        r = out.get(b, [])
        allr += r
        if r:
            rows.append(f"| {b} | {sum(x[1] for x in r)}/{len(r)} | {statistics.median(x[2] for x in r):.2f} | "
                        f"{sum(x[3] != 'compressed' for x in r)} |")
    if allr:
        rows.append(f"| all | {sum(x[1] for x in allr)}/{len(allr)} | {statistics.median(x[2] for x in allr):.2f} | "
                    f"{sum(x[3] != 'compressed' for x in allr)} |")
    rows.append(f"\nmissing files {len(out.get('missing', []))}, unresolved {len(out.get('unresolved', []))}, "
                f"under the threshold {len(out.get('small', []))}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=Path, default=Path("pflash_proxy/bench/cases/code_tasks.json"))
    ap.add_argument("--split", default="dev")
    ap.add_argument("--threshold", type=int, default=2048)
    ap.add_argument("-v", action="store_true")
    opts = ap.parse_args()
    print(table(run(opts.cases, opts.split, opts.threshold, opts.v)))


if __name__ == "__main__":
    main()
