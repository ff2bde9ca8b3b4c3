"""Unit relevance: the ``Scorer`` interface and the default lexical (BM25) scorer.

A scorer splits its work in two: ``represent`` reads the message once and returns
question-independent ``UnitReps`` (cacheable, stored for recall);
``score`` rates those units against any question without re-reading the message.

The reps' format (what a session stores for recall, ``sessions/index/codec.py`` writes it as tagged JSON, never a
pickle): ``scorer``, the name of the scorer that made them (``Scorer.name``); ``version``, the layout of the
payload (``REPS_VERSION``: bump it when a built-in scorer changes what its payload holds); ``n_units`` and
``unit_tokens``; ``payload``, plain data only (None, numbers, strings, lists, tuples, dicts, numeric numpy
arrays, and the package's own reps classes: ``UnitReps``, the lexical index, ``links.ReferenceLinks``). Only
the scorer of that name reads a payload of the current version; recall re-scores any other from its text
(``recall.RecallGate``).

Algorithm (``LexicalScorer``):
1. Terms (``lexicon.span_terms``): word runs split at ``_`` and camelCase humps
   (``parseHTTPHeader`` -> ``parse http header``), lowercased, plus each compound
   identifier whole (``parse_header`` -> ``parseheader``); stopwords and single
   letters dropped.
2. ``represent``: map every unit's terms to ids of a per-message vocabulary (unique
   terms, Unicode-lowercased) and build the BM25 matrix with one document per unit,
   vectorised: tf per (term, unit) by sorting ``term * n_units + unit`` keys; weights
   are the ``bm25s`` Lucene variant, ``idf = ln(1 + (N - df + .5) / (df + .5))`` times
   ``tf / (tf + k1 * (1 - b + b * len / avg_len))`` with k1=1.5, b=0.75 (a test checks
   equality with ``bm25s.BM25``).  Only the sparse CSC matrix and the vocabulary are
   kept, so reps store small and fast.
3. ``score``: the query's distinct known terms; a unit's score is the sum of its
   weights for those terms (``np.bincount`` over the matrix columns).  A query sharing
   no term with the message scores all zeros.
3b. With ``hops`` (multi-hop questions: "every variable assigned 12345, directly or through others"), the
   query's *rare* terms (in at most ``RARE_UNITS`` units: names, keys, values) are followed from line to line:
   a line holding one brings its own new rare terms, each weighted ``decay / (their number)`` times its
   parent's, up to ``hops`` times; a line with more than ``LINK_TERMS`` new rare terms is prose and is not
   followed. The reached terms score like query terms at their weight, so ``VAR_B = VAR_A`` is found from
   ``VAR_A = 12345`` and ranks below it.
3c. With ``forms`` (the default), in a message that is not code: a question's word also matches its other word
   forms (``lexicon.word_forms``: "PPP" / "PPPs", "populated" / "population") in the prose units
   (``PROSE_KINDS``; which units those are is kept in the reps); a unit counts the best of the word's forms it
   holds, never two of them. Code, records and diffs score as before.
4. ``density(scores, tokens)`` = score / max(tokens, 1): relevance per token.
5. ``validate_scores`` rejects wrong length, non-1-D, NaN, inf and negative values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import numpy.typing as npt

from .kinds import ContentKind
from .lexicon import hash_tokens, span_hashes, span_term_ids_grouped, text_terms, word_forms
from .text import TokenizedText
from .units import Unit

__all__ = ["InvalidScores", "LexicalScorer", "REPS_VERSION", "Scorer", "UnitReps", "density", "terms", "validate_scores"]


PROSE_KINDS = frozenset((ContentKind.PROSE, ContentKind.CHAT, ContentKind.UNKNOWN))  # step 3c
CODE_MESSAGE = 0.5  # step 3c: a message whose code units hold this share of its tokens is code (``routed.is_code``)
RARE_UNITS = 3  # step 3b: a term in at most this many units names something (a variable, a key, a value)
LINK_TERMS = 4  # step 3b: a line bringing more new rare terms than this is prose, not a reference


class InvalidScores(ValueError):
    """A scorer returned scores that cannot be used."""


REPS_VERSION = 1  # the payload layouts of the built-in scorers (module docstring); 1: reps stored without a version


@dataclass(frozen=True)
class UnitReps:
    """Question-independent unit representations, in the stored format of the module docstring."""

    scorer: str
    n_units: int
    unit_tokens: np.ndarray
    payload: Any
    version: int = 1  # the payload's layout (``REPS_VERSION`` when made now; 1 for reps stored before the field)


@runtime_checkable
class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps: ...

    def score(self, reps: UnitReps, query: str) -> np.ndarray: ...


STOPWORDS = frozenset("""
a an the and or but if then else of to in on at by for with from as is are was were be been being it its this
that these those there here what which who whom whose when where why how do does did done not no nor so than too
very can could should would will shall may might must i me my we our you your he him his she her they them their
about into over under again further once all any both each few more most other some such only own same just also
""".split())


def terms(text: str) -> list[str]:
    """Step 1: the lowercased lexical terms of ``text`` (stopwords kept out)."""
    return [w for w in text_terms(text) if not _is_stop(w)]


_STOP_HASHES = np.unique(hash_tokens(" ".join(sorted(STOPWORDS)).encode())[0])
# stopwords and single lowercase letters (``_is_stop``), dropped by hash in ``represent``
_DROP_HASHES = np.unique(np.concatenate((_STOP_HASHES, hash_tokens(" ".join("abcdefghijklmnopqrstuvwxyz").encode())[0])))


def _is_stop(w: str) -> bool:
    """Stopwords and single letters (possessive ``'s``, loop variables) carry no relevance."""
    return w in STOPWORDS or (len(w) == 1 and w.isalpha())


def density(scores: np.ndarray, tokens: np.ndarray | Sequence[int]) -> np.ndarray:
    """Relevance per token (step 4)."""
    return np.asarray(scores, dtype=np.float64) / np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)


def validate_scores(arr: npt.ArrayLike, n: int) -> np.ndarray:
    """Step 5: a float64 copy of ``arr`` or ``InvalidScores``."""
    try:
        a = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InvalidScores(f"scores are not numeric: {e}") from e
    if a.ndim != 1 or a.shape[0] != n:
        raise InvalidScores(f"expected {n} scores, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise InvalidScores("scores contain NaN or inf")
    if (a < 0).any():
        raise InvalidScores("scores contain negative values")
    return a


@dataclass(frozen=True)
class _LexicalIndex:
    vocab: np.ndarray  # sorted unique 64-bit term hashes
    data: np.ndarray  # BM25 weight per (term, unit) entry, grouped by term
    indices: np.ndarray  # unit of each entry
    indptr: np.ndarray  # entries of term j: indptr[j]:indptr[j + 1]
    links: "_Links | None" = None  # with hops: which line holds which term (step 3b)
    prose: np.ndarray | None = None  # step 3c: 1 for the prose units of a message that is not code, else 0


def _term_hashes(data: bytes, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    h, unit, single = span_hashes(data, spans)
    keep = ~single & ~np.isin(h, _STOP_HASHES)
    return h[keep], unit[keep]


@dataclass(frozen=True)
class LexicalScorer:
    """BM25 over unit terms (module docstring, steps 1-3)."""

    k1: float = 1.5
    b: float = 0.75
    name: str = "lexical"
    hops: int = 0  # step 3b: reference hops followed from the query's rare terms (0 = plain BM25)
    hop_decay: float = 0.5
    forms: bool = True  # step 3c: a question's word matches its other forms in prose units

    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps:
        n_units = len(units)
        toks = np.fromiter((u.tokens for u in units), dtype=np.int64, count=n_units)
        data = tt.text.encode("utf-8")
        nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        line_start = np.concatenate(([0], nl + 1, [len(data)]))[: len(tt.lines) + 1]
        line_start[len(tt.lines)] = len(data)
        us = np.fromiter((u.start_line for u in units), dtype=np.int64, count=n_units)
        vocab, _, _, sids, sdocs = span_term_ids_grouped(data, line_start[us], _DROP_HASHES)
        v = len(vocab)
        if len(sids):
            sk = sids * n_units + sdocs  # already sorted: grouped by term id, then unit
            new = np.empty(len(sk), dtype=bool)
            new[0] = True
            np.not_equal(sk[1:], sk[:-1], out=new[1:])
            first = np.arange(len(sk))[new]
            keys = sk[first]
            tf = np.diff(np.concatenate((first, [len(sk)]))).astype(np.float64)
        else:
            keys, tf = np.zeros(0, np.int64), np.zeros(0)
        term, doc = keys // max(n_units, 1), keys % max(n_units, 1)
        doc_len = np.bincount(doc, weights=tf, minlength=n_units)
        df = np.bincount(term, minlength=v).astype(np.float64)
        idf = np.log1p((n_units - df + 0.5) / (df + 0.5))
        avg = max(float(doc_len.mean()) if n_units else 0.0, 1e-9)
        w = idf[term] * tf / (tf + self.k1 * (1 - self.b + self.b * doc_len[doc] / avg))
        indptr = np.searchsorted(term, np.arange(v + 1))
        links = _Links.build(data, line_start, vocab) if self.hops else None
        index = _LexicalIndex(vocab, w, doc.astype(np.int64), indptr.astype(np.int64), links,
                              _prose_units(units, toks) if self.forms else None)
        return UnitReps(self.name, n_units, toks, index, REPS_VERSION)

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        if reps.scorer != self.name or not isinstance(reps.payload, _LexicalIndex):
            raise TypeError(f"reps from scorer {reps.scorer!r}, not {self.name!r}")
        idx: _LexicalIndex = reps.payload
        out = np.zeros(reps.n_units, dtype=np.float64)
        q = query.encode("utf-8")
        qh, _ = _term_hashes(q, [(0, len(q))])
        ids = _known(idx.vocab, np.unique(qh))
        if self.forms and idx.prose is not None and idx.prose.any():
            _add_forms(out, idx, query)
        if len(ids) == 0:
            return out
        weights = {int(i): 1.0 for i in ids}
        if self.hops and idx.links is not None:
            weights.update(idx.links.expand(ids, idx, self.hops, self.hop_decay))
        terms = np.fromiter(weights, dtype=np.int64, count=len(weights))
        starts, ends = idx.indptr[terms], idx.indptr[terms + 1]
        sel = np.concatenate([np.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist())])
        if len(sel):  # one bincount over every selected entry, each weighted by its term's weight
            w = np.repeat(np.fromiter(weights.values(), dtype=np.float64, count=len(weights)), ends - starts)
            out += np.bincount(idx.indices[sel], weights=idx.data[sel] * w, minlength=reps.n_units)[: reps.n_units]
        return out


def _prose_units(units: Sequence[Unit], toks: np.ndarray) -> np.ndarray:
    """Step 3c: 1 per prose unit (``PROSE_KINDS``) of a message that is not code, else 0 (uint8)."""
    code = sum(int(t) for u, t in zip(units, toks) if u.kind == ContentKind.CODE)
    total = int(toks.sum())
    if total == 0 or code >= CODE_MESSAGE * total:
        return np.zeros(len(units), dtype=np.uint8)
    return np.fromiter((u.kind in PROSE_KINDS for u in units), dtype=np.uint8, count=len(units))


def _add_forms(out: np.ndarray, idx: _LexicalIndex, query: str) -> None:
    """Step 3c: each query word counts, in a prose unit, as the best of its forms the unit holds (``word_forms``):
    ``out`` gains, per unit, what the best form's weight adds over the word's own."""
    assert idx.prose is not None
    words = sorted({w for w in terms(query) if w.isalpha()})
    if not words:
        return
    asked = set(words)
    prose = idx.prose.astype(bool)
    for word in words:
        forms = [f for f in word_forms(word) if f not in asked]
        if not forms:
            continue
        fh, _, _ = hash_tokens(" ".join([word, *forms]).encode("utf-8"))
        k = np.searchsorted(idx.vocab, fh).clip(0, max(len(idx.vocab) - 1, 0))
        found = idx.vocab[k] == fh if len(idx.vocab) else np.zeros(len(fh), bool)
        if not found[1:].any():
            continue
        own = np.zeros(len(out))
        if found[0]:
            a, b = idx.indptr[k[0]], idx.indptr[k[0] + 1]
            own[idx.indices[a:b]] = idx.data[a:b]
        best = own.copy()
        for j in np.flatnonzero(found[1:]) + 1:
            a, b = idx.indptr[k[j]], idx.indptr[k[j] + 1]
            units = idx.indices[a:b]
            np.maximum.at(best, units, np.where(prose[units], idx.data[a:b], 0.0))
        out += best - own


def _known(vocab: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Ids in the sorted ``vocab`` of those of ``hashes`` it holds."""
    k = np.searchsorted(vocab, hashes)
    ok = k < len(vocab)
    k, hashes = k[ok], hashes[ok]
    known: np.ndarray = k[vocab[k] == hashes].astype(np.int64)
    return known


@dataclass(frozen=True)
class _Links:
    """Which lines hold which terms, for step 3b (following references from line to line)."""
    line_ptr: np.ndarray  # terms of line j: line_terms[line_ptr[j]:line_ptr[j + 1]] (unit-vocabulary ids)
    line_terms: np.ndarray
    term_ptr: np.ndarray  # lines of term i: term_lines[term_ptr[i]:term_ptr[i + 1]]
    term_lines: np.ndarray

    @classmethod
    def build(cls, data: bytes, line_start: np.ndarray, vocab: np.ndarray) -> "_Links":
        lv, ids, line, sids, slines = span_term_ids_grouped(data, line_start[:-1], _DROP_HASHES)
        to_unit = np.searchsorted(vocab, lv).clip(0, max(len(vocab) - 1, 0))  # same text: same hashes
        n_lines = len(line_start) - 1
        line_ptr = np.searchsorted(line, np.arange(n_lines + 1))
        # lines of each unit-vocabulary term, de-duplicated (a term twice on a line counts once)
        keys = np.unique(to_unit[sids] * max(n_lines, 1) + slines) if len(sids) else np.zeros(0, np.int64)
        t, ln = keys // max(n_lines, 1), keys % max(n_lines, 1)
        term_ptr = np.searchsorted(t, np.arange(len(vocab) + 1))
        return cls(line_ptr.astype(np.int64), to_unit[ids].astype(np.int64), term_ptr.astype(np.int64),
                   ln.astype(np.int64))

    def expand(self, ids: np.ndarray, idx: "_LexicalIndex", hops: int, decay: float) -> dict[int, float]:
        """Step 3b: weights of the rare terms reached from the query's rare terms through short lines."""
        df = np.diff(idx.indptr)
        seen = set(int(i) for i in ids)
        frontier = {int(i): 1.0 for i in ids if df[i] <= RARE_UNITS}
        found: dict[int, float] = {}
        for _ in range(hops):
            new: dict[int, float] = {}
            for t, w in frontier.items():
                for line in self.term_lines[self.term_ptr[t]:self.term_ptr[t + 1]].tolist():
                    terms = {int(x) for x in self.line_terms[self.line_ptr[line]:self.line_ptr[line + 1]]
                             if x not in seen and df[x] <= RARE_UNITS}
                    if not terms or len(terms) > LINK_TERMS:
                        continue  # a line of many rare words is prose, not a reference
                    share = w * decay / len(terms)
                    for x in terms:
                        new[x] = max(new.get(x, 0.0), share)
            if not new:
                break
            seen |= new.keys()
            found.update(new)
            frontier = new
        return found
