"""Flat-relevance gate: is the relevance spread over more units than the budget keeps, for a request that asks
for every match?

Definition (over the *unpinned* units only: the pinned tail is kept whatever its score, so it says nothing about
how the rest is ranked):

    p_i   = s_i / sum(s)                        relevance share of unpinned unit i (s_i >= 0)
    N_eff = 1 / sum(p_i^2) = sum(s)^2 / sum(s^2)  effective number of relevant units
                                                  (participation ratio; N_eff = n for
                                                  equal scores, ~1 for a single needle)
    spread = (N_eff - k) / k                      k = unpinned units the budget keeps (at least 1): the
                                                  effectively relevant units beyond those the budget keeps,
                                                  per kept unit (> 0: more than it keeps)

The seed divided by n, the unpinned units, instead of k. Measured on the calibration sets
(the flat-gate sets, train split; ``docs/results.md``), one threshold per kept unit holds across prompt lengths and document
kinds where one per unit does not: the budget keeps a different share of the units of prose and code and of a
short and a long message, and ``/ n`` shrinks the same excess by that share.

Why the participation ratio rather than Shannon perplexity or "units holding 80% of the mass": both of those grow
with the long tail of tiny lexical matches that any long message has; N_eff is dominated by the large shares, so
a handful of strong units keeps it small while "every record mentions X" (all shares ~1/n) drives it to ~n.

When it applies (``flat_gate``):
1. Zero total relevance over the unpinned units is flat (spread = 1): nothing says what to keep.
2. Otherwise only a request that asks for every match can be flat (``asks_for_every``: a classifier trained on
   dev phrasings, ``intent.py``, whose features are the request's words and the form signals of ``forms.every_intent``: the thing asked for quantified ("describe all
   handlers", "what does each handler do"), plural after a question word ("which functions call retry"),
   counted ("how many", not "how many times"), enumerated ("list ...", "name the classes ..."), or its uses
   ("where is retry used", "who calls X"); not a quantifier in a condition ("... when every coefficient is
   small") or in the predicate of a question about one thing ("which function returns all items"), nor a word
   of an identifier: "In Summary.time, ..." names a method). A request about the whole message ("give a summary
   of what this module does", "what is this file for", ``asks_for_whole``) is flat whatever the scores: every
   unit is relevant to it; so is, in source code, a request for every match that spells no name ("each place
   that writes to disk": what matches is found by reading the code, not by its words).
   A pointed question ("which function interleaves the address infos?") over a cold document is compressed
   whatever the spread: measured on generated documents (``docs/results.md``, flat gate), the lexical spread of a
   pointed question and of a "list every X" over the same documents overlap, so a spread threshold alone
   either serves most pointed questions whole or compresses most aggregation requests.
3. What is spread is what the request asks every match *of*: the sentences of the request that hold the
   every-words (``every_clause``: "List all the steps it takes." of "Which function parses the header? List all
   the steps it takes."), scored on their own by BM25 whatever the serving scorer (``pipeline.gate_scores``). A
   request's other sentences point at one thing; an every-clause whose own words have no relevance at all ("all
   the steps *it* takes") asks for every part of that thing, which the units it points at hold, so it is not
   flat. Measured on the calibration sets, scoring the whole request instead mixes the pointed sentence's many
   words into the measure, and a pointed question with "list all the steps" reads as spread as a "list every
   X"; a drafter's relevance of such a clause is spread over the message whether or not its words occur there.
   The scorer's own part is its kept units ``k`` and its threshold curve.
4. Such a request is flat when ``spread > threshold``, the threshold read from the scorer's curve at the prompt's
   length (``SpreadCurve``: ``tokens:threshold`` points, linear between them, flat beyond; the defaults live
   with each scorer's registry entry, ``stages/scorers.py``), or one number for every length
   (``PFLASH_FALLBACK_SPREAD``; 0.11, the seed's number, for a scorer the registry does not know).
``Spread.reason`` is the decision in one sentence, with the numbers it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .forms import asking, every_intent, prose, request_names, sentences
from .intent import asks_every

__all__ = ["Spread", "SpreadCurve", "asks_for_every", "asks_for_whole", "every_clause", "flat_gate", "kept_mass",
           "relevance_spread"]

MAX_THRESHOLD = 100.0


def asks_for_every(request: str) -> bool:
    """Step 2: the request asks for every match (or for the whole), not for one thing: the classifier of
    ``intent.py`` over what its asking sentences say (``forms.every_intent``'s form signals among its features).
    Words that are part of an identifier (``forms.request_names``) do not count, nor sentences that ask nothing (a
    bug report's "Removing every value stored under a key leaves ...": ``forms.asking``)."""
    return asks_every(request or "")


# a sentence whose every-words point back at the one before it ("... ? Quote each of them."): the matches are
# what that sentence describes
_BACK = re.compile(r"\b(?:all|each|every\s+one|any|both)\s+of\s+(?:them|those|these)\b|\bthem\s+all\b"
                   r"|\b(?:each|every)\s+one\b|\ball\s+(?:those|these)\b", re.IGNORECASE)


_ONE = re.compile(r"\b(?:it|its|it's)\b", re.IGNORECASE)


def every_clause(request: str) -> str:
    """Step 3: the request's sentences that ask for every match, in order, each with the sentence before it when
    its every-words point back at that one ("all of them", "each one"); the whole request when none does, or
    when that is all of it."""
    parts = [p for p in sentences(request or "")]
    every: list[int] = []
    for i, p in enumerate(parts):
        if any(every_intent(q) is not None for q in asking(p)):
            if i > 0 and _BACK.search(prose(p)) and i - 1 not in every:
                every.append(i - 1)
            every.append(i)
    return " ".join(parts[i] for i in every) if every and len(every) < len(parts) else request


def asks_for_whole(request: str) -> bool:
    """Step 2: the request asks about the whole message (a summary or description of this module, document,
    page, log ...), so every part of it is relevant whatever the scores: it asks for every match
    (``asks_for_every``) and one of its sentences asks for the whole (``every_intent`` == "whole")."""
    return any(every_intent(p) == "whole" for p in asking(request)) and asks_for_every(request)


@dataclass(frozen=True)
class SpreadCurve:
    """Step 4: the flat threshold as a function of the prompt's tokens."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("spread curve: needs at least one point")
        prev = None
        for n, t in self.points:
            if n <= 0 or not -1.0 <= t <= MAX_THRESHOLD:  # spread > -1: negative when N_eff < k
                raise ValueError(f"spread curve: point {n}:{t} needs tokens > 0 and a threshold in "
                                 f"[-1, {MAX_THRESHOLD:g}]")
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


@dataclass(frozen=True, kw_only=True)
class Spread:
    spread: float
    effective_units: float
    kept_units: int  # unpinned units the budget keeps
    n_units: int  # unpinned units
    flat: bool
    threshold: float = 0.11
    applies: bool = True  # step 2: the request asks for every match (or the relevance is zero)
    clause: str | None = None  # step 3: the every-clause scored on its own, when it is not the whole request
    whole: bool = False  # step 2: the request asks about the whole message (a summary, a description of it)
    matches: tuple[int, int, int] | None = None  # pipeline step 5b: (matching units, their tokens, budget) too many

    @property
    def reason(self) -> str:
        """The decision as one sentence, with the numbers it used."""
        if self.matches is not None:
            n, need, budget = self.matches
            return (f"relevance too flat for a request that asks for every match: its {n} matching units and the "
                    f"pinned ones hold {need} tokens, more than the {budget}-token budget")
        if self.whole:
            return (f"relevance too flat for a request about the whole message (a summary, a description or every "
                    f"part of it): all {self.n_units} of the {self.n_units} unpinned units are relevant, against "
                    f"the {self.kept_units} the budget keeps (spread per kept unit {self.spread:.3f} > "
                    f"{self.threshold:.3f})")
        if self.kept_units == 0 and self.spread >= 1.0 and self.effective_units == self.n_units:
            return f"relevance too flat: none of the {self.n_units} unpinned units has any relevance to the request"
        verdict = (f"against the {self.kept_units} the budget keeps (spread per kept unit {self.spread:.3f} "
                   f"{'>' if self.flat else '<='} {self.threshold:.3f})")
        what = "for a request that asks for every match" if self.applies else "(a pointed request: not gated)"
        if self.applies and self.clause is not None:
            what += f" ({_quote(self.clause)})"
        return (f"relevance {'too flat' if self.flat else 'spread'} {what}: about {self.effective_units:.1f} of the "
                f"{self.n_units} unpinned units are relevant, {verdict}")


def _quote(text: str, most: int = 60) -> str:
    t = " ".join(text.split())
    return f"'{t if len(t) <= most else t[:most - 1] + '…'}'"


def relevance_spread(scores: np.ndarray, kept_units: int, fallback_spread: float = 0.11) -> Spread:
    """The spread of the unpinned units' ``scores`` against a budget keeping ``kept_units`` of them."""
    s = np.asarray(scores, dtype=np.float64)
    n = len(s)
    total = float(s.sum())
    if n == 0 or total <= 0.0:
        return Spread(spread=1.0, effective_units=float(n), kept_units=0, n_units=n, flat=True,
                      threshold=fallback_spread)
    n_eff = total * total / float(np.dot(s, s))
    spread = (n_eff - kept_units) / max(1, kept_units)
    return Spread(spread=spread, effective_units=n_eff, kept_units=kept_units, n_units=n,
                  flat=spread > fallback_spread, threshold=fallback_spread)


def flat_gate(scores: np.ndarray, kept_units: int, threshold: float, request: str,
              clause_scores: np.ndarray | None = None, code: bool = False) -> Spread:
    """Steps 1-4: the spread, flat only where the gate applies. ``scores``: the unpinned units' relevance (step 1
    reads it); ``clause_scores``: theirs for ``every_clause(request)`` (step 3; the pipeline's are BM25's), the
    measured ones when given, else ``scores``. ``code``: the message is source code, where a request for every
    match whose every-clause names something here (its BM25 is not all zero) but spells no name nor points at one
    thing ("it") (``request_names``: "every place that writes to disk", "each function without
    tests") asks about the whole message: its matches are found by reading the code, not by its words."""
    sp = relevance_spread(scores, kept_units, threshold)
    if float(np.asarray(scores, dtype=np.float64).sum()) <= 0.0:
        return sp  # step 1
    if asks_for_whole(request):
        return Spread(spread=max(sp.spread, (sp.n_units - sp.kept_units) / max(1, sp.kept_units)), effective_units=float(sp.n_units),
                      kept_units=sp.kept_units, n_units=sp.n_units, flat=True, threshold=threshold, applies=True,
                      clause=None, whole=True)
    applies = asks_for_every(request)
    if not applies or clause_scores is None:
        return Spread(spread=sp.spread, effective_units=sp.effective_units, kept_units=sp.kept_units,
                      n_units=sp.n_units, flat=sp.flat and applies, threshold=threshold, applies=applies)
    clause = every_clause(request)
    shown = clause if clause != request else None
    cs = relevance_spread(clause_scores, kept_units, threshold)
    if float(np.asarray(clause_scores, dtype=np.float64).sum()) <= 0.0:  # "all the steps it takes": its own
        # words name nothing here, so it asks for every part of what the other sentences point at
        return Spread(spread=-1.0, effective_units=0.0, kept_units=cs.kept_units, n_units=cs.n_units, flat=False,
                      threshold=threshold, applies=True, clause=shown)
    if code and not request_names(request) and not _ONE.search(clause):  # every match of what the code does,
        # not of a name (nor every part of the one thing "it" points at: "list all the steps it takes"): the whole
        return Spread(spread=max(sp.spread, (sp.n_units - sp.kept_units) / max(1, sp.kept_units)), effective_units=float(sp.n_units),
                      kept_units=sp.kept_units, n_units=sp.n_units, flat=True, threshold=threshold, applies=True,
                      clause=shown, whole=True)
    return Spread(spread=cs.spread, effective_units=cs.effective_units, kept_units=cs.kept_units, n_units=cs.n_units,
                  flat=cs.flat, threshold=threshold, applies=True, clause=shown)


def kept_mass(scores: np.ndarray, kept: np.ndarray, free: np.ndarray) -> float:
    """The share of the unpinned units' relevance that the kept unpinned units hold (0 when there is none)."""
    s = np.asarray(scores, dtype=np.float64)
    total = float(s[free].sum())
    return float(s[kept & free].sum()) / total if total > 0 else 0.0
