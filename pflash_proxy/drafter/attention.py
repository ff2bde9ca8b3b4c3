"""Training-free drafter scorer (``--scorer attention``): where the request's attention lands in the message.

The Speculative Prefill idea (arXiv 2502.02789), computed from query/key taps so it costs one flash forward:

1. Global layers: only layers that attend over the whole context are read (a sliding-window layer sees just
   its window). From the drafter's GGUF metadata: ``<arch>.full_attention_interval`` n (Qwen3.5/Qwen3-Next:
   blocks with ``(i + 1) % n == 0``), else ``<arch>.attention.sliding_window_pattern`` (a per-layer bool array,
   true = sliding, or an int n: blocks with ``i % n == n - 1``), else llama.cpp's built-in pattern for the
   architecture (gemma3: 6, so blocks 5, 11, 17 of gemma-3-270m), else every block when there is no sliding
   window at all. A configured list overrides this.
2. ``represent(tt, units)``: tokenize the message and map units to token spans; no pass. The reps hold only
   the tokens, the spans and the message's key (they are stored for recall).
3. ``score(reps, question)``: the question is placed after the content (``"\\n\\n" + question``). Cold, ONE
   flash-on pass reads content and question and keeps the post-RoPE keys ``Kcur-L`` of the content and the
   queries ``Qcur-L`` of the question (``Drafter.trace(qk_layers=...)``); the content's keys go to a small LRU
   (``KeyCache``, shared by the scorers of one drafter) and the drafter keeps the content's KV state
   (``save_prefix``), so a later question (recall) decodes only itself. In numpy, for every selected head
   (``heads``: every head of the global layers, or the ones calibration found that retrieve, see
   ``calibrate.py``) and every question token: ``softmax(q . k * scale)`` over the content keys, with the
   attention sink (the first ``SINK`` tokens) and the question's own neighbourhood (the last ``LOCAL`` content
   tokens) left out -- and, when the request is the message's own tail (a paste ending in its question), that
   tail too: otherwise every question token finds its own earlier copy, and retrieval heads point at it; the
   question is then its last paragraph (the rest of the tail is the paste's own last lines). A token's
   relevance is the **max** over heads and question tokens: one head of one question token that looks hard at
   a line is evidence; a mean drowns it in the heads that look nowhere.
   Cost: one forward plus O(question x message x head_dim) per head, milliseconds beside the forward.
   The tensors, as read in llama.cpp b11434's graphs: gemma3 names ``Qcur-L``/``Kcur-L`` three times (the
   projection, its 3-D reshape, then after the Q/K norm and RoPE) and scales Q by 1/sqrt(head_dim) only after
   the last name (27B: 1/sqrt(n_embd/n_head), not a drafter size); qwen35's full-attention layers name
   ``Kcur-L`` first as the 2-D projection and give both names last to the ``rope_multi`` output (partial RoPE,
   the query's gate applied after attention, kq_scale 1/sqrt(head_dim)). So the last occurrence is the one
   attention uses, and the scale is 1/sqrt(head_dim) for both.
4. A unit's score is the sum over its tokens of the relevance above the message's 99th percentile (its
   *peaks*), plus a thousandth of the relevance above the median (so units without a peak are still ordered);
   units are ranked by density (the pipeline divides by tokens). The max over many rows gives every token some
   background, so the flat-relevance test is measured on where the peaks are: a needle's peaks sit in one or a
   few units, an "every record with X" request spreads them over all of them (the relevance above the median
   alone would call needles flat; ``docs/results.md`` has the spread of both kinds).
5. Content plus question longer than one drafter context is scored window by window
   (``AttentionScorer.attention_windows``): each window holds a slice of the content followed by the question.
6. Reads of one content (its key: the drafter session) hold one lock (``session_lock``, striped): two requests
   reading the same file at once are scored one after the other, the second from the first's kept state and
   keys; a pass that still starts from a state kept outside that order is read again from token 0.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

import numpy as np

from .runtime import DraftPass, Drafter, DrafterError
from .segment import token_lines, unit_token_spans
from .taps import make_reps, text_key

if TYPE_CHECKING:
    from pflash_proxy.compress.scores import UnitReps
    from pflash_proxy.compress.text import TokenizedText
    from pflash_proxy.compress.units import Unit

QUERY_SEP = "\n\n"
_LOCK_STRIPES = 64  # reads of one content are serialised by one of this many locks (``session_lock``)
BUILTIN_SWA_PATTERN = {"gemma3": 6, "gemma2": 2, "cohere2": 4}  # llama.cpp set_swa_pattern defaults
SINK = 4  # leading tokens every head dumps attention on (the attention sink)
LOCAL = 8  # content tokens right before the question: attended for position, not meaning
TAIL_CHARS = 16384  # the message's tail kept in the reps to find the request in it
PEAK_QUANTILE = 0.99  # step 4: a token is a peak above this quantile of the message's relevance
BACKGROUND = 1e-3  # step 4: weight of the relevance above the median (ranks the units without a peak)
Head = tuple[int, int]  # (layer, query head)


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


def head_attention(q: np.ndarray, k: np.ndarray, scale: float, sink: int = SINK, local: int = LOCAL,
                   chunk: int = 64) -> np.ndarray:
    """Step 3 for one layer: ``(heads, n)``, the max over question tokens of each head's softmax over the
    content keys (sink and local neighbourhood excluded, probability 0 there).

    ``q``: ``(nq, heads, dim)``; ``k``: ``(n, kv_heads, dim)``; query head h reads kv head ``h // (heads //
    kv_heads)`` (grouped-query attention)."""
    nq, n_head, dim = q.shape
    n, n_kv = k.shape[0], k.shape[1]
    if n_kv == 0 or n_head % n_kv or k.shape[2] != dim:
        raise DrafterError(f"query {q.shape} and key {k.shape} taps do not match")
    lo, hi = min(sink, n), max(min(sink, n), n - local)
    out = np.zeros((n_head, n), np.float32)
    if hi <= lo or nq == 0:
        return out
    kf = np.ascontiguousarray(k[lo:hi].astype(np.float32).transpose(1, 2, 0))  # (kv_heads, dim, m)
    group = n_head // n_kv
    for h in range(n_head):
        best = np.zeros(hi - lo, np.float32)
        for a in range(0, nq, chunk):
            z = (q[a:a + chunk, h, :] @ kf[h // group]) * np.float32(scale)
            z -= z.max(axis=1, keepdims=True)
            np.exp(z, out=z)
            z /= z.sum(axis=1, keepdims=True)
            np.maximum(best, z.max(axis=0), out=best)
        out[h, lo:hi] = best
    return out


def token_relevance(per_layer: dict[int, np.ndarray], heads: Collection[Head] | None) -> np.ndarray:
    """Max over the selected heads (all of them when ``heads`` is None) of ``head_attention`` rows."""
    rows = [a[h] for L, a in per_layer.items() for h in range(a.shape[0]) if heads is None or (L, h) in heads]
    if not rows:
        raise DrafterError("none of the selected attention heads was captured")
    out = np.max(np.stack(rows), axis=0)
    if not np.isfinite(out).all():
        raise DrafterError("non-finite attention")
    return out


def peak_mass(token_scores: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Step 4: per unit, the relevance of its tokens above the message's top-1 % level (the peaks), plus
    ``BACKGROUND`` times their relevance above the median (orders the units without a peak), float64."""
    s = np.asarray(token_scores, np.float64)
    if not len(s):
        return np.zeros(len(starts))
    x = np.maximum(s - np.quantile(s, PEAK_QUANTILE), 0.0) + BACKGROUND * np.maximum(s - np.median(s), 0.0)
    cs = np.concatenate(([0.0], np.cumsum(x)))
    return np.maximum(cs[ends] - cs[starts], 0.0)


class KeyCache:
    """Content keys per message key, least recently used first out, bounded in bytes."""

    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._d: OrderedDict[str, dict[int, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()  # scorers run on the event loop's executor threads

    def get(self, key: str | None) -> dict[int, np.ndarray] | None:
        with self._lock:
            got = self._d.get(key) if key is not None else None
            if got is not None:
                self._d.move_to_end(key)  # type: ignore[arg-type]
            return got

    def put(self, key: str, keys: dict[int, np.ndarray]) -> None:
        with self._lock:
            self._d.pop(key, None)
            if sum(a.nbytes for a in keys.values()) > self.max_bytes:
                return
            self._d[key] = keys
            while sum(a.nbytes for v in self._d.values() for a in v.values()) > self.max_bytes:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


class AttentionScorer:
    """``Scorer`` protocol from the drafter's global-layer query/key taps (flash attention on)."""

    name = "attention"

    def __init__(self, drafter: Drafter, layers: Sequence[int] | None = None,
                 heads: Sequence[Head] | None = None, keys: KeyCache | None = None) -> None:
        self.drafter = drafter
        self.layers = global_layers(drafter.meta, drafter.n_layer, layers)
        self.heads = None if heads is None else frozenset((int(L), int(h)) for L, h in heads)
        if self.heads is not None:  # chosen heads: read exactly their layers
            bad = [f"{L}.{h}" for L, h in sorted(self.heads)
                   if not (0 <= L < drafter.n_layer and 0 <= h < drafter.n_head)]
            if bad or not self.heads:
                raise DrafterError(f"attention heads {bad or '(none)'} do not exist in a {drafter.n_layer}-block, "
                                   f"{drafter.n_head}-head drafter")
            self.layers = tuple(sorted({L for L, _ in self.heads}))
        # keys are captured for every global layer, so scorers with other head sets can share the cache
        self.capture = tuple(sorted(set(self.layers) | set(global_layers(drafter.meta, drafter.n_layer))))
        self.keys = keys if keys is not None else KeyCache()
        self._locks = tuple(threading.RLock() for _ in range(_LOCK_STRIPES))

    def session_lock(self, session: str | None) -> threading.RLock:
        """The lock a read of ``session``'s content holds: two requests reading the same content at once (the
        same file in two sessions, a client's retry) read it one after the other, the second from the first's
        kept state and keys, instead of both clearing and restoring the one drafter session under each other."""
        return self._locks[hash(session) % _LOCK_STRIPES]

    # ---------------------------------------------------------------- attention of a question
    def per_layer(self, keys: dict[int, np.ndarray], queries: dict[int, np.ndarray], tail: int = 0
                  ) -> dict[int, np.ndarray]:
        """``tail``: content tokens at the end that hold the request itself, left out with the neighbourhood."""
        out = {}
        for L in self.layers:
            q, k = queries.get(L), keys.get(L)
            if q is None or k is None or q.ndim != 3 or k.ndim != 3:
                raise DrafterError(f"layer {L}: query/key taps missing or not (tokens, heads, dim)")
            out[L] = head_attention(q, k, 1.0 / np.sqrt(q.shape[2]), local=LOCAL + tail)
        return out

    def layer_attention(self, content: np.ndarray, question: str, session: str | None = None, tail: int = 0
                        ) -> dict[int, np.ndarray]:
        """Per layer ``(heads, len(content))``: step 3 before the head selection (calibration reads this)."""
        qt = self.drafter.tokenize(QUERY_SEP + question)
        if len(content) + len(qt) > self.drafter.window:
            return self.attention_windows(content, qt, tail)
        return self.read(content, qt, session, tail)[0]

    def read(self, content: np.ndarray, qt: np.ndarray, session: str | None = None, tail: int = 0,
             taps: Sequence[int] = (), cold: bool = False) -> tuple[dict[int, np.ndarray], DraftPass]:
        """One flash-on pass of content + question tokens ``qt`` within one context: the per-layer attention
        and the pass itself (``taps`` are kept for the tokens it read). Warm (the content's keys cached and its
        state kept under ``session``) it reads the question alone; ``cold`` reads the content again, for a
        caller that needs the content's taps."""
        n = len(content)
        with self.session_lock(session):
            cached = None if cold else self.keys.get(session)
            if cached is not None and any(len(cached.get(L, ())) != n for L in self.capture):
                cached = None
            for _ in range(2):
                if cached is None and session is not None:  # a kept state is no use without the content's keys:
                    self.drafter.forget(session)  # read everything in this one pass, not the question first
                r = self.drafter.trace(np.concatenate([content, qt]), session=session, attend_from=n,
                                       qk_layers=self.capture, taps=taps, flash=True, save_prefix=n)
                if r.start == n and cached is not None:  # the question was read on top of the kept content state
                    return self.per_layer(cached, r.queries, tail), r
                if r.start == 0:
                    break
                cached = None  # a state kept by a read this lock did not order (another scorer): read it all again
            else:
                raise DrafterError(f"drafter pass started at token {r.start}, expected 0 or {n}")
            keys = {L: r.keys[L][:n] for L in self.capture}
            if session is not None:
                self.keys.put(session, keys)
            return self.per_layer(keys, r.queries, tail), r

    def token_attention(self, content: np.ndarray, question: str, session: str | None = None, tail: int = 0
                        ) -> np.ndarray:
        """Per content token: the relevance of step 3 over the selected heads."""
        return token_relevance(self.layer_attention(content, question, session, tail), self.heads)

    def attention_windows(self, content: np.ndarray, query: np.ndarray, tail: int = 0) -> dict[int, np.ndarray]:
        """Content plus question longer than one context: each window holds a slice of the content followed by
        the whole question; a content token takes its value from the window that owns it (the drafter's window
        schedule with ``W' = W - len(query)``)."""
        return self.windows(content, query, tail)[0]

    def windows(self, content: np.ndarray, query: np.ndarray, tail: int = 0, taps: Sequence[int] = ()
                ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """``attention_windows`` and, from the same passes, the ``taps`` of every token of content + question
        (a content token's from the window that owns it, the question's from the last window): a caller that
        needs both (``--scorer head-attention``) reads a long message once, not twice."""
        d = self.drafter
        wc = d.window - len(query)
        if wc < 8:
            raise DrafterError(f"question of {len(query)} tokens leaves no room in a {d.n_ctx}-token context")
        sc = wc - min(d.overlap, wc // 4)
        out: dict[int, np.ndarray] = {}
        rows: dict[int, np.ndarray] = {}
        ws = 0
        while True:
            seg = content[ws:ws + wc]
            r = d.trace(np.concatenate([seg, query]), attend_from=len(seg), qk_layers=self.layers, taps=taps,
                        flash=True)
            last = ws + wc >= len(content)  # only the last window holds the message's tail
            att = self.per_layer({L: r.keys[L][:len(seg)] for L in self.layers}, r.queries, tail if last else 0)
            own = 0 if ws == 0 else wc - sc
            for L, a in att.items():
                out.setdefault(L, np.zeros((a.shape[0], len(content)), np.float32))[:, ws + own:ws + len(seg)] \
                    = a[:, own:]
            for k in taps:
                t = r.taps[k]
                dst = rows.setdefault(k, np.zeros((len(content) + len(query), t.shape[1]), t.dtype))
                dst[ws + own:ws + len(seg)] = t[own:len(seg)]
                if last:
                    dst[len(content):] = t[len(seg):]
            if last:
                return out, rows
            ws += sc

    # ---------------------------------------------------------------- Scorer protocol
    def represent(self, tt: TokenizedText, units: Sequence[Unit]) -> UnitReps:
        toks = self.drafter.tokenize(tt.text)
        byte_starts = self.drafter.token_starts(tt.text, toks)
        tl = token_lines(byte_starts, tt.text)
        s, e = unit_token_spans(tl, units)
        tail = tt.text[-TAIL_CHARS:]
        return make_reps(self.name, [u.tokens for u in units],
                         {"tokens": toks, "starts": s, "ends": e, "session": "attn:" + text_key(tt.text),
                          "tail": tail, "tail_byte": len(tt.text.encode()) - len(tail.encode()),
                          "byte_starts": byte_starts.astype(np.int64)})

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        p = reps.payload
        tail = request_tail(p, query)
        if tail:  # the pinned tail of a paste is mostly the paste's own last lines: ask with its last paragraph
            query = last_paragraph(query)
        a = self.token_attention(p["tokens"], query, p["session"], tail)
        return peak_mass(a, p["starts"], p["ends"])


def last_paragraph(text: str) -> str:
    paras = [x for x in re.split(r"\n[ \t]*\n", text.strip()) if x.strip()]
    return paras[-1].strip() if paras else text


def request_tail(payload: Mapping[str, Any], query: str) -> int:  # a reps payload (its layout: taps.py)
    """Content tokens from where the request starts, when the message ends with the request; else 0."""
    q = query.strip()
    tail = payload.get("tail", "")
    if not q or not tail.rstrip().endswith(q):
        return 0
    at = payload["tail_byte"] + len(tail[:tail.rstrip().rfind(q)].encode())
    return int(len(payload["tokens"]) - np.searchsorted(payload["byte_starts"], at))
