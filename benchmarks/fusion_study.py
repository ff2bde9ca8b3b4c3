"""Which fusion of scorers keeps the most gold: replayed on recorded analyses, no drafter pass.

Usage: ``python benchmarks/fusion_study.py ANALYSES.pkl [--out FILE.md]`` where the file comes from
``bench quality --dump-analyses ANALYSES.pkl`` with several ``--scorers`` rows (e.g. lexical, attention, head).

1. Load the records; group them by case; each row's scores are over the same units (the bench's segmenter is
   the structural one for every row; a case whose rows disagree on the units is skipped and counted).
2. Candidates: every recorded row alone (the replay must agree with the bench's own modes: a sanity check),
   and fusions of two or three rows: ``shares`` (``w * s_a / sum(s_a) + ...``, what ``FusedScorer`` does) and
   ``max`` (the larger of the rows' shares: a unit that one scorer finds decisive stays decisive).
3. Each candidate's scores are replayed through the real pipeline (``analyses.replay``): budget, spread test,
   rewrite; gold checked in the served text.
   With ``--links`` every row is also replayed with reference hops (``compress/links.py``) as ``ROW+links``;
   ``--singles`` leaves the fusions out.
4. Table: main families' gold kept whole (all, and per family), how many main cases the flat-relevance fallback
   served whole (their gold is kept by not compressing: a candidate that wins that way buys no speed), the gold
   found in messages that were compressed, median kept fraction, aggregation served whole.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pflash_proxy.bench import analyses  # noqa: E402
from pflash_proxy.compress.fusion import hybrid_lexical, shares  # noqa: E402
from pflash_proxy.compress.links import ReferenceLinks, propagate  # noqa: E402

Fuse = Callable[[list[np.ndarray]], np.ndarray]
LEXICAL_VARIANTS = {"lexical-hops": hybrid_lexical()}  # the lexical half of --scorer hybrid


def weighted(ws: tuple[float, ...]) -> Fuse:
    return lambda rows: sum(w * shares(r) for w, r in zip(ws, rows))


def maxed(rows: list[np.ndarray]) -> np.ndarray:
    return np.max([shares(r) for r in rows], axis=0)


def peaked(s: np.ndarray, tokens: np.ndarray, q: float) -> np.ndarray:
    """A row's density above its ``q`` quantile, as unit mass: the same ranking on top, the background gone."""
    d = np.maximum(np.asarray(s, np.float64), 0.0) / np.maximum(tokens, 1)
    return np.maximum(d - np.quantile(d, q), 0.0) * tokens


def candidates(names: list[str], singles: bool = False) -> list[tuple[str, list[str], Fuse]]:
    out: list[tuple[str, list[str], Fuse]] = [(n, [n], lambda rows: rows[0]) for n in names]
    if singles:
        return out
    for n in names:
        for q in (0.5, 0.9):
            out.append((f"{n} above its q{int(q * 100)}", [n, "#tokens"],
                        lambda rows, q=q: peaked(rows[0], rows[1], q)))
    for a, b in itertools.combinations(names, 2):
        for w in (0.3, 0.5, 0.7):
            out.append((f"shares {w:.1f}·{a} + {1 - w:.1f}·{b}", [a, b], weighted((w, 1 - w))))
        out.append((f"max({a}, {b})", [a, b], maxed))
    for trio in itertools.combinations(names, 3):
        out.append((f"shares ⅓ each ({', '.join(trio)})", list(trio), weighted((1 / 3,) * 3)))
        out.append((f"max({', '.join(trio)})", list(trio), maxed))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("analyses", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--links", action="store_true",
                    help="add every recorded row with reference hops (compress/links.py) as a row 'ROW+links'")
    ap.add_argument("--singles", action="store_true", help="each row alone: no fusions")
    args = ap.parse_args()
    recs, cases = analyses.load(args.analyses)
    by_case: dict[str, dict[str, analyses.Analysed]] = defaultdict(dict)
    for r in recs:
        by_case[r.case_id][r.row.removeprefix("pflash-")] = r
    for per_row in by_case.values():  # lexical variants cost milliseconds: computed here, not recorded
        base = next(iter(per_row.values()))
        for name, scorer in LEXICAL_VARIANTS.items():
            per_row[name] = replace(base, row=name, scores=scorer.score(scorer.represent(base.tt, base.units),
                                                                        base.request.text))
        if args.links:
            links = ReferenceLinks.build(base.tt, base.units)
            toks = np.array([u.tokens for u in base.units], np.float64)
            for name, rec in list(per_row.items()):
                per_row[name + "+links"] = replace(rec, row=name + "+links",
                                                   scores=propagate(links, rec.scores, toks))
    names = sorted({n for rows in by_case.values() for n in rows})
    skipped = [c for c, rows in by_case.items()
               if len({tuple((u.start_line, u.end_line) for u in r.units) for r in rows.values()}) > 1]
    families = sorted({cases[c].family for c in by_case if not cases[c].negative_control})
    head = ["candidate", "main gold", "served flat", "gold, compressed", "median kept", "aggregation whole", *families]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    mismatches = 0
    for label, rows, fuse in candidates(names, args.singles):
        got: dict[str, list[bool]] = defaultdict(list)
        kept, agg, flat, found = [], [], 0, 0
        # a recorded row alone must replay to the bench's own mode; derived rows' modes are not recorded
        recorded = len(rows) == 1 and rows[0] not in LEXICAL_VARIANTS and not rows[0].endswith("+links")
        for cid, per_row in sorted(by_case.items()):
            if cid in skipped or any(n not in per_row for n in rows if n != "#tokens"):
                continue
            case = cases[cid]
            base = per_row[rows[0]]
            toks = np.array([u.tokens for u in base.units], np.float64)
            res = analyses.replay(base, case, fuse([toks if n == "#tokens" else per_row[n].scores for n in rows]))
            if recorded and res.mode != base.mode:
                mismatches += 1
            if case.negative_control:
                agg.append(res.all_gold)
                continue
            got[case.family].append(res.all_gold)
            kept.append(res.kept_fraction)
            flat += res.mode == "full-flat"
            found += res.mode == "compressed" and res.all_gold
        total = sum(sum(v) for v in got.values()), sum(len(v) for v in got.values())
        med = f"{statistics.median(kept):.3f}" if kept else "–"
        cells = [label, f"{total[0]}/{total[1]}", str(flat), str(found), med,
                 f"{sum(agg)}/{len(agg)}", *(f"{sum(got[f])}/{len(got[f])}" for f in families)]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"records: {len(recs)} from {args.analyses.name}; cases {len(by_case)}; rows {', '.join(names)}",
             f"cases skipped (rows with different units): {len(skipped)}; single-row replays whose mode differs "
             f"from the bench's: {mismatches}"]
    text = "\n".join([*(f"- {n}" for n in notes), "", *lines]) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
