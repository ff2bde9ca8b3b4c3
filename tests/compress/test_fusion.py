"""``--scorer hybrid``: lexical and drafter relevance fused as shares (no model: a stand-in second scorer)."""

from __future__ import annotations

import numpy as np
import pytest

from pflash_proxy.compress.fusion import FusedScorer
from pflash_proxy.compress.scores import LexicalScorer, UnitReps
from pflash_proxy.compress.spread import relevance_spread
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter


class FixedScorer:
    """Stands in for the drafter scorer: fixed scores, so the fusion arithmetic is checked exactly."""
    name = "fixed"

    def __init__(self, scores):
        self.scores = np.asarray(scores, np.float64)

    def represent(self, tt, units):
        return UnitReps(self.name, len(units), np.array([u.tokens for u in units]), None)

    def score(self, reps, query):
        return self.scores


def _doc():
    paras = [f"Paragraph {i} is about harbour cranes, tide tables and the weight of cargo number {i}." * 3
             for i in range(8)]
    paras[2] = "The lighthouse keeper logs every passing ship in a green ledger. " * 3
    tt = TokenizedText.from_text("\n\n".join(paras) + "\n")
    return tt, UnitSegmenter(4, 64).segment(tt, None)


def test_fused_scores_are_weighted_shares_and_a_blind_scorer_defers_to_the_other():
    tt, units = _doc()
    n = len(units)
    drafter_like = np.zeros(n)
    drafter_like[5] = 3.0
    drafter_like[1] = 1.0
    fused = FusedScorer(LexicalScorer(), FixedScorer(drafter_like), weight=0.5)
    reps = fused.represent(tt, units)
    lex = LexicalScorer().score(LexicalScorer().represent(tt, units), "lighthouse ledger")
    got = fused.score(reps, "lighthouse ledger")
    np.testing.assert_allclose(got, 0.5 * lex / lex.sum() + 0.5 * drafter_like / 4.0)
    # a question sharing no word with the message: BM25 is all zeros, the drafter's ranking decides alone
    blind = fused.score(reps, "zzyzx qwerty")
    assert np.argmax(blind) == 5 and np.count_nonzero(blind) == 2
    with pytest.raises(ValueError):
        FusedScorer(LexicalScorer(), FixedScorer(drafter_like), weight=1.5)


def test_fusion_keeps_the_spread_test_meaningful():
    tt, units = _doc()
    n = len(units)
    spread_out = FusedScorer(FixedScorer(np.ones(n)), FixedScorer(np.ones(n)))
    needle = np.full(n, 0.01)
    needle[3] = 5.0
    peaked = FusedScorer(FixedScorer(needle), FixedScorer(needle))
    k = max(1, n // 4)
    assert relevance_spread(spread_out.score(spread_out.represent(tt, units), "q"), k).flat
    assert not relevance_spread(peaked.score(peaked.represent(tt, units), "q"), k).flat


def test_hybrid_follows_references_that_the_drafter_does_not_see():
    from pflash_proxy.compress.fusion import HYBRID_LEXICAL_WEIGHT, hybrid

    lines = ["VAR_QWERT = 48213", "VAR_ZXCVB = VAR_QWERT", "VAR_POIUY = VAR_ZXCVB"]
    paras = [f"Paragraph {i} is about harbour cranes, tide tables and the weight of cargo number {i}." * 3
             for i in range(12)]
    for k, line in zip((1, 5, 9), lines):
        paras[k] += "\n" + line
    tt = TokenizedText.from_text("\n\n".join(paras) + "\n")
    units = UnitSegmenter(4, 64).segment(tt, None)
    where = [next(i for i, u in enumerate(units) if ln in tt.range_text(u.start_line, u.end_line)) for ln in lines]
    blind = np.zeros(len(units))
    blind[0] = 1.0  # the drafter looks elsewhere
    fused = hybrid(FixedScorer(blind))
    got = fused.score(fused.represent(tt, units), "Which variables hold the value 48213, directly or not?")
    assert (got[where] > 0).all()  # plain BM25 would give the second and third links nothing
    assert fused.weight == HYBRID_LEXICAL_WEIGHT and got[0] >= (1 - HYBRID_LEXICAL_WEIGHT) - 1e-9
