"""Bookkeeping cost of the compression stages per 100K tokens of message.

Times segment, represent (lexical reps), score, select (budget + overhead rounds),
spread and rewrite on ~100K-token synthetic messages (prose, Python code, JSON
records), token counts from ``approx_line_tokens``.  Prints the median over
``--repeat`` runs of each stage, scaled to ms per 100K tokens.

    .venv/bin/python benchmarks/bench_bookkeeping.py [--tokens 100000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pflash_proxy.compress import CompressionSettings, Compressor, RequestSpec, TokenizedText  # noqa: E402

PROSE = [
    "The harbour town woke slowly that winter; fishing boats sat in the mud at low tide.",
    "Railway timetables in the nineteenth century were a patchwork of local times kept by the sun.",
    "Sourdough depends on a stable culture of wild yeast and lactic acid bacteria fed at intervals.",
    "Glaciers carve valleys into a U shape and their meltwater turns mountain lakes turquoise.",
    "Migratory birds navigate by the magnetic field, the sun and the pattern of the stars.",
]


def synth(kind: str, tokens: int) -> str:
    parts, n, i = [], 0, 0
    if kind == "code":
        import collections, functools, textwrap, json.decoder as jd  # noqa: E401
        src = "".join(inspect.getsource(m) for m in (collections, functools, textwrap, jd))
        while n < tokens * 4:
            parts.append(src.replace("def ", f"def v{i}_"))
            n += len(src)
            i += 1
        return "".join(parts)[: tokens * 4].rsplit("\n", 1)[0] + "\n"
    while n < tokens * 4:
        if kind == "records":
            line = json.dumps({"id": i, "user": f"user{i % 97}", "event": ["login", "upload", "error"][i % 3],
                               "detail": PROSE[i % 5]}) + "\n"
        else:
            line = " ".join(PROSE[(i + k) % 5] for k in range(3)) + f" (part {i})\n" + ("\n" if i % 3 == 2 else "")
        parts.append(line)
        n += len(line)
        i += 1
    return "".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    comp = Compressor(CompressionSettings())
    for kind in ("prose", "code", "records"):
        tt = TokenizedText.from_text(synth(kind, args.tokens))
        req = RequestSpec("which part mentions glaciers and the vault combination", 512, "message-tail")
        runs = []
        for _ in range(args.repeat + 1):
            out = comp.compress(tt, req, tt.total_tokens + 500, True, "paste", "1")
            assert out.mode == "compressed", out.reason
            runs.append(out.stage_ms)
        runs = runs[1:]  # first run warms imports and caches
        scale = 100_000 / tt.total_tokens
        med = {k: statistics.median(r[k] for r in runs) * scale for k in runs[0]}
        total = sum(med.values())
        rest = total - med.get("represent", 0.0)
        stages = " ".join(f"{k}={v:.1f}" for k, v in med.items())
        print(f"{kind:8s} {tt.total_tokens:>7,} tokens {len(tt.lines):>6,} lines {out.units_in:>5} units | "
              f"ms/100K: {stages} | total={total:.1f} (without represent {rest:.1f})")


if __name__ == "__main__":
    main()
