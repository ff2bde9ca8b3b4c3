"""Which scorer keeps the asked-about function whole: replayed on what ``run.py --dump`` recorded, no drafter pass.

Usage: ``python benchmarks/agent_reads/study.py DUMP.pkl [--out FILE.md]`` where the dump comes from
``run.py --scorer head-attention --dump DUMP.pkl`` (the recording keeps, per client and case, the tokenized tool
result, the request, the units, the pinned and named units, the gutter, and the head's and attention's unit
scores of the one drafter pass).

1. For each record: the text behind the line numbers (``gutter.bare_text``, what the scorers read), its
   reference links, and the lexical scores (``LexicalScorer``: ``--scorer lexical``; with hops: the lexical
   half of ``--scorer hybrid``).
2. Candidates, each the scores a scorer of the product would give: ``head-attention`` as served (head 0.3,
   attention 0.7, reference hops; must equal the recorded scores: a sanity check), ``attention``, ``lexical``,
   ``hybrid`` (lexical with hops 0.3, attention 0.7), and ``head-attention`` fused with lexical-with-hops at
   lexical weights 0.2, 0.3 (``HYBRID_LEXICAL_WEIGHT``, chosen on the 8K tuning set) and 0.5.
3. Each candidate's scores are replayed through the real pipeline (``Compressor.compress`` with stages 1-3 from
   the record: budget, named and first-choice units, spread test, rewrite): the function's numbered lines in one
   piece in the served text (``gold``), kept = served tokens of the kept units over the message's.
4. Table per client: function whole (named / described), median kept; and whether the replay of the recorded
   scores agrees with the live run (mode and gold).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import CASES, load  # noqa: E402
from run import gold_block  # noqa: E402
from pflash_proxy.compress.fusion import HYBRID_LEXICAL_WEIGHT, hybrid_lexical, shares  # noqa: E402
from pflash_proxy.compress.gutter import bare_text, find_gutter  # noqa: E402
from pflash_proxy.compress.links import ReferenceLinks, propagate  # noqa: E402
from pflash_proxy.compress.named import definition_blocks  # noqa: E402
from pflash_proxy.compress.pipeline import Analysis, Compressor  # noqa: E402
from pflash_proxy.compress.scores import LexicalScorer  # noqa: E402

HEAD_WEIGHT = 0.3  # drafter/joint.py


def parts(r: dict) -> dict[str, np.ndarray]:
    """Step 1: the per-unit scores each candidate is built from."""
    tt, units = r["tt"], r["units"]
    g = find_gutter(tt.lines)
    work = tt if g is None else bare_text(tt, g)
    q = r["request"].text
    out = {"head": np.asarray(r["head"], np.float64), "attention": np.asarray(r["attention"], np.float64)}
    for name, scorer in (("lexical", LexicalScorer()), ("lexical-hops", hybrid_lexical())):
        out[name] = np.asarray(scorer.score(scorer.represent(work, units), q), np.float64)
    out["links"] = ReferenceLinks.build(work, units)  # type: ignore[assignment]
    out["tokens"] = np.asarray([u.tokens for u in units])
    return out


def candidates() -> dict[str, Callable[[dict], np.ndarray]]:
    """Step 2."""
    def hops(p: dict, s: np.ndarray) -> np.ndarray:
        return propagate(p["links"], s, p["tokens"])

    def joint(p: dict) -> np.ndarray:
        return HEAD_WEIGHT * shares(p["head"]) + (1 - HEAD_WEIGHT) * shares(p["attention"])

    out: dict[str, Callable[[dict], np.ndarray]] = {
        "head-attention": lambda p: hops(p, joint(p)),
        "attention": lambda p: hops(p, p["attention"]),
        "lexical": lambda p: p["lexical"],
        "hybrid (lexical-hops 0.3 + attention)": lambda p: hops(
            p, HYBRID_LEXICAL_WEIGHT * shares(p["lexical-hops"]) + (1 - HYBRID_LEXICAL_WEIGHT) * shares(p["attention"])),
    }
    for w in (0.2, HYBRID_LEXICAL_WEIGHT, 0.5):
        out[f"head-attention + lexical-hops {w}"] = (
            lambda p, w=w: hops(p, w * shares(p["lexical-hops"]) + (1 - w) * joint(p)))
    return out


def replay(r: dict, scores: np.ndarray, text: str, span: tuple[int, int]) -> tuple[str, bool, float]:
    """Step 3: (mode, function whole, kept fraction) of the pipeline with these scores."""
    comp = Compressor(r["settings"])
    g = find_gutter(r["tt"].lines)
    work = r["tt"] if g is None else bare_text(r["tt"], g)
    blocks = tuple(definition_blocks(work, r["units"], 2 * r["settings"].max_segment))  # as the pipeline's step 2
    analysis = Analysis(r["units"], r["pinned"], None, np.asarray(scores, np.float64), {},  # type: ignore[arg-type]
                        r["gutter"], r["named"], blocks)
    out = comp.compress(r["tt"], r["request"], r["prompt_tokens"], r["in_conversation"], r["source"], r["label"],
                        analysis=analysis)
    kept = out.served_message_tokens / max(out.message_tokens, 1) if out.mode == "compressed" else 1.0
    return out.mode, gold_block(text, span, r["client"]) in out.text, kept


def why(r: dict, scores: np.ndarray, span: tuple[int, int]) -> str:
    """The units overlapping the function (1-based inclusive lines ``span``): rank by density, tokens."""
    toks = np.asarray([u.tokens for u in r["units"]], np.float64)
    dens = np.asarray(scores, np.float64) / np.maximum(toks, 1)
    rank = np.empty(len(dens), int)
    rank[np.argsort(-dens, kind="stable")] = np.arange(1, len(dens) + 1)
    mine = [u for u in r["units"] if u.start_line < span[1] and u.end_line > span[0] - 1]
    return (f"{len(r['units'])} units, function in " + ", ".join(f"#{rank[u.index]}/{u.tokens}t" for u in mine)
            + (", named" if any(u.index in r["named"] for u in mine) else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--why", action="store_true", help="list the misses with the function's units' ranks")
    args = ap.parse_args()
    records = pickle.loads(args.dump.read_bytes())
    cases = {c.name: c for c in CASES}
    loaded = {name: load(c) for name, c in cases.items()}
    cands = candidates()
    rows: dict[tuple[str, str], list[tuple[str, bool, float]]] = defaultdict(list)
    agree = disagree = 0
    misses: list[str] = []
    for r in records:
        case = cases[r["case"]]
        text, span = loaded[r["case"]]  # type: ignore[misc]
        p = parts(r)
        live = replay(r, r["scores"], text, span)
        agree += live[0] == r["mode"]
        disagree += live[0] != r["mode"]
        for name, fn in cands.items():
            s = fn(p)
            if name == "head-attention" and not np.allclose(s, r["scores"], rtol=1e-6, atol=1e-9):
                print(f"warning: {r['client']} {r['case']}: head-attention rebuilt differs from the recorded scores")
            mode, gold, kept = replay(r, s, text, span)
            rows[(r["client"], name)].append((case.style, gold, kept))
            if not gold and args.why:
                misses.append(f"- {r['client']} {case.function} ({case.style}), {name}: {why(r, s, span)}")
    clients = sorted({c for c, _ in rows})
    out = [f"- records: {len(records)} from `{args.dump.name}`; replays of the recorded scores agreeing with the "
           f"live mode: {agree}/{agree + disagree}\n",
           "| client | candidate | function whole | named | described | median kept |", "|---|---|---|---|---|---|"]
    for client in clients:
        for name in cands:
            rs = rows[(client, name)]
            named = [g for s, g, _ in rs if s == "named"]
            desc = [g for s, g, _ in rs if s == "described"]
            whole = sum(g for _, g, _ in rs)
            out.append(f"| {client} | {name} | {whole}/{len(rs)} ({100 * whole / max(len(rs), 1):.0f} %) | "
                       f"{sum(named)}/{len(named)} | {sum(desc)}/{len(desc)} | "
                       f"{statistics.median(k for *_, k in rs):.3f} |")
    if misses:
        out += ["", "Function not whole (its units: rank by density of the candidate's scores / tokens):", *misses]
    md = "\n".join(out) + "\n"
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)


if __name__ == "__main__":
    main()
