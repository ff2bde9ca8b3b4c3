"""``--scorer head-attention``: the trained scorer head and the attention scorer from ONE drafter pass, fused.

Why: the two drafter scorers fail on different kinds of evidence. The head (``head.py``) finds latent needles
(evidence that shares no word with the question) that attention misses, and misses multi-value and multi-query
needles that attention finds (``docs/results.md``, "The trained head alone"). Run one after the other they
cost two passes over the message; both read the same forward, so this scorer asks the drafter for both taps at
once.

1. ``represent(tt, units)``: the attention scorer's reps (tokens, unit token spans, the message's session key,
   its tail); no pass.
2. ``score(reps, question)``, cold: one flash-on pass over ``content + "\\n\\n" + question`` keeps
   (a) the head's tap block (hidden states of every token) and (b) the global layers' post-RoPE keys of the
   content and queries of the question. The content's keys go to the attention scorer's ``KeyCache``, the
   drafter keeps the content's KV state under the attention session key, and the head's unit representations
   go into the reps: a later question (recall) decodes only itself, and an ``attention`` scorer that shares
   the ``KeyCache`` reads the same message warm.
3. Unit relevance of each: the head's (``head.py`` steps 2-4: unit means of the projected taps, the request
   tokens' query vector, sigmoid), times the unit's tokens; attention's (``attention.py`` steps 3-4: max over
   the selected heads and question tokens, peak mass per unit). When the message ends with its request,
   both read the request's last paragraph, as the attention scorer does alone.
4. Fused as shares (``compress/fusion.py``): ``HEAD_WEIGHT * share(head) + (1 - HEAD_WEIGHT) *
   share(attention)``. ``HEAD_WEIGHT`` was chosen on a tuning set by the gold found in messages that were
   actually compressed, the criterion ``--scorer hybrid``'s weight was chosen by (``docs/results.md``, "How
   the fixed weights and bounds were chosen").
5. Content plus question longer than one drafter context: one windowed pass (``AttentionScorer.windows``: a
   slice of the content and the whole question per window) gives attention and the head's taps alike, so a
   message longer than the context costs one pass, not one for each scorer.
6. The same text scored again for another request (another session reading the same file, a client's retry):
   the reps are new, but the content's head taps are kept per message key (``taps``, an LRU bounded in bytes
   like the attention's ``KeyCache``) beside its keys and KV state, so the pass reads only the question.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pflash_proxy.compress.fusion import shares

from .attention import (QUERY_SEP, AttentionScorer, KeyCache, last_paragraph, peak_mass, request_tail,
                        token_relevance)
from .head import relevance, request_vector, unit_reps
from .probes import RequestProbe, ScorerHeadWeights
from .runtime import DrafterError

if TYPE_CHECKING:
    from pflash_proxy.compress.scores import UnitReps
    from pflash_proxy.compress.text import TokenizedText
    from pflash_proxy.compress.units import Unit

HEAD_WEIGHT = 0.3


class HeadAttentionScorer:
    """``Scorer`` protocol: the scorer head and calibrated attention, read from one drafter pass, fused."""

    name = "head-attention"

    def __init__(self, attention: AttentionScorer, head: ScorerHeadWeights, request: RequestProbe | None = None,
                 weight: float = HEAD_WEIGHT, query_tokens: int = 128, taps: KeyCache | None = None) -> None:
        d = attention.drafter
        for p in (head, request):
            if p is not None and (p.meta.d != d.n_embd or not 0 <= p.meta.tap_block < d.n_layer - 1):
                raise DrafterError(f"{p.meta.path} reads block {p.meta.tap_block} width {p.meta.d}; the drafter "
                                   f"has {d.n_layer} blocks of width {d.n_embd}")
        if request is not None and request.meta.tap_block != head.meta.tap_block:
            raise DrafterError(f"the request probe reads block {request.meta.tap_block}, the head block "
                               f"{head.meta.tap_block}: one pass cannot serve both")
        if not 0.0 <= weight <= 1.0:
            raise ValueError("weight must be in [0, 1]")
        self.attention, self.head, self.request, self.weight = attention, head, request, weight
        self.taps = taps if taps is not None else KeyCache()  # step 6: content taps per message key
        self.tap = head.meta.tap_block
        self.query_tokens = request.query_tokens if request is not None else query_tokens

    @property
    def heads(self) -> frozenset[tuple[int, int]] | None:  # the attention heads it reads (``/pflash/stats``)
        return self.attention.heads

    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps:
        reps = self.attention.represent(tt, units)
        return dataclasses.replace(reps, scorer=self.name, payload={**reps.payload, "head": None})

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        head, attention = self.unit_scores(reps, query)
        return self.weight * shares(head) + (1.0 - self.weight) * shares(attention)

    def unit_scores(self, reps: UnitReps, query: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps 2-3: the (head, attention) unit scores of one question, float64."""
        p, att, d = reps.payload, self.attention, self.attention.drafter
        tail = request_tail(p, query)
        if tail:
            query = last_paragraph(query)
        content, session = p["tokens"], p["session"]
        qt = d.tokenize(QUERY_SEP + query)
        n = len(content)
        if n + len(qt) > d.window:  # step 5: the attention's windows, carrying the head's taps too
            a, rows = att.windows(content, qt, tail, taps=(self.tap,))
            tap = rows[self.tap]
            if p["head"] is None:
                p["head"] = unit_reps(self.head, tap[:n], p["starts"], p["ends"])
            rel = token_relevance(a, att.heads)
            return self._head(reps, tap[n:]), peak_mass(rel, p["starts"], p["ends"])
        with att.session_lock(session):  # a concurrent read of the same text finishes (and keeps its taps) first
            if p["head"] is None:  # step 6: the same text read before (another request): its taps are kept
                kept = self.taps.get(f"{session}:tap{self.tap}")
                if kept is not None and len(kept[self.tap]) == n:
                    p["head"] = unit_reps(self.head, kept[self.tap], p["starts"], p["ends"])
            a, r = att.read(content, qt, session, tail, taps=(self.tap,), cold=p["head"] is None)
            tap = r.taps[self.tap]
            if r.start == 0:  # the content was read in this pass
                p["head"] = unit_reps(self.head, tap[:n], p["starts"], p["ends"])
                self.taps.put(f"{session}:tap{self.tap}", {self.tap: tap[:n].copy()})
        rel = token_relevance(a, att.heads)
        return self._head(reps, tap[n - r.start:]), peak_mass(rel, p["starts"], p["ends"])

    def _head(self, reps: UnitReps, qtap: np.ndarray) -> np.ndarray:
        """Step 3, the head's half: per unit, its relevance in (0, 1) times its tokens."""
        q = request_vector(self.head, self.request, qtap, self.query_tokens)
        p = relevance(self.head, reps.payload["head"], q)
        return (p * np.asarray(reps.unit_tokens, np.float32)).astype(np.float64)
