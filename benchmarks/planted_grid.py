"""Planted literal facts asked word for word, the full grid (issue 48): code and prose, 4K-64K tokens, the fact at
the start, middle or end, the question after the paste, before it, or in a message of its own; three facts per
cell. Offline: the compress package with the embedded default (``lexical``), ``approx_tokens`` counts, threshold
1024. Prints one table: facts kept per cell, and the median kept fraction.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/planted_grid.py [--sizes 4096,8192,...] [--asks after,before]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.pipeline import CompressionSettings

sys.path.insert(0, ".")
from tests.compress.planted import FACTS, messages, planted  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192,16384,32768,65536")
    ap.add_argument("--asks", default="after,before,message")
    opts = ap.parse_args()
    settings = CompressionSettings(threshold=1024)
    comp = Compressor(settings)
    finder = RequestFinder(settings.query_pin)
    print("| kind | ask | size | start | middle | end | median kept |")
    print("|---|---|---|---|---|---|---|")
    total = kept_all = 0
    for kind in ("code", "prose"):
        for ask in opts.asks.split(","):
            for size in map(int, opts.sizes.split(",")):
                cells, fractions = [], []
                for where in ("start", "middle", "end"):
                    kept = 0
                    for fact in range(len(FACTS)):
                        case = planted(kind, size, where, fact)  # type: ignore[arg-type]
                        msgs, idx = messages(case, ask)  # type: ignore[arg-type]
                        text = str(msgs[idx]["content"])
                        tt = TokenizedText.from_text(text)
                        out = comp.compress(tt, finder.find(msgs, idx, tt), tt.total_tokens, False, "paste")
                        kept += case.fact in out.text
                        fractions.append(out.served_message_tokens / tt.total_tokens)
                    cells.append(f"{kept}/{len(FACTS)}")
                    total += len(FACTS)
                    kept_all += kept
                print(f"| {kind} | {ask} | {size} | {' | '.join(cells)} | {statistics.median(fractions):.2f} |",
                      flush=True)
    print(f"\nkept {kept_all}/{total}")


if __name__ == "__main__":
    main()
