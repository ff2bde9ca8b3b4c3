"""Time the unit cutter (``compress/cuts.py``) on adversarial inputs at growing sizes: linear or not.

Each input is one pattern repeated to the size: a literal that never closes followed by many openers of its
kind (escaped where a plain one would close it), lines full of escaped quotes, one logical line continued with
backslash-newlines, long prose lines full of quotes. For each input and size it times what the segmenter asks
of ``cuts.py`` for one message (``LineTable.build``, ``raw_starts``, ``split_priority``; CPU time, best of
``--repeat``) and, for code, counts the bytes the literal pass scanned (``_literal_spans(work=...)``). Linear
growth: the time per MB and the bytes scanned per byte stay flat as the size grows 4x at each step.

    .venv/bin/python benchmarks/bench_cuts.py [--sizes 64K,256K,1M,4M] [--repeat 3]

Prints a markdown table (the one in ``benchmarks/reported/cuts-linear/README.md``).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pflash_proxy.compress import cuts  # noqa: E402
from pflash_proxy.compress.cuts import LineTable, raw_starts, split_priority  # noqa: E402
from pflash_proxy.compress.kinds import ContentKind  # noqa: E402

CODE, PROSE = ContentKind.CODE, ContentKind.PROSE
_PROSE = ("The harbour town woke slowly that winter; fishing boats sat in the mud at low tide. "
          "Railway timetables were a patchwork of local times kept by the sun. ")

# name -> (kind, head, repeated body): the head opens what never closes, the body repeats to the size
INPUTS = {
    "py: unclosed \"\"\", escaped \"\"\" after": (
        CODE, 'import os\ns = """never closed\n', 'def f(a, b):\n    return a \\"""b\n'),
    "py: unclosed ''', escaped ''' after": (
        CODE, "import os\ns = '''never closed\n", "def f(a, b):\n    return a \\'''b\n"),
    "py: one line continued, escaped quotes": (
        CODE, 'def f():\n    pass\ns = "', 'a \\" b \\\' c \\" d \\\n'),
    "py: 8 KB lines of escaped quotes": (
        CODE, "def f():\n    pass\n", 'x = "' + '\\" ' * 2730 + "\n"),
    "c: unclosed /*, many /* after": (
        CODE, "int a;\n/* never closed\n", "int f(void) { return g(1); } /* note\n"),
    "js: unclosed template, escaped ` after": (
        CODE, "const a = 1;\nconst s = `never closed\n", "let x = \\`tick\\` + f(1);\n"),
    "c: one line of escaped quotes": (
        CODE, "int a;\nint b;\nchar *s = \"", '\\" \\" \\" \\" '),
    "c: 8 KB lines, quotes and /*": (
        CODE, "int a;\nint b;\n", "f(\"" + '\\" \' /* ` ' * 1365 + ";\n"),
    "prose: unclosed quotes, /* and ` (as prose)": (
        PROSE, "Notes:\n\n", _PROSE + '"unclosed /* never ` and \\" again\n\n'),
    "prose: unclosed quotes, /* and ` (as code)": (
        CODE, "Notes:\n\n", _PROSE + '"unclosed /* never ` and \\" again\n\n'),
    "prose: the whole message one line of quotes": (
        PROSE, "", _PROSE + '"a \\" \'b ` /* '),
}


def build(head: str, body: str, size: int) -> str:
    text = head + body * ((size - len(head)) // len(body) + 1)
    return text[:size]


def cut_once(text: str, kind: ContentKind) -> tuple[float, int]:
    """CPU seconds for one message's cuts (fresh table), and the bytes its literal pass scanned (0: no pass).
    CPU time of this process, not wall time: the figures hold on a machine shared with other work."""
    work = [0]
    real = cuts._literal_spans
    cuts._literal_spans = lambda *a: real(*a, work=work)
    try:
        t0 = time.process_time()
        table = LineTable.build(text)
        starts = raw_starts(table, kind)
        split_priority(table, kind)
        dt = time.process_time() - t0
    finally:
        cuts._literal_spans = real
    assert len(starts) >= 1
    return dt, work[0]


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 2**10, "M": 2**20}.get(s[-1], 1)
    return int(float(s.rstrip("KM")) * mult)


def label(n: int) -> str:
    return f"{n // 2**20} MB" if n >= 2**20 else f"{n // 2**10} KB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64K,256K,1M,4M")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}; "
          f"best of {args.repeat}; CPU ms per size, then CPU ms per MB and literal-pass bytes scanned per byte\n")
    print("| input | kind | " + " | ".join(label(n) for n in sizes) + " | ms/MB " + " / ".join(label(n) for n in sizes)
          + " | scanned/byte |")
    print("|---|---|" + "---:|" * len(sizes) + "---|---|")
    worst_growth = 0.0
    for name, (kind, head, body) in INPUTS.items():
        ms, per_byte = [], []
        for n in sizes:
            text = build(head, body, n)
            runs = [cut_once(text, kind) for _ in range(args.repeat)]
            ms.append(min(r[0] for r in runs) * 1000)
            per_byte.append(runs[0][1] / len(text.encode()))
        per_mb = [m / (n / 2**20) for m, n in zip(ms, sizes)]
        worst_growth = max(worst_growth, per_mb[-1] / per_mb[0])
        scanned = "-" if not any(per_byte) else " / ".join(f"{b:.2f}" for b in per_byte)
        print(f"| {name} | {kind.value} | " + " | ".join(f"{m:,.1f}" for m in ms) + " | "
              + " / ".join(f"{p:,.0f}" for p in per_mb) + f" | {scanned} |", flush=True)
    print(f"\nlargest growth of ms/MB from {label(sizes[0])} to {label(sizes[-1])}: {worst_growth:.2f}x "
          f"(linear: ~1; quadratic: {sizes[-1] / sizes[0]:.0f}x)")


if __name__ == "__main__":
    main()
