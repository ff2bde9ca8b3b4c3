"""Flat-relevance gate: is the relevance spread over more units than the budget keeps, for a request that asks
for every match?

Definition (over the *unpinned* units only: the pinned tail is kept whatever its score, so it says nothing about
how the rest is ranked):

    p_i   = s_i / sum(s)                        relevance share of unpinned unit i (s_i >= 0)
    N_eff = 1 / sum(p_i^2) = sum(s)^2 / sum(s^2)  effective number of relevant units
                                                  (participation ratio; N_eff = n for
                                                  equal scores, ~1 for a single needle)
    spread = (N_eff - k) / n                      k = unpinned units the budget keeps, n = unpinned units

Why the participation ratio rather than Shannon perplexity or "units holding 80% of the mass": both of those grow
with the long tail of tiny lexical matches that any long message has; N_eff is dominated by the large shares, so
a handful of strong units keeps it small while "every record mentions X" (all shares ~1/n) drives it to ~n.

When it applies (``flat_gate``):
1. Zero total relevance over the unpinned units is flat (spread = 1): nothing says what to keep.
2. Otherwise only a request that asks for every match can be flat (``asks_for_every``: "list every ...", "list
   the ID of every ...", "how many" (not "how many times"), "what are all ...", "all the X that ...",
   "summarize", "overview").
   A pointed question ("which function interleaves the address infos?") over a cold document is compressed
   whatever the spread: measured on generated documents (``benchmarks/flat_gate/``), the lexical spread of a
   pointed question and of a "list every X" over the same documents overlap, so a spread threshold alone
   either serves most pointed questions whole or compresses most aggregation requests.
3. Such a request is flat when ``spread > threshold``, the threshold read from the scorer's curve at the prompt's
   length (``SpreadCurve``: ``tokens:threshold`` points, linear between them, flat beyond; the defaults live
   with each scorer's registry entry, ``stages/scorers.py``), or one number for every length
   (``PFLASH_FALLBACK_SPREAD``, the seed's 0.11).
``Spread.reason`` is the decision in one sentence, with the numbers it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["Spread", "SpreadCurve", "asks_for_every", "flat_gate", "kept_mass", "relevance_spread"]

_EVERY = re.compile(
    r"\b(?:list|name|give|show|find|count|enumerate|collect|quote|extract|report)\b(?:\s+[\w'-]+){0,3}?\s+"
    r"(?:every|all|each)\b"
    r"|\bhow\s+many\b(?!\s+times)"
    r"|\b(?:summari[sz]e|summary|overview)\b"
    r"|\b(?:what|which)\s+are\s+(?:all|every)\b"
    r"|\b(?:every|all|each)\s+(?:[\w'-]+\s+){0,3}?(?:that|which|who|where|mentioning|containing|with)\b", re.I)


def asks_for_every(request: str) -> bool:
    """Step 2: the request asks for every match (or a summary of everything), not for one thing."""
    return bool(_EVERY.search(request or ""))


@dataclass(frozen=True)
class SpreadCurve:
    """Step 3: the flat threshold as a function of the prompt's tokens."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("spread curve: needs at least one point")
        prev = None
        for n, t in self.points:
            if n <= 0 or not 0.0 <= t <= 1.0:
                raise ValueError(f"spread curve: point {n}:{t} needs tokens > 0 and a threshold in [0, 1]")
            if prev is not None and n <= prev:
                raise ValueError(f"spread curve: points must ascend in tokens ({prev} then {n})")
            prev = n

    @classmethod
    def parse(cls, spec: str | float) -> "SpreadCurve":
        """``"4096:0.08 32768:0.02"``, or one number for every length."""
        if isinstance(spec, (int, float)):
            return cls(((1, float(spec)),))
        pts = []
        for item in spec.replace(",", " ").split():
            tok, sep, thr = item.partition(":")
            try:
                pts.append((int(tok), float(thr)) if sep else (1, float(tok)))
            except ValueError:
                raise ValueError(f"spread curve: point {item!r} is not tokens:threshold") from None
        return cls(tuple(pts))

    def at(self, tokens: int) -> float:
        return float(np.interp(tokens, [p[0] for p in self.points], [p[1] for p in self.points]))

    def __str__(self) -> str:
        if len(self.points) == 1:
            return f"{self.points[0][1]:g}"
        return " ".join(f"{n}:{t:g}" for n, t in self.points)


@dataclass(frozen=True)
class Spread:
    spread: float
    effective_units: float
    kept_units: int  # unpinned units the budget keeps
    n_units: int  # unpinned units
    flat: bool
    threshold: float = 0.11
    applies: bool = True  # step 2: the request asks for every match (or the relevance is zero)

    @property
    def reason(self) -> str:
        """The decision as one sentence, with the numbers it used."""
        if self.kept_units == 0 and self.spread >= 1.0 and self.effective_units == self.n_units:
            return f"relevance too flat: none of the {self.n_units} unpinned units has any relevance to the request"
        verdict = (f"more than the {self.kept_units} the budget keeps (spread {self.spread:.3f} > {self.threshold:.3f})"
                   if self.flat else f"against the {self.kept_units} the budget keeps (spread {self.spread:.3f}, "
                   f"threshold {self.threshold:.3f})")
        what = "for a request that asks for every match" if self.applies else "(a pointed request: not gated)"
        return (f"relevance {'too flat' if self.flat else 'spread'} {what}: about {self.effective_units:.1f} of the "
                f"{self.n_units} unpinned units are relevant, {verdict}")


def relevance_spread(scores: np.ndarray, kept_units: int, fallback_spread: float = 0.11) -> Spread:
    """The spread of the unpinned units' ``scores`` against a budget keeping ``kept_units`` of them."""
    s = np.asarray(scores, dtype=np.float64)
    n = len(s)
    total = float(s.sum())
    if n == 0 or total <= 0.0:
        return Spread(1.0, float(n), 0, n, True, fallback_spread)
    n_eff = total * total / float(np.dot(s, s))
    spread = (n_eff - kept_units) / n
    return Spread(spread, n_eff, kept_units, n, spread > fallback_spread, fallback_spread)


def flat_gate(scores: np.ndarray, kept_units: int, threshold: float, request: str) -> Spread:
    """Steps 1-3: the spread, flat only where the gate applies."""
    sp = relevance_spread(scores, kept_units, threshold)
    if float(np.asarray(scores, dtype=np.float64).sum()) <= 0.0:
        return sp  # step 1
    applies = asks_for_every(request)
    return Spread(sp.spread, sp.effective_units, sp.kept_units, sp.n_units, sp.flat and applies, threshold, applies)


def kept_mass(scores: np.ndarray, kept: np.ndarray, free: np.ndarray) -> float:
    """The share of the unpinned units' relevance that the kept unpinned units hold (0 when there is none)."""
    s = np.asarray(scores, dtype=np.float64)
    total = float(s[free].sum())
    return float(s[kept & free].sum()) / total if total > 0 else 0.0
