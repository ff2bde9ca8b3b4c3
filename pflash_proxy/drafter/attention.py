"""Training-free drafter scorer (``--scorer attention``): the attention the request pays to each unit.

This is the Speculative Prefill idea (arXiv 2502.02789), the first PFlash's scorer:

1. Global layers: only layers that attend over the whole context are read (a sliding-window layer sees just
   its window). From the drafter's GGUF metadata: ``<arch>.full_attention_interval`` n (Qwen3.5/Qwen3-Next:
   blocks with ``(i + 1) % n == 0``), else ``<arch>.attention.sliding_window_pattern`` (a per-layer bool array,
   true = sliding, or an int n: blocks with ``i % n == n - 1``), else llama.cpp's built-in pattern for the
   architecture (gemma3: 6, so blocks 5, 11, 17 of gemma-3-270m), else every block when there is no sliding
   window at all. A configured list overrides this.
2. ``represent(tt, units)``: tokenize the message, decode it once with flash attention OFF (so
   ``kq_soft_max-L`` exists) and keep the drafter's KV state under the message's session key; the reps hold
   the tokens, the unit token spans and that key -- nothing that depends on a question.
3. ``score(reps, question)``: the question is placed after the content (``"\\n\\n" + question``) and only its
   tokens are decoded on top of the cached state; for each global layer the softmax rows of the question tokens
   are summed over heads and question tokens, and divided by ``heads * question tokens`` (the mean attention a
   question token's head pays to each content token); the layers are averaged.
4. A unit's score is the sum over its tokens (attention mass, non-negative); the pipeline ranks by density
   (mass / tokens). Content plus question longer than one context is scored window by window
   (``AttentionScorer.attention_windows``), each window holding a slice of the content and the question.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .runtime import Drafter, DrafterError
from .segment import token_lines, unit_token_spans
from .stages import make_reps, text_key

QUERY_SEP = "\n\n"
BUILTIN_SWA_PATTERN = {"gemma3": 6, "gemma2": 2, "cohere2": 4}  # llama.cpp set_swa_pattern defaults


def _parse(v: Any) -> Any:
    """Metadata as llama.cpp prints it (``llama_model_meta_val_str``) or as gguf returns it."""
    if not isinstance(v, str):
        return v
    t = v.strip().lower()
    if t.startswith("["):
        return [x.strip() in ("true", "1") for x in t.strip("[]").split(",") if x.strip()]
    try:
        return int(t)
    except ValueError:
        return t


def global_layers(meta: Callable[[str], Any], n_layer: int, override: Sequence[int] | None = None
                  ) -> tuple[int, ...]:
    """Step 1: the blocks whose attention spans the whole context; ``meta(key)`` reads drafter metadata."""
    if override:
        return tuple(sorted(int(i) for i in override))
    arch = str(meta("general.architecture"))
    interval = _parse(meta(f"{arch}.full_attention_interval"))
    if interval:
        return tuple(i for i in range(n_layer) if (i + 1) % int(interval) == 0)
    if not _parse(meta(f"{arch}.attention.sliding_window")):
        return tuple(range(n_layer))
    pat = _parse(meta(f"{arch}.attention.sliding_window_pattern"))
    if isinstance(pat, list):
        return tuple(i for i, swa in enumerate(pat[:n_layer]) if not swa)
    period = int(pat) if pat else BUILTIN_SWA_PATTERN.get(arch, 0)
    if period <= 0:
        raise DrafterError(f"cannot tell the global-attention layers of a {arch} drafter: configure them")
    return tuple(i for i in range(n_layer) if i % period == period - 1)


def mean_attention(att: dict[int, np.ndarray], n_head: int, n_query: int) -> np.ndarray:
    """Step 3: mean over layers of (summed softmax rows) / (heads * query tokens)."""
    if not att:
        raise DrafterError("no attention layers captured")
    out = np.mean(np.stack([a for a in att.values()]), axis=0) / np.float32(max(n_head * n_query, 1))
    if not np.isfinite(out).all():
        raise DrafterError("non-finite attention")
    return out.astype(np.float32)


def unit_mass(token_scores: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Step 4: sum of per-token scores over each unit's span, float64."""
    cs = np.concatenate(([0.0], np.cumsum(token_scores, dtype=np.float64)))
    return np.maximum(cs[ends] - cs[starts], 0.0)


class AttentionScorer:
    """``Scorer`` protocol from the drafter's global-layer attention."""

    name = "attention"

    def __init__(self, drafter: Drafter, layers: Sequence[int] | None = None) -> None:
        self.drafter = drafter
        self.layers = global_layers(drafter.meta, drafter.n_layer, layers)

    def token_attention(self, content: np.ndarray, question: str, session: str | None = None) -> np.ndarray:
        """Per content token: mean attention the question pays to it (steps 2-3)."""
        qt = self.drafter.tokenize(QUERY_SEP + question)
        if len(content) + len(qt) <= self.drafter.window:
            r = self.drafter.trace(np.concatenate([content, qt]), session=session, attend_from=len(content),
                                   attn_layers=self.layers, flash=False, save=False)
            att = r.attention
        else:
            att = self.attention_windows(content, qt)
        return mean_attention(att, self.drafter.n_head, len(qt))

    def attention_windows(self, content: np.ndarray, query: np.ndarray) -> dict[int, np.ndarray]:
        """Content plus question longer than one context: each window holds a slice of the content followed by
        the whole question; a content token takes its value from the window that owns it (the drafter's window
        schedule with ``W' = W - len(query)``)."""
        d = self.drafter
        wc = d.window - len(query)
        if wc < 8:
            raise DrafterError(f"question of {len(query)} tokens leaves no room in a {d.n_ctx}-token context")
        sc = wc - min(d.overlap, wc // 4)
        out = {L: np.zeros(len(content), np.float32) for L in self.layers}
        ws = 0
        while True:
            seg = content[ws:ws + wc]
            r = d.trace(np.concatenate([seg, query]), attend_from=len(seg), attn_layers=self.layers, flash=False)
            own = 0 if ws == 0 else wc - sc
            for L in self.layers:
                out[L][ws + own:ws + len(seg)] = r.attention[L][own:]
            if ws + wc >= len(content):
                return out
            ws += sc

    def represent(self, tt: Any, units: Sequence[Any]) -> Any:
        toks = self.drafter.tokenize(tt.text)
        tl = token_lines(self.drafter.token_starts(tt.text, toks), tt.text)
        s, e = unit_token_spans(tl, units)
        key = "attn:" + text_key(tt.text)
        if len(toks) < self.drafter.window:  # keep the content's KV state so a question reads only itself
            self.drafter.forget(key)
            self.drafter.trace(toks, session=key, flash=False)
        return make_reps(self.name, [u.tokens for u in units],
                         {"tokens": toks, "starts": s, "ends": e, "session": key})

    def score(self, reps: Any, query: str) -> np.ndarray:
        p = reps.payload
        a = self.token_attention(p["tokens"], query, p["session"])
        return unit_mass(a, p["starts"], p["ends"])
