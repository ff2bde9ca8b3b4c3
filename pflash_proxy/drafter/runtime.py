"""The in-process drafter: llama-cpp-python on one worker thread, taps and attention from one forward pass.

1. Load once: the GGUF model, a vocab, and (lazily) one llama context per flash-attention mode, each with the
   ``Capture`` eval callback (``_ggml.py``) and an abort callback. Every llama call runs on ONE dedicated
   worker thread (``ThreadPoolExecutor(max_workers=1)``); sync methods block on that thread's future, the
   ``async def run_*`` twins await it with ``loop.run_in_executor`` semantics, so the event loop never waits.
2. A pass decodes a token stream in batches of ``n_batch`` (= ``n_ubatch``, so one decode is one ubatch)
   with every logit flag off, and keeps for every token the tap ``l_out-K`` (the residual leaving block K),
   ``(tokens, d)`` float32, concatenated over ubatches. ``K`` must be below the last block (llama.cpp keeps only
   output rows there). Ubatches are aligned to multiples of ``n_batch`` from the window start, whatever the
   call: llama.cpp's CPU kernels give a row slightly different bits in a different ubatch shape, and the
   alignment makes a follow-up bit-identical to a cold pass.
3. Windows: a stream longer than the context (``W = n_ctx - 1`` tokens after BOS) is read in windows of ``W``
   tokens with stride ``S = W - overlap`` (``overlap`` default ``W // 4``): window 0 gives taps for ``[0, W)``,
   window ``k >= 1`` starts at ``k*S`` and gives taps only for its last ``S`` tokens, so every token after the
   first window sees between ``overlap`` and ``W - 1`` tokens of left context (not the whole message): an
   honest approximation, documented in docs/probes.md. Nothing is truncated.
4. Sessions: after a pass the KV state of the current window up to its last full ubatch (the partial tail is
   removed with ``llama_memory_seq_rm`` first; ``swa_full`` keeps that possible), the window start and the
   token stream are kept in an LRU bounded in bytes (``cache_mb``). A later call whose stream starts with the
   cached one restores that state and decodes only the new tokens plus that partial tail (< ``n_batch``),
   following the same window schedule, so it gives the same taps as a cold pass over the whole stream.
5. Attention (flash attention off, so ``kq_soft_max-L`` exists): tokens from ``attend_from`` on are decoded with
   a reducer that keeps, per wanted layer, the attention those tokens pay to each earlier token, summed over
   heads and query tokens. This costs a quadratic flash-off pass: the scorer no longer uses it; it stays as the
   reference that the tests check the query/key taps against.
   Query/key taps (``qk_layers``, flash attention ON): per wanted layer the post-norm, post-RoPE ``Kcur-L``
   rows of every kept token (float16, ``(tokens, kv_heads, head_dim)``) and the ``Qcur-L`` rows of the tokens
   from ``attend_from`` on (float32, ``(tokens, heads, head_dim)``); each name occurs three times per layer in
   the graph (projection, reshape, after norm + RoPE) and the last is kept (``Capture`` ``last``). The caller
   computes the attention it needs in numpy, so the pass costs one ordinary flash forward.
6. Failures (llama error, abort, timeout via ``timeout`` seconds from submission) raise ``DrafterError``;
   the context is cleared so the next call starts clean.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import numpy.typing as npt

T = TypeVar("T")
log = logging.getLogger("pflash_proxy.drafter")
PROGRESS_EVERY_S = 5.0  # a pass longer than this logs how far it got, this often


class DrafterError(RuntimeError):
    """The drafter could not produce a result; callers serve the message whole."""


@dataclass(frozen=True)
class DraftPass:
    """Result of one call: taps for ``tokens[start:]`` and, if asked, attention over ``tokens[:attend_from]``."""
    tokens: np.ndarray  # the whole stream, int32, no BOS
    start: int  # first token decoded by this call (earlier ones came from the session cache)
    taps: dict[int, np.ndarray]  # block -> (len(tokens) - start, d) float32
    attention: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (attend_from,) float32
    keys: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (len(tokens) - start, kv_heads, dim) f16
    queries: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (len(tokens) - attend_from, heads, dim)
    seconds: float = 0.0


@dataclass
class _Session:
    tokens: np.ndarray  # every token read so far
    win_start: int  # stream index of the current window's first token
    kv_end: int  # the state holds the KV of tokens [win_start, kv_end): kv_end is ubatch-aligned
    state: bytes
    flash: bool

    @property
    def nbytes(self) -> int:
        return len(self.state) + self.tokens.nbytes


def _rows(parts: list[np.ndarray], dtype: npt.DTypeLike) -> np.ndarray:
    """Per-ubatch ``(tokens, heads, dim)`` pieces joined; empty when no token of the call was kept."""
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros((0, 0, 0), dtype)


# What a pass keeps of each tensor it reads (``Drafter._run``'s reducers), from the first kept row on.
def _out_rows(x: np.ndarray, lo: int) -> np.ndarray:
    return x[0, 0, lo:]


def _attention_mass(x: np.ndarray, q0: int) -> np.ndarray:
    return x[0, :, q0:, :].sum(axis=(0, 1))


def _key_rows(x: np.ndarray, lo: int) -> np.ndarray:
    return x[0, lo:].astype(np.float16)


def _query_rows(x: np.ndarray, q0: int) -> np.ndarray:
    return x[0, q0:].copy()


class Drafter:
    def __init__(self, path: str | os.PathLike[str], *, n_ctx: int = 8192, n_threads: int = 2,
                 n_gpu_layers: int = 0, n_batch: int = 512, timeout: float = 300.0, cache_mb: float = 512,
                 overlap: int | None = None, verbose: bool = False) -> None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            from pflash_proxy.llama.extras import install_hint

            raise DrafterError(f"the drafter needs llama-cpp-python, and the `drafter` extra is not installed "
                               f"({e}): {install_hint('drafter')}") from None
        if not os.path.isfile(path):
            raise DrafterError(f"drafter file {path} does not exist")
        self.path, self.n_ctx, self.n_threads, self.n_batch = str(path), n_ctx, n_threads, min(n_batch, n_ctx)
        self.n_gpu_layers, self.timeout, self.cache_bytes = n_gpu_layers, timeout, int(cache_mb * 2**20)
        self.verbose = verbose
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pflash-drafter")
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._ctx: dict[bool, object] = {}  # llama.cpp contexts (ctypes pointers), with and without flash attention
        self._deadline = float("inf")
        self.stats = {"passes": 0, "tokens": 0, "seconds": 0.0, "cache_hits": 0, "aborts": 0}
        self._progress = (0.0, 0, 0.0)  # (pass start, tokens in the pass, last progress line)
        self._submit(self._load, None).result()
        self.window = self.n_ctx - int(self.add_bos)
        self.overlap = self.window // 4 if overlap is None else overlap
        if not 0 <= self.overlap < self.window:
            raise DrafterError(f"overlap {self.overlap} must be in [0, {self.window})")

    # ------------------------------------------------------------------ thread plumbing
    def _submit(self, fn: Callable[..., T], timeout: float | None, *args: object) -> "Future[T]":
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        return self._pool.submit(self._guard, fn, deadline, *args)

    def _guard(self, fn: Callable[..., T], deadline: float, *args: object) -> T:
        if time.monotonic() > deadline:
            raise DrafterError("drafter timed out while queued")
        self._deadline = deadline
        try:
            return fn(*args)
        except DrafterError:
            raise
        except Exception as e:  # noqa: BLE001
            raise DrafterError(f"drafter failed: {type(e).__name__}: {e}") from e
        finally:
            self._deadline = float("inf")

    def call(self, fn: Callable[..., T], *args: object) -> T:
        return self._submit(fn, None, *args).result()

    async def run_call(self, fn: Callable[..., T], *args: object) -> T:
        fut = self._submit(fn, None, *args)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout + 5.0)
        except asyncio.TimeoutError:
            raise DrafterError(f"drafter timed out after {self.timeout:.0f} s") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.submit(self._free).result()
            self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ llama objects (worker thread only)
    def _load(self) -> None:
        import llama_cpp as L
        from llama_cpp._logger import set_verbose
        from ._ggml import Capture
        set_verbose(self.verbose)  # llama.cpp's log lines only when asked (process-wide, as Llama() does)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = self.n_gpu_layers
        self._model = L.llama_model_load_from_file(self.path.encode(), mp)
        if not self._model:
            raise DrafterError(f"llama.cpp could not load drafter {self.path}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_layer = int(L.llama_model_n_layer(self._model))
        self.n_embd = int(L.llama_model_n_embd(self._model))
        self.n_head = int(L.llama_model_n_head(self._model))
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        self.bos = int(L.llama_vocab_bos(self._vocab))
        self.capture = Capture()
        self._abort_cb = L.ggml_abort_callback(lambda _d: time.monotonic() > self._deadline)
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
            self._batch.logits[i] = 0

    def _context(self, flash: bool) -> object:
        if flash not in self._ctx:
            import llama_cpp as L
            cp = L.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = self.n_ctx, self.n_batch, self.n_batch, 1
            cp.n_threads = cp.n_threads_batch = self.n_threads
            cp.flash_attn_type = -1 if flash else 0  # auto / disabled (kq_soft_max-L needs disabled)
            cp.cb_eval, cp.cb_eval_user_data = self.capture.c_callback, None
            cp.no_perf = True
            cp.swa_full = True  # sliding-window layers keep every cell: the saved state can be cut anywhere
            ctx = L.llama_init_from_model(self._model, cp)
            if not ctx:
                raise DrafterError(f"llama.cpp could not create a context of {self.n_ctx} tokens")
            L.llama_set_abort_callback(ctx, self._abort_cb, None)
            self._ctx[flash] = ctx
        return self._ctx[flash]

    def _free(self) -> None:
        import llama_cpp as L
        for ctx in self._ctx.values():
            L.llama_free(ctx)
        self._ctx.clear()
        L.llama_batch_free(self._batch)
        L.llama_model_free(self._model)
        self._sessions.clear()

    def meta(self, key: str) -> str | None:
        """A drafter GGUF metadata value as llama.cpp prints it, or None."""
        import llama_cpp as L
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode(errors="replace") if n >= 0 else None

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (no BOS, special tokens not parsed), int32."""
        import llama_cpp as L
        raw = text.encode()
        cap = len(raw) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self._vocab, raw, len(raw), buf, cap, False, False)
        if n < 0:
            raise DrafterError(f"tokenizer needs {-n} slots")
        return np.ctypeslib.as_array(buf)[:n].astype(np.int32)

    def pieces(self, tokens: Sequence[int] | np.ndarray) -> list[bytes]:
        import llama_cpp as L
        buf = ctypes.create_string_buffer(256)
        out = []
        for t in np.asarray(tokens).tolist():
            n = L.llama_token_to_piece(self._vocab, int(t), buf, 256, 0, False)
            out.append(buf.raw[:max(n, 0)])
        return out

    def token_starts(self, text: str, tokens: np.ndarray) -> np.ndarray:
        """Byte offset in ``text`` where each token starts (pieces re-joined; clipped to the text)."""
        lens = np.fromiter((len(p) for p in self.pieces(tokens)), dtype=np.int64, count=len(tokens))
        starts = np.concatenate(([0], np.cumsum(lens)[:-1])) if len(tokens) else np.zeros(0, np.int64)
        return np.minimum(starts, max(len(text.encode()) - 1, 0))

    # ------------------------------------------------------------------ passes (public)
    def trace(self, tokens: Sequence[int] | np.ndarray, *, session: str | None = None, taps: Sequence[int] = (),
              attend_from: int | None = None, attn_layers: Sequence[int] = (), flash: bool | None = None,
              save: bool = True, qk_layers: Sequence[int] = (), save_prefix: int | None = None) -> DraftPass:
        """One pass over ``tokens`` (steps 2-5); blocks the caller until the worker thread is done.
        ``save_prefix``: keep the session state of ``tokens[:save_prefix]`` only (a document read together with
        a question keeps the document), and only when the call did not start from that very state."""
        return self.call(self._trace, np.asarray(tokens, np.int32), session, tuple(taps), attend_from,
                         tuple(attn_layers), flash, save, tuple(qk_layers), save_prefix)

    async def run_trace(self, tokens: Sequence[int] | np.ndarray, **kw: Any) -> DraftPass:
        """``trace`` awaited from the event loop (the work runs on the drafter thread)."""
        return await self.run_call(lambda: self._trace(np.asarray(tokens, np.int32), kw.get("session"),
                                                       tuple(kw.get("taps", ())), kw.get("attend_from"),
                                                       tuple(kw.get("attn_layers", ())), kw.get("flash"),
                                                       kw.get("save", True), tuple(kw.get("qk_layers", ())),
                                                       kw.get("save_prefix")))

    def session_bytes(self, session: str) -> int:
        s = self._sessions.get(session)
        return s.nbytes if s is not None else 0

    @property
    def cache_used(self) -> int:
        return sum(s.nbytes for s in self._sessions.values())

    # ------------------------------------------------------------------ passes (worker thread)
    def _trace(self, tokens: np.ndarray, session: str | None, taps: tuple[int, ...], attend_from: int | None,
               attn_layers: tuple[int, ...], flash: bool | None, save: bool,
               qk_layers: tuple[int, ...] = (), save_prefix: int | None = None) -> DraftPass:
        t0 = time.perf_counter()
        self._progress = (t0, len(tokens), t0)
        for k in taps:
            if not 0 <= k < self.n_layer - 1:
                raise DrafterError(f"tap block {k} outside [0, {self.n_layer - 1}) for a {self.n_layer}-block drafter")
        for k in qk_layers:
            if not 0 <= k < self.n_layer:
                raise DrafterError(f"attention layer {k} outside [0, {self.n_layer}) for a "
                                   f"{self.n_layer}-block drafter")
        flash = (not attn_layers) if flash is None else flash
        if attn_layers and (flash or attend_from is None or len(tokens) > self.window):
            raise DrafterError("attention needs flash=False, attend_from, and a stream within one context")
        if qk_layers and len(tokens) > self.window:
            raise DrafterError("query/key taps need a stream within one context")
        ctx = self._context(flash)
        prior, kv_end, ws = self._restore(ctx, session, tokens, flash, attend_from)
        got: dict[str, list[np.ndarray]] = {f"l_out-{k}": [] for k in taps}
        got.update({f"kq_soft_max-{L}": [] for L in attn_layers})
        got.update({f"Kcur-{L}": [] for L in qk_layers})
        if attend_from is not None:
            got.update({f"Qcur-{L}": [] for L in qk_layers})
        try:
            n, W, S, p = len(tokens), self.window, self.window - self.overlap, kv_end
            while p < n:
                if ws is None:
                    ws = 0
                    self._fresh(ctx)
                elif p >= ws + W:  # next window: re-read its overlap as context, keep taps from p on
                    ws += S
                    self._fresh(ctx)
                    p = ws
                end = min(n, ws + W)
                self._decode(ctx, tokens, ws, p, end, max(prior, ws + (self.overlap if ws else 0)),
                             attend_from, attn_layers, got)
                p = end
            att = {L: self._merge_attention(got[f"kq_soft_max-{L}"], attend_from)  # type: ignore[arg-type]
                   for L in attn_layers}
            keep = len(tokens) if save_prefix is None else min(save_prefix, len(tokens))
            if session is not None and save and ws is not None and keep > prior and keep > ws:
                self._save(ctx, session, tokens[:keep], ws, flash, len(tokens))
        except BaseException:
            self._reset(ctx, session)
            raise
        tap_arrays = {k: (np.concatenate(got[f"l_out-{k}"]) if got[f"l_out-{k}"]
                          else np.zeros((0, self.n_embd), np.float32)) for k in taps}
        keys = {L: _rows(got[f"Kcur-{L}"], np.float16) for L in qk_layers}
        queries = {L: _rows(got[f"Qcur-{L}"], np.float32) for L in qk_layers if f"Qcur-{L}" in got}
        dt = time.perf_counter() - t0
        self.stats["passes"] += 1
        self.stats["tokens"] += len(tokens) - kv_end
        self.stats["seconds"] += dt
        return DraftPass(tokens, prior, tap_arrays, att, keys=keys, queries=queries, seconds=dt)

    def _fresh(self, ctx: object) -> None:
        import llama_cpp as L
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        if self.add_bos:
            self._decode(ctx, np.asarray([self.bos], np.int32), 1, 0, 1, 1, None, (), {})

    def _decode(self, ctx: object, tokens: np.ndarray, ws: int, a: int, b: int, keep_from: int,
                attend_from: int | None, attn_layers: tuple[int, ...], got: dict[str, list[np.ndarray]]) -> None:
        """Decode ``tokens[a:b]`` of the window starting at ``ws`` (position ``t - ws``, +1 after BOS) in
        ubatches aligned to ``ws + j * n_batch``, so a row's ubatch never depends on where a call started
        (llama.cpp's CPU kernels give a row slightly different bits in a different tile). Taps are kept for
        ``t >= keep_from``; attention rows for ``t >= attend_from``."""
        import llama_cpp as L
        bt, nb, off = self._batch, self.n_batch, int(self.add_bos)
        start = a
        while start < b:
            end = min(b, ws + ((start - ws) // nb + 1) * nb)
            m = end - start
            np.ctypeslib.as_array(bt.token, shape=(nb,))[:m] = tokens[start:end]
            np.ctypeslib.as_array(bt.pos, shape=(nb,))[:m] = np.arange(start - ws, end - ws) + off
            bt.n_tokens = m
            red: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
            lo = keep_from - start
            if lo < m:
                for name in got:
                    if name.startswith("l_out-"):
                        red[name] = functools.partial(_out_rows, lo=max(lo, 0))
            if attn_layers and attend_from is not None and attend_from - start < m:
                for Lr in attn_layers:
                    red[f"kq_soft_max-{Lr}"] = functools.partial(_attention_mass, q0=max(attend_from - start, 0))
            last: set[str] = set()
            for name in got:  # post-RoPE rows (tokens, heads, dim): keys of kept tokens, queries from attend_from
                if name.startswith("Kcur-") and lo < m:
                    red[name] = functools.partial(_key_rows, lo=max(lo, 0))
                    last.add(name)
                elif name.startswith("Qcur-") and attend_from is not None and attend_from - start < m:
                    red[name] = functools.partial(_query_rows, q0=max(attend_from - start, 0))
                    last.add(name)
            self.capture.want(red, last)
            rc = L.llama_decode(ctx, bt)
            self.capture.finish()
            self.capture.clear()
            if rc != 0:
                if rc == 2:
                    self.stats["aborts"] += 1
                    raise DrafterError(f"drafter timed out after {self.timeout:.0f} s (aborted)")
                raise DrafterError(f"llama_decode returned {rc}")
            if self.capture.error:
                raise DrafterError(f"eval callback: {self.capture.error}")
            for name, parts in self.capture.got.items():
                if len(parts) != 1:
                    raise DrafterError(f"{name} captured {len(parts)} times in one ubatch (is it in the graph?)")
                got[name].extend(parts)
            start = end
            self._log_progress(end)

    def _log_progress(self, position: int) -> None:
        """A long pass says how far it got every ``PROGRESS_EVERY_S`` seconds (one log line, not per ubatch)."""
        t0, total, last = self._progress
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY_S and total:
            self._progress = (t0, total, now)
            log.info("drafter pass: %s of %s tokens (%.0f %%), %.0f s", f"{position:,}", f"{total:,}",
                     100 * position / total, now - t0)

    def _merge_attention(self, parts: list[np.ndarray], attend_from: int) -> np.ndarray:
        """Sum the per-ubatch attention rows; keep the columns of the content tokens (cell = position)."""
        if not parts:
            raise DrafterError("no attention captured")
        n_kv = max(len(p) for p in parts)
        acc = np.zeros(n_kv, np.float32)
        for p in parts:
            acc[:len(p)] += p
        off = int(self.add_bos)
        if n_kv < off + attend_from:
            raise DrafterError(f"attention has {n_kv} cells for {attend_from} content tokens")
        return acc[off:off + attend_from]

    # ------------------------------------------------------------------ session cache (worker thread)
    def _restore(self, ctx: object, session: str | None, tokens: np.ndarray, flash: bool,
                 attend_from: int | None) -> tuple[int, int, int | None]:
        """(tokens already read, first token to decode, window start) -- (0, 0, None) for a cold pass."""
        import llama_cpp as L
        s = self._sessions.get(session) if session is not None else None
        m = 0 if s is None else len(s.tokens)
        if (s is None or s.flash != flash or m > len(tokens) or not np.array_equal(tokens[:m], s.tokens)
                or (attend_from is not None and attend_from < m)):
            return 0, 0, None
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        buf = (ctypes.c_uint8 * len(s.state)).from_buffer_copy(s.state)
        if L.llama_state_seq_set_data(ctx, buf, len(s.state), 0) == 0:
            self._sessions.pop(session, None)  # type: ignore[arg-type]
            return 0, 0, None
        self._sessions.move_to_end(session)  # type: ignore[arg-type]
        self.stats["cache_hits"] += 1
        return m, s.kv_end, s.win_start

    def _save(self, ctx: object, session: str, tokens: np.ndarray, ws: int, flash: bool, decoded: int) -> None:
        """Keep the KV of ``[ws, kv_end)``, ``kv_end`` the last ubatch boundary of ``tokens``: a follow-up
        re-reads the partial last ubatch with the same alignment a cold pass would use. ``decoded``: where the
        context's KV ends (past ``tokens`` when a question was read after the kept prefix)."""
        import llama_cpp as L
        n, off = len(tokens), int(self.add_bos)
        kv_end = ws + (n - ws) // self.n_batch * self.n_batch
        if kv_end < decoded and not L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, kv_end - ws + off, -1):
            return
        size = int(L.llama_state_seq_get_size(ctx, 0))
        buf = (ctypes.c_uint8 * size)()
        got = int(L.llama_state_seq_get_data(ctx, buf, size, 0))
        self._sessions.pop(session, None)
        entry = _Session(tokens.copy(), ws, kv_end, bytes(buf)[:got], flash)
        if entry.nbytes > self.cache_bytes:
            return
        self._sessions[session] = entry
        while self.cache_used > self.cache_bytes:
            self._sessions.popitem(last=False)

    def _reset(self, ctx: object, session: str | None) -> None:
        import llama_cpp as L
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        if session is not None:
            self._sessions.pop(session, None)

    def forget(self, session: str) -> None:
        self._sessions.pop(session, None)
