"""``--scorer hybrid``: lexical (BM25) and a drafter scorer fused into one relevance.

BM25 finds the units that share the question's words; the drafter's attention also finds evidence that shares
none (a latent association, a paraphrased task) but is noisier on literal matches. Fusion keeps both signals:

1. ``represent``: each scorer reads the message once; the reps hold both (picklable when both are).
2. ``score``: each scorer's unit scores become *shares* (``s / sum(s)``; all zeros stay zeros, e.g. BM25 for a
   question that shares no word with the message), and the fused score is ``w * share_a + (1 - w) * share_b``.
   Shares keep what the flat-relevance test needs: when both scorers concentrate on a few units the fused
   scores do too, and when both spread (an "every record" request) the fused scores stay spread; a scorer that
   sees nothing (all zeros) leaves the other's shares scaled by its weight, so its ranking decides.
``hybrid(drafter_scorer)`` builds the product's ``--scorer hybrid``: ``0.3`` of lexical relevance with reference
hops (``LexicalScorer(hops=4)``: the chain ``VAR_B = VAR_A`` is found from ``VAR_A = 12345``) and ``0.7`` of the
drafter's. The weight and the hops were chosen on recorded analyses of a tuning set (a fusion study, ``docs/results.md``),
never on the reported cases, by the gold found in messages that were actually compressed with the aggregation
control kept whole; gold kept whole is not the criterion, since the flat fallback keeps it by serving the message
whole, which buys no speed (the results: ``docs/results.md``, "How the fixed weights and bounds were
chosen").
Rank fusion (RRF) was not used: it turns any ranking into the same smooth curve, so every request would look
equally concentrated and the spread test would lose its meaning.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .scores import REPS_VERSION, LexicalScorer, Scorer, UnitReps, validate_scores
from .text import TokenizedText
from .units import Unit

__all__ = ["FusedScorer", "HYBRID_LEXICAL_WEIGHT", "hybrid", "hybrid_lexical", "shares"]

HYBRID_LEXICAL_WEIGHT = 0.3
HYBRID_HOPS = 4
HYBRID_HOP_DECAY = 0.8


def shares(s: np.ndarray) -> np.ndarray:
    total = float(s.sum())
    return s / total if total > 0 else np.zeros_like(s)


class FusedScorer:
    """``Scorer`` protocol: the weighted sum of two scorers' relevance shares."""

    name = "hybrid"

    def __init__(self, first: Scorer, second: Scorer, weight: float = 0.5) -> None:
        if not 0.0 <= weight <= 1.0:
            raise ValueError("weight must be in [0, 1]")
        self.first, self.second, self.weight = first, second, weight

    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps:
        a, b = self.first.represent(tt, units), self.second.represent(tt, units)
        return UnitReps(self.name, a.n_units, a.unit_tokens, (a, b), REPS_VERSION)

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        a, b = reps.payload
        sa = validate_scores(self.first.score(a, query), reps.n_units).astype(np.float64)
        sb = validate_scores(self.second.score(b, query), reps.n_units).astype(np.float64)
        return self.weight * shares(sa) + (1.0 - self.weight) * shares(sb)

    def describe(self) -> dict[str, str | float]:
        return {"first": self.first.name, "second": self.second.name, "weight": self.weight}


def hybrid_lexical() -> LexicalScorer:
    """The lexical half of ``--scorer hybrid``: BM25 with reference hops."""
    return LexicalScorer(hops=HYBRID_HOPS, hop_decay=HYBRID_HOP_DECAY)


def hybrid(drafter_scorer: Scorer) -> FusedScorer:
    """``--scorer hybrid``: lexical relevance with reference hops, fused with the drafter's (module docstring)."""
    return FusedScorer(hybrid_lexical(), drafter_scorer, weight=HYBRID_LEXICAL_WEIGHT)
