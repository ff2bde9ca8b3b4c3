"""What the definitions named in omission markers cost of the budget.

Usage: ``python benchmarks/omission_names.py [--out FILE.md]`` (model-free, a few seconds).

Cases: the agent_reads files (``benchmarks/agent_reads/cases.py``) read in the three client shapes (Claude Code
``N<TAB>line``, opencode ``N: line``, raw ``cat``), each with its question as the tool call's task, and the pointed
code cases of ``benchmarks/flat_gate`` (4K, 16K, 32K, both splits). Each is compressed by the real pipeline
(lexical, the default curve, in a running conversation so nothing is served whole) and measured from the served
text: the tokens (``approx_tokens``) of the `` — names`` parts of its markers over the tokens of the kept units.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "agent_reads"))
sys.path.insert(0, str(ROOT / "benchmarks" / "flat_gate"))

from pflash_proxy.compress import Compressor, RequestSpec, TokenizedText, approx_tokens  # noqa: E402
from pflash_proxy.compress.rewrite import MARKER_RE  # noqa: E402


def shaped(text: str, shape: str) -> str:
    lines = text.rstrip("\n").split("\n")
    if shape == "claude":
        return "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, 1))
    if shape == "opencode":
        return "<file>\n" + "\n".join(f"{n}: {line}" for n, line in enumerate(lines, 1)) + "\n</file>"
    return "\n".join(lines)


def cases() -> list[tuple[str, str, str]]:
    """(label, message, question)"""
    from cases import CASES, load  # agent_reads
    import gate_cases

    out = []
    for case in CASES:
        got = load(case)
        if got is None:
            continue
        for shape in ("claude", "opencode", "cat"):
            out.append((f"agent-{shape}", shaped(got[0], shape), case.question))
    for which in ("train", "test"):
        for target in (4096, 16384, 32768):
            for i in range(12):
                c = gate_cases.make_case(which, "pointed", "code", target, i)
                if c is not None:
                    text = c.messages[0]["content"]
                    body, _, question = text.rpartition("\n\n")
                    out.append((f"docs-{target // 1024}k", body, question))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    comp = Compressor()
    rows: dict[str, list[tuple[float, int, int]]] = {}
    for label, text, question in cases():
        tt = TokenizedText.from_text(text)
        out = comp.compress(tt, RequestSpec(question, 0, "tool-call"), tt.total_tokens + 1500, True, "tool", "4")
        if out.mode != "compressed":
            continue
        names = [m.group(3) for line in out.text.split("\n") if (m := re.match(MARKER_RE, line)) and m.group(3)]
        cost = sum(approx_tokens(f" — {n}") for n in names)
        rows.setdefault(label, []).append((cost / max(out.kept_tokens, 1), cost, out.kept_tokens))
    md = ["| cases | n | names' tokens / kept tokens: median | mean | max | all cases together |",
          "|---|---|---|---|---|---|"]
    for label, rs in sorted(rows.items()):
        md.append(f"| {label} | {len(rs)} | {statistics.median(r[0] for r in rs):.2%} | "
                  f"{statistics.mean(r[0] for r in rs):.2%} | {max(r[0] for r in rs):.2%} | "
                  f"{sum(r[1] for r in rs) / sum(r[2] for r in rs):.2%} |")
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
