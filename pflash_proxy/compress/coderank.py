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
2. ``AtomIndex.build(tt, units, atoms)``: BM25 (k1 1.5, b 0.75, the Lucene idf) with one document per atom,
   over the lexical scorer's terms (``lexicon.span_terms``: words, identifier parts, whole compound
   identifiers; stopwords and single letters dropped). (A suffix stemmer lost on the dev split: 74 of 84
   reads against 76, an S-stemmer 74 too: it merges ``token``/``tokenize``/``tokenizer``, whose idf falls.)
3. ``AtomIndex.score(query)``: the atoms' BM25 of the query's terms (each distinct term once).
4. ``atom_scores(scores, atoms)``: for a scorer with no terms (a drafter's relevance per unit), an atom is as
   relevant as its best unit.
5. ``select_atoms``: the pipeline's selection in code (``pipeline`` step 4): the always-kept units first; then
   the atoms by ``score / tokens ** SIZE_POWER`` (a long definition that matches is not outranked by every
   short one that mentions a word once, as pure density would do, nor does a long one win on length alone, as
   the raw score would), each kept whole when its missing units fit; then, while the total is below the budget
   less ``tolerance``, the single unit that brings it closest to the budget without passing it (the budget is a
   ceiling), most relevant per token first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .lexicon import span_terms
from .scores import STOPWORDS
from .text import TokenizedText
from .units import Unit

__all__ = ["AtomIndex", "SIZE_POWER", "atom_scores", "atoms", "select_atoms"]

SIZE_POWER = 0.3  # step 5: an atom's rank is its score over its tokens to this power (0: score, 1: density)
# (users'-words code tasks, dev split, offline, gemma's counts: 0, 0.15 and 0.3 kept the needed definition in 76 of
# 84 reads, 0.45 in 73, 1 (density, as the units are ranked) in 65; with the mined sentences 0 in 81 of 95, 0.15
# and 0.3 in 83)

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


def _terms(data: bytes, spans: list[tuple[int, int]], cache: dict[bytes, str | None]) -> list[list[str]]:
    """Step 2: the terms of each byte span (stopwords and single letters out)."""
    out = []
    for terms in span_terms(data, spans):
        row = []
        for t in terms:
            s = cache.get(t, "")
            if s == "":
                w = t.decode("utf-8", "replace")
                s = cache[t] = None if (w in STOPWORDS or (len(w) == 1 and w.isalpha())) else w
            if s is not None:
                row.append(s)
        out.append(row)
    return out


@dataclass(frozen=True)
class AtomIndex:
    """BM25 over atoms (step 2): per term, the atoms holding it and their weights."""

    postings: dict[str, tuple[np.ndarray, np.ndarray]]  # term -> (atom indices, BM25 weights)
    n_atoms: int

    @classmethod
    def build(cls, tt: TokenizedText, units: Sequence[Unit], groups: Sequence[Sequence[int]],
              k1: float = 1.5, b: float = 0.75) -> "AtomIndex":
        data = tt.text.encode("utf-8")
        off = np.zeros(len(tt.lines) + 1, dtype=np.int64)
        np.cumsum([len(line.encode("utf-8")) for line in tt.lines], out=off[1:])
        spans = [(int(off[units[g[0]].start_line]), int(off[units[g[-1]].end_line])) for g in groups]
        docs = _terms(data, spans, {})
        vocab: dict[str, int] = {}
        ids = [np.fromiter((vocab.setdefault(t, len(vocab)) for t in d), dtype=np.int64, count=len(d))
               for d in docs]
        n = len(docs)
        if not vocab or n == 0:
            return cls({}, n)
        doc = np.repeat(np.arange(n), [len(d) for d in ids])
        key, tf = np.unique(np.concatenate(ids) * n + doc, return_counts=True)
        term, atom = key // n, key % n
        length = np.bincount(doc, minlength=n).astype(np.float64)
        avg = max(float(length.mean()), 1e-9)
        df = np.bincount(term, minlength=len(vocab)).astype(np.float64)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        w = idf[term] * tf / (tf + k1 * (1 - b + b * length[atom] / avg))
        cut = np.searchsorted(term, np.arange(len(vocab) + 1))
        names = list(vocab)
        return cls({names[j]: (atom[cut[j]:cut[j + 1]], w[cut[j]:cut[j + 1]]) for j in range(len(vocab))}, n)

    def score(self, query: str) -> np.ndarray:
        """Step 3: each atom's BM25 of the query's distinct terms."""
        out = np.zeros(self.n_atoms, dtype=np.float64)
        q = query.encode("utf-8")
        for t in set(_terms(q, [(0, len(q))], {})[0]):
            hit = self.postings.get(t)
            if hit is not None:
                np.add.at(out, hit[0], hit[1])
        return out


def atom_scores(scores: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Step 4: each atom's best unit score."""
    s = np.asarray(scores, dtype=np.float64)
    return np.array([float(s[list(g)].max()) for g in groups], dtype=np.float64)


def select_atoms(groups: Sequence[Sequence[int]], ranks: np.ndarray, scores: np.ndarray, toks: np.ndarray,
                 budget: int, kept: set[int], tolerance: float = 0.02) -> list[int]:
    """Step 5: the kept unit indices, in order (``ranks``: one score per atom; ``scores``: per unit, for the
    fill)."""
    n = len(toks)
    keep = np.zeros(n, dtype=bool)
    keep[[i for i in kept if 0 <= i < n]] = True
    total = int(toks[keep].sum())
    size = np.array([float(max(int(toks[list(g)].sum()), 1)) for g in groups])
    key = np.asarray(ranks, dtype=np.float64) / size ** SIZE_POWER
    for k in np.lexsort((np.arange(len(groups)), -key)).tolist():
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
