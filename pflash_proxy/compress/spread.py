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
2. Otherwise only a request that asks for every match can be flat (``asks_for_every``: "list every ...", "list
   the ID of every ...", "how many" (not "how many times"), "what are all ...", "all the X that ...",
   "summarize", "overview"; not a word of an identifier: "In Summary.time, ..." names a method).
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

__all__ = ["Spread", "SpreadCurve", "asks_for_every", "every_clause", "flat_gate", "kept_mass",
           "relevance_spread"]

_EVERY = re.compile(
    r"\b(?:list|name|give|show|find|count|enumerate|collect|quote|extract|report)\b(?:\s+[\w'-]+){0,3}?\s+"
    r"(?:every|all|each)\b"
    r"|\bhow\s+many\b(?!\s+times)"
    r"|\b(?:summari[sz]e|summary|overview)\b"
    r"|\b(?:what|which)\s+are\s+(?:all|every)\b"
    r"|\b(?:every|all|each)\s+(?:[\w'-]+\s+){0,3}?(?:that|which|who|where|mentioning|containing|with)\b", re.I)


# Step 2: identifiers are names, not every-words ("In Summary.time, ..." asks about one method, "`each`" names a
# keyword): code spans, dotted / qualified names and paths, snake_case, CamelCase and camelCase words, calls, and
# a capitalised "Summary"/"Overview" inside a sentence (a class, as in "What does the Summary class do?")
_IDENTIFIER = re.compile(
    r"`[^`\n]*`"  # a code span, whatever it holds
    r"|[\w$]+(?:(?:\.|::|->|#|/)[\w$]+)+"  # Class.method, pkg/mod.py, Class::method, Class#method
    r"|\b\w*_\w*"  # snake_case, __dunder__
    r"|\b[A-Z][a-z0-9]+[A-Z]\w*|\b[a-z]+[A-Z]\w*"  # CamelCase, camelCase
    r"|\b\w+(?=\()"  # a call: summary(...)
    r"|(?<=[^\s.?!:;\"'(] )(?:Summary|Overview)\b")  # capitalised inside a sentence: a class name


def _prose(text: str) -> str:
    """The request with its identifiers blanked (each to one neutral word, so word distances stay)."""
    return _IDENTIFIER.sub(" name ", text)


MAX_THRESHOLD = 100.0
_SENTENCE = re.compile(r"(?<=[.?!])\s+|\n+")


def asks_for_every(request: str) -> bool:
    """Step 2: the request asks for every match (or a summary of everything), not for one thing. Words that are
    part of an identifier (``_IDENTIFIER``) do not count."""
    return bool(_EVERY.search(_prose(request or "")))


def every_clause(request: str) -> str:
    """Step 3: the request's sentences that ask for every match, in order (the whole request when none does, or
    when it is one sentence)."""
    parts = [p for p in _SENTENCE.split((request or "").strip()) if p.strip()]
    every = [p for p in parts if _EVERY.search(_prose(p))]
    return " ".join(every) if every and len(every) < len(parts) else request


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


@dataclass(frozen=True)
class Spread:
    spread: float
    effective_units: float
    kept_units: int  # unpinned units the budget keeps
    n_units: int  # unpinned units
    flat: bool
    threshold: float = 0.11
    applies: bool = True  # step 2: the request asks for every match (or the relevance is zero)
    clause: str | None = None  # step 3: the every-clause scored on its own, when it is not the whole request

    @property
    def reason(self) -> str:
        """The decision as one sentence, with the numbers it used."""
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
        return Spread(1.0, float(n), 0, n, True, fallback_spread)
    n_eff = total * total / float(np.dot(s, s))
    spread = (n_eff - kept_units) / max(1, kept_units)
    return Spread(spread, n_eff, kept_units, n, spread > fallback_spread, fallback_spread)


def flat_gate(scores: np.ndarray, kept_units: int, threshold: float, request: str,
              clause_scores: np.ndarray | None = None) -> Spread:
    """Steps 1-4: the spread, flat only where the gate applies. ``scores``: the unpinned units' relevance (step 1
    reads it); ``clause_scores``: theirs for ``every_clause(request)`` (step 3; the pipeline's are BM25's), the
    measured ones when given, else ``scores``."""
    sp = relevance_spread(scores, kept_units, threshold)
    if float(np.asarray(scores, dtype=np.float64).sum()) <= 0.0:
        return sp  # step 1
    applies = asks_for_every(request)
    if not applies or clause_scores is None:
        return Spread(sp.spread, sp.effective_units, sp.kept_units, sp.n_units, sp.flat and applies, threshold,
                      applies)
    clause = every_clause(request)
    shown = clause if clause != request else None
    cs = relevance_spread(clause_scores, kept_units, threshold)
    if float(np.asarray(clause_scores, dtype=np.float64).sum()) <= 0.0:  # "all the steps it takes": its own
        # words name nothing here, so it asks for every part of what the other sentences point at
        return Spread(-1.0, 0.0, cs.kept_units, cs.n_units, False, threshold, True, shown)
    return Spread(cs.spread, cs.effective_units, cs.kept_units, cs.n_units, cs.flat, threshold, True, shown)


def kept_mass(scores: np.ndarray, kept: np.ndarray, free: np.ndarray) -> float:
    """The share of the unpinned units' relevance that the kept unpinned units hold (0 when there is none)."""
    s = np.asarray(scores, dtype=np.float64)
    total = float(s[free].sum())
    return float(s[kept & free].sum()) / total if total > 0 else 0.0
