"""Flat-relevance measure: is the relevance spread over more units than the budget keeps?

Definition (one formula, one threshold):

    p_i   = s_i / sum(s)                        relevance share of unit i (s_i >= 0)
    N_eff = 1 / sum(p_i^2) = sum(s)^2 / sum(s^2)  effective number of relevant units
                                                  (participation ratio; N_eff = n for
                                                  equal scores, ~1 for a single needle)
    spread = (N_eff - k) / n                      k = units the budget keeps, n = units

The request is **flat** when ``spread > fallback_spread`` (``PFLASH_FALLBACK_SPREAD``,
default 0.11): the relevance is spread over more units than the budget can keep, by
more than 11% of all units.  Zero total relevance is flat (spread = 1).

Why the participation ratio rather than Shannon perplexity or "units holding 80% of
the mass": both of those grow with the long tail of tiny lexical matches that any
long message has, so they call ordinary requests flat; N_eff is dominated by the
large shares, so a handful of strong units keeps it small while "every record
mentions X" (all shares ~1/n) drives it to ~n.

Algorithm: 1. sum and sum of squares of the scores; 2. N_eff; 3. spread; 4. compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Spread", "relevance_spread"]


@dataclass(frozen=True)
class Spread:
    spread: float
    effective_units: float
    kept_units: int
    n_units: int
    flat: bool


def relevance_spread(scores: np.ndarray, kept_units: int, fallback_spread: float = 0.11) -> Spread:
    """The spread of ``scores`` against a budget keeping ``kept_units`` of them."""
    s = np.asarray(scores, dtype=np.float64)
    n = len(s)
    total = float(s.sum())
    if n == 0 or total <= 0.0:
        return Spread(1.0, float(n), kept_units, n, True)
    n_eff = total * total / float(np.dot(s, s))
    spread = (n_eff - kept_units) / n
    return Spread(spread, n_eff, kept_units, n, spread > fallback_spread)
