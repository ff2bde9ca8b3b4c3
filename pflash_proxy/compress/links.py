"""Reference hops over any scorer's relevance: ``VAR_B = VAR_A`` is as relevant as ``VAR_A = 12345``.

Why: a question about a chain (a variable assigned through others, a function and the helper it calls, an id
carried from record to record) has evidence that shares nothing with the question, only a *name* with other
evidence. The lexical scorer follows names from the question's own terms (``scores.py`` step 3b); a drafter
scorer has no terms to follow, so this stage follows them from whatever the scorer ranked highest.

1. ``ReferenceLinks.build(tt, units)``: the identifiers of every line (words with a digit, an underscore or a
   camelCase hump). One is a *name* when at most ``RARE_UNITS`` units hold it; a line is a *reference* when it
   holds 1 to ``LINK_TERMS`` names and at most ``REF_TOKENS`` tokens (an assignment, a call, a key: not a
   record of many fields). Kept: per unit, the names of its reference lines.
2. ``propagate(links, scores, unit_tokens)``: relevance per token (density). The *sources* are the units at
   least ``SOURCE`` of the top density. Breadth first, up to ``HOPS`` hops: a unit whose reference lines share
   a name with the reference lines of a unit reached at hop ``h - 1`` has its density raised to ``DECAY ** h``
   times the lowest source's (each unit reached once, at its first hop; at most ``REACH`` units). So a reached
   unit never outranks a source (the scorer's peaks stay first, even when one is noise) and a chain keeps its
   order.
   Scores are density times tokens again.
3. Nothing reached: the scores come back unchanged, so a message without references ranks exactly as the
   scorer said.

``Linked(scorer)`` wraps a scorer with this stage (the drafter scorers: ``attention``, ``hybrid``,
``head-attention``); its reps hold the inner reps and the links, so recall (a later question on the same reps)
follows them too. ``REACH_SHARE`` bounds the raised units by tokens as well as by count: without it the many
helpers of a whole-file tool output are all raised and push the function asked about out of the budget. The bounds
were chosen on a tuning set by replaying recorded scores (``docs/results.md``, "How the fixed weights and
bounds were chosen").
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .scores import LINK_TERMS, RARE_UNITS, REPS_VERSION, Scorer, UnitReps, validate_scores
from .text import TokenizedText
from .units import Unit

__all__ = ["Linked", "ReferenceLinks", "propagate"]

REF_TOKENS = 40  # step 1: a longer line is prose or data, not a reference
SOURCE = 0.5  # step 2: sources are units at least this fraction of the top relevance per token
DECAY = 0.8  # step 2: hop h raises a unit to DECAY ** h of the lowest source's relevance per token
HOPS = 5  # step 2: a chain of five assignments is five hops from a question that names its value
REACH = 8  # step 2: at most this many units raised, so a source that names many others cannot flood the budget
REACH_SHARE = 0.05  # step 2: ... and at most this share of the message's tokens (the budget is ~25-30 % of it)
# step 1: an identifier, not a word: it holds a digit, an underscore or a camelCase hump (VAR_ABCDE, parseHeader,
# req-8f3a2's 8f3a2, 16811); prose words never link, so a rare word in two paragraphs is not a reference
_NAME = re.compile(r"\b(?=\w{3})[A-Za-z0-9_]*(?:[0-9_]|[a-z][A-Z])[A-Za-z0-9_]*\b")  # 3+ characters


@dataclass(frozen=True)
class ReferenceLinks:
    """Per unit, the names its reference lines hold; per name, the units whose reference lines hold it."""

    unit_names: tuple[frozenset[str], ...]
    name_units: dict[str, tuple[int, ...]]

    @classmethod
    def build(cls, tt: TokenizedText, units: Sequence[Unit]) -> "ReferenceLinks":
        line_terms = [set(_NAME.findall(line)) for line in tt.lines]
        line_unit = np.full(len(tt.lines), -1, np.int64)
        for k, u in enumerate(units):
            line_unit[u.start_line:u.end_line] = k
        holders: dict[str, set[int]] = defaultdict(set)  # step 1: which units hold each term
        for i, terms in enumerate(line_terms):
            for t in terms:
                holders[t].add(int(line_unit[i]))
        unit_names: list[set[str]] = [set() for _ in units]
        for i, terms in enumerate(line_terms):
            if line_unit[i] < 0 or tt.line_tokens[i] > REF_TOKENS:
                continue
            names = {t for t in terms if len(holders[t]) <= RARE_UNITS}
            if 0 < len(names) <= LINK_TERMS:
                unit_names[int(line_unit[i])] |= names
        name_units: dict[str, list[int]] = defaultdict(list)
        for k, names in enumerate(unit_names):
            for t in names:
                name_units[t].append(k)
        return cls(tuple(frozenset(n) for n in unit_names),
                   {t: tuple(ks) for t, ks in name_units.items() if len(ks) > 1})

    @property
    def empty(self) -> bool:
        return not self.name_units


def propagate(links: ReferenceLinks, scores: np.ndarray, unit_tokens: np.ndarray, hops: int = HOPS,
              decay: float = DECAY, source: float = SOURCE, reach: int = REACH, reach_share: float = REACH_SHARE
              ) -> np.ndarray:
    """Step 2: ``scores`` with the units reached from the top ones through shared names raised."""
    s = np.asarray(scores, np.float64)
    if links.empty or not len(s) or float(s.max()) <= 0.0:
        return s
    tok = np.maximum(np.asarray(unit_tokens, np.float64), 1.0)
    d = s / tok
    frontier = [int(k) for k in np.flatnonzero(d >= source * float(d.max()))]
    level = float(d[frontier].min())  # a reached unit ranks below every source: the scorer's peaks stay first
    reached = set(frontier)
    out = d.copy()
    raised, room = 0, reach_share * float(tok.sum())
    for _ in range(hops):
        level *= decay
        nxt: list[int] = []
        for k in frontier:
            for name in sorted(links.unit_names[k]):
                for j in links.name_units.get(name, ()):
                    if j not in reached and raised < reach and tok[j] <= room:
                        reached.add(j)
                        out[j] = max(out[j], level)
                        nxt.append(j)
                        raised, room = raised + 1, room - tok[j]
        if not nxt:
            break
        frontier = nxt
    return out * tok


class Linked:
    """``Scorer`` protocol: ``scorer``'s relevance with reference hops (module docstring)."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self.name = scorer.name

    def __getattr__(self, item: str) -> Any:  # heads, drafter, ...: what the wrapped scorer reports
        if item == "scorer":  # not yet set (unpickling): no recursion
            raise AttributeError(item)
        return getattr(self.scorer, item)

    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps:
        inner = self.scorer.represent(tt, units)
        return UnitReps(self.name, inner.n_units, inner.unit_tokens, (inner, ReferenceLinks.build(tt, units)),
                        REPS_VERSION)

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        inner, links = reps.payload
        s = validate_scores(self.scorer.score(inner, query), reps.n_units).astype(np.float64)
        return propagate(links, s, reps.unit_tokens)
