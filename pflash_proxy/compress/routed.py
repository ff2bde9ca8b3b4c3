"""``--scorer auto``: source code is scored by BM25 (``lexical``), everything else by the drafter's scorer.

Why two: a question about code names or paraphrases identifiers, comments and strings that the file spells out,
and BM25 ranks the definition that holds them; a small drafter's attention reads code poorly and spends a
forward pass over the whole file to do it. In prose, records and tool output the drafter finds the evidence
that shares no word with the question (latent needles), which BM25 cannot. The measurements behind the split are
in ``docs/results.md`` (agent reads, quality by family).

1. ``represent(tt, units)``: the message is code when its code units (``ContentKind.CODE``, decided by the
   cutter on the text behind any line-number gutter) hold at least ``CODE_SHARE`` of its tokens. Code: the
   ``code`` scorer's reps (no drafter pass at all); else the ``other`` scorer's. The reps remember which.
2. ``score(reps, query)``: the scorer that made the reps scores them (recall re-asks the same one).
3. Anything else asked of it (``heads``, ``drafter``, ...) is the ``other`` scorer's: the drafter side is what
   ``/pflash/stats`` and the drafter's lifetime care about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .kinds import ContentKind
from .scores import REPS_VERSION, Scorer, UnitReps
from .text import TokenizedText
from .units import Unit

__all__ = ["CODE_SHARE", "RoutedScorer", "is_code"]

CODE_SHARE = 0.5


def is_code(units: Sequence[Unit]) -> bool:
    """Step 1: code units hold at least ``CODE_SHARE`` of the message's tokens."""
    total = sum(u.tokens for u in units)
    code = sum(u.tokens for u in units if u.kind == ContentKind.CODE)
    return total > 0 and code >= CODE_SHARE * total


class RoutedScorer:
    """``Scorer`` protocol: ``code`` for code messages, ``other`` for the rest (module docstring)."""

    name = "auto"

    def __init__(self, code: Scorer, other: Scorer) -> None:
        self.code, self.other = code, other

    def __getattr__(self, item: str) -> Any:  # step 3
        if item in ("code", "other"):  # not yet set (unpickling): no recursion
            raise AttributeError(item)
        return getattr(self.other, item)

    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps:
        route = "code" if is_code(units) else "other"
        inner = (self.code if route == "code" else self.other).represent(tt, units)
        return UnitReps(self.name, inner.n_units, inner.unit_tokens, (route, inner), REPS_VERSION)

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        route, inner = reps.payload
        return (self.code if route == "code" else self.other).score(inner, query)

    def describe(self) -> dict[str, str | float]:
        return {"code": self.code.name, "other": self.other.name, "code_share": CODE_SHARE}
