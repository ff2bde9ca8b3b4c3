"""Query-factorised scorer head and the ``head`` Scorer stage.

The head file (``probes.load_scorer_head``) holds a LayerNorm(d), two projections ``W_u, W_q`` of shape
``(r, d)`` with biases, and a scalar ``scale`` and ``bias``. For a tap ``X`` (tokens, d):

1. ``x_t = LayerNorm(X_t)``, then ``y_t = W_u x_t`` per token, in row chunks ((tokens, r), small).
2. Unit representation (question-independent, cached for recall): ``u = mean_{t in unit} y_t + b_u``
   (a float64 prefix sum over tokens, so each unit costs O(r); an empty span gives ``b_u``).
3. Query representation: the request tokens are the query's tokens whose request-probe probability is at
   least the probe's threshold (all query tokens without a request probe, or when none passes), of which the
   last ``query_tokens`` are kept; ``q = W_q mean_t x_t + b_q``.
4. Relevance ``p = sigmoid(scale * (u . q) / sqrt(r) + bias)`` in (0, 1), a per-token relevance density.
   ``score`` returns the unit mass ``p * tokens`` so that the pipeline's density (score / tokens) is ``p``.

``HeadScorer.score(reps, question)`` appends the question to the message's cached drafter state (only the new
tokens are decoded) and never re-reads the message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import nn
from .probes import RequestProbe, ScorerHeadWeights
from .runtime import DrafterError
from .segment import unit_token_spans
from .taps import ProbeTaps, make_reps

if TYPE_CHECKING:
    from pflash_proxy.compress.scores import UnitReps
    from pflash_proxy.compress.text import TokenizedText
    from pflash_proxy.compress.units import Unit

QUERY_SEP = "\n\n"


def projected(w: ScorerHeadWeights, tap: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Step 1: ``weight @ LayerNorm(tap_t)`` for every token, (tokens, r) float32."""
    tap = np.asarray(tap, dtype=np.float32)
    out = np.empty((tap.shape[0], weight.shape[0]), np.float32)
    gw_t = np.ascontiguousarray((weight * w.norm_weight).T)
    for sl in nn.chunked_rows(tap.shape[0]):
        out[sl] = nn.ln_linear(tap[sl], w.norm_weight, w.norm_bias, w.meta.eps, weight, 0.0, gw_t)
    return out


def unit_reps(w: ScorerHeadWeights, tap: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Step 2: (units, r) float32 mean-pooled unit representations."""
    y = projected(w, tap, w.unit_weight)
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    n = ends - starts
    cs = np.zeros((y.shape[0] + 1, y.shape[1]), np.float64)
    np.cumsum(y, axis=0, dtype=np.float64, out=cs[1:])
    sums = (cs[ends] - cs[starts]).astype(np.float32)
    return (sums / np.maximum(n, 1)[:, None] + w.unit_bias).astype(np.float32)


def select_request(n: int, request_logits: np.ndarray | None, threshold: float, query_tokens: int) -> np.ndarray:
    """Step 3: indices of the request tokens among ``n`` query tokens."""
    idx = np.arange(n)
    if request_logits is not None:
        hit = np.flatnonzero(nn.sigmoid(request_logits) >= threshold)
        if hit.size:
            idx = hit
    return idx[-query_tokens:] if query_tokens > 0 else idx


def query_rep(w: ScorerHeadWeights, tap_rows: np.ndarray) -> np.ndarray:
    """Step 3: (r,) query representation from the request tokens' taps."""
    if tap_rows.shape[0] == 0:
        raise DrafterError("empty request span")
    x = nn.layer_norm(np.asarray(tap_rows, np.float32), w.norm_weight, w.norm_bias, w.meta.eps)
    return (w.query_weight @ x.mean(axis=0) + w.query_bias).astype(np.float32)


def request_vector(w: ScorerHeadWeights, request: RequestProbe | None, tap_rows: np.ndarray, query_tokens: int
                   ) -> np.ndarray:
    """Step 3 from the query's taps: the request probe picks the request tokens, then ``query_rep``."""
    logits = request.forward(tap_rows) if request is not None else None
    thr = request.threshold if request is not None else 0.5
    return query_rep(w, tap_rows[select_request(len(tap_rows), logits, thr, query_tokens)])


def relevance(w: ScorerHeadWeights, reps: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Step 4: per-unit relevance in (0, 1)."""
    s = np.float32(w.scale) * (reps @ q) / np.float32(np.sqrt(w.rank)) + np.float32(w.bias)
    return nn.sigmoid(s)


class HeadScorer:
    """``Scorer`` protocol (``represent`` / ``score``) backed by the scorer head."""

    name = "head"

    def __init__(self, taps: ProbeTaps, head: ScorerHeadWeights, request: RequestProbe | None = None,
                 query_tokens: int = 128) -> None:
        for p in (head, request):
            if p is not None and (p.meta.tap_block != taps.tap_block or p.meta.d != taps.drafter.n_embd):
                raise DrafterError(f"{p.meta.path} reads block {p.meta.tap_block} width {p.meta.d}, drafter taps "
                                   f"block {taps.tap_block} width {taps.drafter.n_embd}")
        self.taps, self.head, self.request = taps, head, request
        self.query_tokens = request.query_tokens if request is not None else query_tokens

    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps:
        d = self.taps.draft(tt.text)
        s, e = unit_token_spans(d.token_line, units)
        reps = unit_reps(self.head, d.tap, s, e)
        return make_reps(self.name, [u.tokens for u in units], {"reps": reps, "session": d.session,
                                                                 "tokens": d.tokens})

    def query_vector(self, reps: UnitReps, query: str) -> np.ndarray:
        p = reps.payload
        qt = self.taps.drafter.tokenize(QUERY_SEP + query)
        stream = np.concatenate([p["tokens"], qt])
        r = self.taps.drafter.trace(stream, session=p["session"], taps=(self.taps.tap_block,), save=False)
        tap = r.taps[self.taps.tap_block][len(p["tokens"]) - r.start:]
        return request_vector(self.head, self.request, tap, self.query_tokens)

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        q = self.query_vector(reps, query)
        p = relevance(self.head, reps.payload["reps"], q)
        return (p * np.asarray(reps.unit_tokens, np.float32)).astype(np.float64)
