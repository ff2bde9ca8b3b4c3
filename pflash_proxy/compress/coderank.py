"""Code is read as definitions: a function or method is ranked and kept whole, as one piece.

A question about code in a user's own words ("why does an offset of 14 months come out as a year and two?")
asks about a definition, and the definition, not the 512-token unit the cutter made of part of it, is what
answers it: a unit holds the head of a long function or the tails of several short ones, and a ranking of units
keeps part of the one asked about. Offline on the users'-words code tasks (dev split), plain BM25 over the
file's definitions, filled greedily to 30 % of the file, kept the needed definition where the unit ranking lost
it (the issue's diagnostic, ``bench code-tasks``' last column).

1. ``atoms(units, groups)``: the selection's pieces: each group (``named.definition_atoms``: the units of a
   function or method, definitions sharing a unit merged) is one atom; every other unit (imports, a class's
   header and docstring, module-level statements) is an atom of its own. Every unit is in exactly one atom.
2. ``AtomIndex.build(tt, units, atoms)``: the lexical scorer's BM25 (k1 1.5, b 0.75, the Lucene idf; its terms:
   words, identifier parts, whole compound identifiers, stopwords and single letters dropped) with one document
   per atom. (A suffix stemmer lost on the dev split: 74 of 84
   reads against 76, an S-stemmer 74 too: it merges ``token``/``tokenize``/``tokenizer``, whose idf falls.)
3. ``AtomIndex.score(query)``: the atoms' BM25 of the query's terms (each distinct term once).
4. ``atom_scores(scores, atoms)``: for a scorer with no terms (a drafter's relevance per unit), an atom is as
   relevant as its best unit.
5. ``select_atoms``: the pipeline's selection in code (``pipeline`` step 4): the always-kept units first; then
   the leader of the raw score (the atom with the highest BM25, ``leader``), kept whole when it fits; then
   the atoms by ``score / tokens ** SIZE_POWER`` (a long definition that matches is not outranked by every
   short one that mentions a word once, as pure density would do, nor does a long one win on length alone, as
   the raw score would), each kept whole when its missing units fit; then, while the total is below the budget
   less ``tolerance``, the single unit that brings it closest to the budget without passing it (the budget is a
   ceiling), most relevant per token first.
   The leader is a fusion of two rankings at their top: ranked by the size-damped key, a long definition that
   matches best is often reached only after shorter ones have taken the room it needs, and is then skipped
   whole. (Users'-words code tasks, ``spent`` split, Claude Code shape, written reads of 4K tokens and more,
   replayed offline from the eval's recorded requests: 255 of 280 without the leader, 258 with it, none lost;
   the raw score alone 254, the two rankings interleaved or fused by reciprocal rank 251-255, two leaders 257,
   docs/results.md.)
6. ``widen(budget, message_tokens, groups, ranks, toks)``: the budget of a code read whose ranking is unsure
   (no clear leader): with ``margin`` the key of the atom in place ``UNSURE_AT + 1`` over the first's, the budget
   grows linearly from 1x at a margin of ``UNSURE_FROM`` to ``1 + UNSURE_WIDEN`` at ``UNSURE_TO`` and above,
   at most the whole message (the issue's "keep more rather than cut the gold"), and for a read of
   ``WIDEN_CAP_FROM`` tokens or more at most ``WIDEN_CAP`` of it (the issue's bound on the median kept there;
   a budget the curve already set above it stays). Only when BM25 ranked the atoms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .scores import LexicalScorer, UnitReps
from .text import TokenizedText
from .units import Unit

__all__ = ["AtomIndex", "SIZE_POWER", "UNSURE_AT", "UNSURE_FROM", "UNSURE_TO", "UNSURE_WIDEN", "WIDEN_CAP",
           "WIDEN_CAP_FROM", "atom_scores", "atoms", "leader", "margin", "select_atoms", "widen"]

SIZE_POWER = 0.22  # step 5: an atom's rank is its score over its tokens to this power (0: score, 1: density)
# (users'-words code tasks, dev split, offline, gemma's counts, at a flat 0.3 budget: 0, 0.15 and 0.3 kept the
# needed definition in 76 of 84 reads, 0.45 in 73, 1 (density, as the units are ranked) in 65; with the mined
# sentences 0 in 81 of 95, 0.15 and 0.3 in 83. At the size-shaped budget (``budget.DEFAULT_CURVE``), `bench
# code-tasks` in four shapes, written tasks: 0.3 79/78/79/79 of 84, 0.22 80/79/80/80 (no read lost, seven won:
# a long definition fits the larger budget of a small read), 0.15 80/80/80/78)

UNSURE_AT, UNSURE_FROM, UNSURE_TO, UNSURE_WIDEN = 2, 0.4, 0.8, 0.20  # step 6
WIDEN_CAP_FROM, WIDEN_CAP = 16384, 0.30  # step 6: from this many tokens on, widened to at most this share
# (users'-words code tasks, spent split, Claude Code shape, written reads >= 4K, with the leader (step 5), replayed
# offline from the eval's recorded requests: 258 of 280 at median kept 0.386 / 0.319 / 0.286 (4-8K / 8-16K /
# >= 16K) without widening; up to 1.1x from a margin of 0.5 to 0.9 and capped, 260 at 0.407 / 0.333 / 0.294; this,
# 263 at 0.433 / 0.359 / 0.299; up to 1.3x 261 at 0.454 / 0.385; 1.2x for every read, 263 at 0.465 / 0.383 / 0.299:
# the margin keeps as much for less. Uncapped, 1.1x: Codex's raw reads of >= 16K tokens kept a median 0.307 of
# themselves. docs/results.md)


def atoms(n_units: int, groups: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Step 1: every unit in one atom, in order of their first unit."""
    seen = np.zeros(n_units, dtype=bool)
    out: list[tuple[int, ...]] = []
    for g in groups:
        g = tuple(k for k in g if not seen[k])
        if g:
            seen[list(g)] = True
            out.append(g)
    out += [(k,) for k in np.flatnonzero(~seen).tolist()]
    return tuple(sorted(out))


@dataclass(frozen=True)
class AtomIndex:
    """BM25 over atoms (step 2): the lexical scorer's index with one document per atom."""

    reps: UnitReps

    @classmethod
    def build(cls, tt: TokenizedText, units: Sequence[Unit], groups: Sequence[Sequence[int]]) -> "AtomIndex":
        docs = [Unit(k, units[g[0]].start_line, units[g[-1]].end_line, sum(units[i].tokens for i in g),
                     units[g[0]].kind) for k, g in enumerate(groups)]
        return cls(_BM25.represent(tt, docs))

    def score(self, query: str) -> np.ndarray:
        """Step 3: each atom's BM25 of the query's distinct terms."""
        return _BM25.score(self.reps, query)


_BM25 = LexicalScorer()


def atom_scores(scores: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Step 4: each atom's best unit score."""
    s = np.asarray(scores, dtype=np.float64)
    return np.array([float(s[list(g)].max()) for g in groups], dtype=np.float64)


def leader(ranks: np.ndarray) -> int | None:
    """Step 5: the atom with the highest raw score (the first of equals), or None when no atom scores above 0."""
    r = np.asarray(ranks, dtype=np.float64)
    if not len(r) or float(r.max()) <= 0:
        return None
    return int(np.argmax(r))


def select_atoms(groups: Sequence[Sequence[int]], ranks: np.ndarray, scores: np.ndarray, toks: np.ndarray,
                 budget: int, kept: set[int], tolerance: float = 0.02) -> list[int]:
    """Step 5: the kept unit indices, in order (``ranks``: one score per atom; ``scores``: per unit, for the
    fill)."""
    n = len(toks)
    keep = np.zeros(n, dtype=bool)
    keep[[i for i in kept if 0 <= i < n]] = True
    total = int(toks[keep].sum())
    key = _keys(groups, ranks, toks)
    order = np.lexsort((np.arange(len(groups)), -key)).tolist()
    lead = leader(ranks)
    if lead is not None:
        order = [lead] + [k for k in order if k != lead]
    for k in order:
        add = [u for u in groups[k] if not keep[u]]
        t = int(toks[add].sum()) if add else 0
        if add and total + t <= budget:
            keep[add] = True
            total += t
    tol = max(1, int(budget * tolerance))
    dens = np.asarray(scores, dtype=np.float64) / np.maximum(toks, 1)
    while total < budget - tol:
        rest = np.flatnonzero(~keep)
        fit = rest[total + toks[rest] <= budget]
        if not len(fit):
            break
        gap = np.abs(budget - (total + toks[fit]))
        best = int(fit[np.lexsort((fit, -dens[fit], gap))[0]])
        keep[best] = True
        total += int(toks[best])
    return np.flatnonzero(keep).tolist()


def _keys(groups: Sequence[Sequence[int]], ranks: np.ndarray, toks: np.ndarray) -> np.ndarray:
    """Steps 5-6: each atom's key, its score over its tokens to the ``SIZE_POWER``."""
    size = np.array([float(max(int(toks[list(g)].sum()), 1)) for g in groups])
    return np.asarray(ranks, dtype=np.float64) / size ** SIZE_POWER


def margin(groups: Sequence[Sequence[int]], ranks: np.ndarray, toks: np.ndarray) -> float | None:
    """Step 6: the ``UNSURE_AT``-th next atom's key over the first's (1: no leader; near 0: a clear one), or None
    when no atom scores above 0."""
    if not len(groups):
        return None
    key = np.sort(_keys(groups, ranks, toks))[::-1]
    if key[0] <= 0:
        return None
    return float(key[min(UNSURE_AT, len(key) - 1)] / key[0])


def widen(budget: int, message_tokens: int, groups: Sequence[Sequence[int]], ranks: np.ndarray | None,
          toks: np.ndarray, room: int | None = None) -> int:
    """Step 6: the budget, widened by how unsure the ranking is; unchanged without atom ranks. ``room``: the most
    the widening may take the budget to (the slot's context less the rest of the prompt and room for the answer:
    a prompt that fits unwidened is never widened past the context; one that does not is not bounded by it, as
    the widening does not decide whether it fits); never below ``budget``."""
    m = None if ranks is None else margin(groups, ranks, toks)
    if m is None:
        return budget
    x = min(max((m - UNSURE_FROM) / (UNSURE_TO - UNSURE_FROM), 0.0), 1.0)
    wide = round(budget * (1.0 + UNSURE_WIDEN * x))
    if message_tokens >= WIDEN_CAP_FROM:
        wide = min(wide, int(WIDEN_CAP * message_tokens))
    if room is not None and room >= budget:  # it fits unwidened: it still fits widened (one that does not is
        wide = min(wide, room)                # past the context with or without the widening: left as it is)
    return int(min(message_tokens, max(budget, wide)))
