"""Held-out metrics of the trained files, read back through the proxy's own loaders and stages.

1. Boundaries: the real ``ProbeSegmenter`` on the segment probe's logits gives unit start lines; so does the
   model-free ``UnitSegmenter`` on the same text. Precision, recall and F1 against the structural starts, every
   start (gold and predicted) moved to the first non-blank line at or after it, so that where a stage puts the
   blank lines between two units does not count.
2. Request span: token-level F1 of ``sigmoid(request) >= threshold`` against the planted question's tokens.
3. Relevance: the scorer head's ``p`` (``head.unit_reps`` / ``query_rep`` / ``relevance``, request tokens picked
   by the trained request probe) and BM25 (``LexicalScorer``) each rank the units by density; units are kept in
   that order while they fit ``budget`` x the document's tokens. A question counts when all its gold units are
   kept. Reported per family, side by side.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from pflash_proxy.compress.scores import LexicalScorer
from pflash_proxy.compress.kinds import ContentKind
from pflash_proxy.compress.text import TokenizedText, split_lines
from pflash_proxy.compress.units import CannotSegment, Unit, UnitSegmenter
from pflash_proxy.drafter import head as H
from pflash_proxy.drafter.probes import SegmentProbe, load_request_probe, load_scorer_head, load_segment_probe
from pflash_proxy.drafter.segment import ProbeSegmenter

from .features import Features
from .tasks import build

THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)


def _prf(pred: set[int], gold: set[int]) -> tuple[int, int, int]:
    return len(pred & gold), len(pred), len(gold)


def _f1(hit: int, npred: int, ngold: int) -> dict[str, float]:
    p = hit / npred if npred else 0.0
    r = hit / ngold if ngold else 0.0
    return {"precision": round(p, 3), "recall": round(r, 3), "f1": round(2 * p * r / (p + r), 3) if p + r else 0.0}


def probe_starts(probe: SegmentProbe, seg: ProbeSegmenter, f: Features) -> set[int]:
    lg = probe.forward(np.asarray(f.tap, np.float32))
    n_lines = int(f.token_line[-1]) + 1 if len(f.token_line) else 1
    return {u.start_line for u in seg.units(lg.unit, lg.subunit, f.token_line, n_lines)}


def boundary_counts(probe: SegmentProbe, seg: ProbeSegmenter, va: list[Features]) -> tuple[int, int, int]:
    tot = np.zeros(3, int)
    for f in va:
        tot += _prf(probe_starts(probe, seg, f), set(f.meta["units"]))
    return int(tot[0]), int(tot[1]), int(tot[2])


def choose_threshold(path: Path, va: list[Features]) -> float:
    probe = load_segment_probe(path)
    best = (-1.0, 0.8)
    for t in THRESHOLDS:
        seg = ProbeSegmenter(threshold=t, min_segment=probe.min_segment, max_segment=probe.max_segment)
        f1 = _f1(*boundary_counts(probe, seg, va))["f1"]
        best = max(best, (f1, t))
    return best[1]


def heuristic_starts(tt: TokenizedText) -> set[int]:
    try:
        return {u.start_line for u in UnitSegmenter().segment(tt, None)}
    except CannotSegment:
        return {0}


def _content_starts(starts: set[int], lines: list[str]) -> set[int]:
    out = set()
    for s in starts:
        while s + 1 < len(lines) and not lines[s].strip():
            s += 1
        out.add(s)
    return out


def keep_at_budget(density: np.ndarray, tokens: np.ndarray, budget: float) -> set[int]:
    limit, kept, used = budget * float(tokens.sum()), set(), 0.0
    for j in np.argsort(-density, kind="stable"):
        if used + tokens[j] <= limit:
            kept.add(int(j))
            used += float(tokens[j])
    return kept


def report(files: dict[str, Path], va: list[Features], budget: float, seed: int, lo: int, hi: int
           ) -> dict[str, object]:
    probe = load_segment_probe(files["segment"])
    seg = ProbeSegmenter.from_probe(probe)
    req = load_request_probe(files["request"])
    head = load_scorer_head(files["head"])
    lex = LexicalScorer()
    pb, hb = np.zeros(3, int), np.zeros(3, int)
    by_kind: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(6, int))
    rq = np.zeros(3, int)
    rel: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for f in va:
        ex = build(f.meta["index"], seed, lo, hi)
        text = ex.doc.text
        n_lines = len(split_lines(text))
        counts = np.bincount(f.token_line, minlength=n_lines)[:n_lines]
        tt = TokenizedText.from_text(text, [int(c) for c in counts])
        lines = ex.doc.lines
        gold_starts = _content_starts(set(f.meta["units"]), lines)
        a = np.array(_prf(_content_starts(probe_starts(probe, seg, f), lines), gold_starts))
        b = np.array(_prf(_content_starts(heuristic_starts(tt), lines), gold_starts))
        pb += a
        hb += b
        by_kind[f.meta["kind"]] += np.concatenate([a, b])
        pred = H.nn.sigmoid(req.forward(np.asarray(f.qtap, np.float32))) >= req.threshold
        rq += np.array([int((pred & (f.qlabel == 1)).sum()), int(pred.sum()), int(f.qlabel.sum())])
        if not f.meta["gold"]:
            continue
        starts = np.searchsorted(f.token_line, np.asarray(f.meta["units"]), side="left")
        ends = np.append(starts[1:], len(f.tap))
        tokens = np.maximum(ends - starts, 0)
        reps = H.unit_reps(head, np.asarray(f.tap, np.float32), starts, ends)
        qtap = np.asarray(f.qtap, np.float32)
        idx = H.select_request(len(qtap), req.forward(qtap), req.threshold, req.query_tokens)
        p_head = H.relevance(head, reps, H.query_rep(head, qtap[idx]))
        units = [Unit(j, int(s), int(e), int(t), ContentKind.PROSE) for j, (s, e, t) in
                 enumerate(zip(f.meta["units"], f.meta["units"][1:] + [len(ex.doc.lines)], tokens))]
        bm = lex.score(lex.represent(tt, units), ex.query) / np.maximum(tokens, 1)
        gold = set(f.meta["gold"])
        fam = rel[f.meta["family"]]
        fam["questions"] += 1
        fam["head"] += gold <= keep_at_budget(p_head, tokens, budget)
        fam["lexical"] += gold <= keep_at_budget(bm, tokens, budget)
        fam["head_top1"] += int(np.argmax(p_head)) in gold
        fam["lexical_top1"] += int(np.argmax(bm)) in gold
    kinds = {k: {"probe": _f1(*v[:3]), "heuristic": _f1(*v[3:])} for k, v in sorted(by_kind.items())}
    total = {k: sum(r[k] for r in rel.values()) for k in ("questions", "head", "lexical", "head_top1",
                                                          "lexical_top1")}
    return {"boundary": {"probe": _f1(*pb), "heuristic": _f1(*hb), "by_kind": kinds},
            "request_span": _f1(*rq), "budget": budget,
            "gold_kept_at_budget": {**{k: dict(v) for k, v in sorted(rel.items())}, "all": total}}
