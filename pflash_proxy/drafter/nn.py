"""Vectorised float32 numpy layers shared by the probes and the scorer head.

Every probe reads the drafter's tap, a ``(tokens, d)`` float32 matrix, and applies the same few layers:

1. ``layer_norm``: per token, subtract the mean over ``d``, divide by ``sqrt(var + eps)`` (biased variance, as
   ``torch.nn.LayerNorm``), then scale by ``weight`` and add ``bias``.
2. ``gelu``: the exact (erf) GELU ``0.5 x (1 + erf(x / sqrt 2))`` of ``torch.nn.GELU()``; numpy has no erf, so
   ``erf`` below is Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7, below float32 resolution of GELU's
   output for |x| < 8). ``gelu_tanh`` is the tanh approximation, selectable by a probe's metadata.
3. ``conv5``: a centred, zero-padded 5-tap 1-D convolution over the token axis of one logit sequence, with
   ``torch.nn.Conv1d(1, 1, 5, padding=2)`` semantics (cross-correlation, no kernel flip):
   ``y[t] = sum_k w[k] * z[t + k - 2]`` for ``k = 0..4``, with ``z[i] = 0`` outside ``0 <= i < T``.
   ``w[2]`` weighs the token itself, ``w[0]``/``w[1]`` the two tokens before it, ``w[3]``/``w[4]`` the two after.
4. ``sigmoid``: numerically stable logistic.
5. ``ln_linear``: ``LayerNorm(x) @ W.T + c`` without materialising the normalised rows, using
   ``LN(x) @ W.T = rstd * (x @ (g*W).T - mu * sum_j (g*W)_j) + b @ W.T`` with per-row ``mu``, ``rstd``:
   one matmul on the raw tap plus two row reductions, with no normalised copy of the rows.

Long inputs are processed in row chunks (``CHUNK`` tokens) so the temporaries of a 100K-token tap stay small.
"""

from __future__ import annotations

from typing import Any

import numpy as np

F32 = np.float32
CHUNK = 8192


def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26, vectorised, float32 in and out."""
    x = np.asarray(x, dtype=F32)
    s = np.sign(x)
    a = np.abs(x)
    t = F32(1.0) / (F32(1.0) + F32(0.3275911) * a)
    poly = t * (F32(0.254829592) + t * (F32(-0.284496736) + t * (F32(1.421413741)
                + t * (F32(-1.453152027) + t * F32(1.061405429)))))
    return s * (F32(1.0) - poly * np.exp(-a * a))


def _erf_abs(a: np.ndarray) -> np.ndarray:
    """erf(a) for a >= 0 (A&S 7.1.26), computed in place on fresh buffers."""
    t = a * F32(0.3275911)
    t += F32(1.0)
    np.reciprocal(t, out=t)
    p = t * F32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        p += F32(c)
        p *= t
    e = np.square(a)
    np.negative(e, out=e)
    np.exp(e, out=e)
    p *= e
    np.subtract(F32(1.0), p, out=p)
    return p


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU as ``0.5 * (x + |x| * erf(|x| / sqrt 2))`` (erf is odd), float32."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x)
    r = _erf_abs(a * F32(0.7071067811865476))
    r *= a
    r += x
    r *= F32(0.5)
    return r


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU (``approximate='tanh'`` in torch)."""
    c = F32(0.7978845608028654)
    return F32(0.5) * x * (F32(1.0) + np.tanh(c * (x + F32(0.044715) * x * x * x)))


ACTIVATIONS = {"gelu": gelu, "gelu_erf": gelu, "gelu_tanh": gelu_tanh}


def layer_norm(x: np.ndarray, weight: np.ndarray | np.floating[Any], bias: np.ndarray | np.floating[Any], eps: float
               ) -> np.ndarray:
    """LayerNorm over the last axis (biased variance), float32."""
    x = np.asarray(x, dtype=F32)
    mu = x.mean(axis=-1, keepdims=True, dtype=F32)
    xc = x - mu
    var = np.mean(xc * xc, axis=-1, keepdims=True, dtype=F32)
    return xc * (F32(1.0) / np.sqrt(var + F32(eps))) * weight + bias


def ln_linear(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float, w: np.ndarray,
              c: np.ndarray | float = 0.0, gw_t: np.ndarray | None = None) -> np.ndarray:
    """``layer_norm(x, g, b, eps) @ w.T + c`` for ``w`` of shape (out, d), float32, fused (step 5)."""
    x = np.asarray(x, dtype=F32)
    d = x.shape[-1]
    if gw_t is None:
        gw_t = np.ascontiguousarray((w * g).T, dtype=F32)  # (d, out)
    mu = np.einsum("ij->i", x) / F32(d)
    var = np.maximum(np.einsum("ij,ij->i", x, x) / F32(d) - mu * mu, F32(0.0))
    rstd = (F32(1.0) / np.sqrt(var + F32(eps)))[:, None]
    y = x @ gw_t
    y -= mu[:, None] * gw_t.sum(axis=0)
    y *= rstd
    y += (w @ b).astype(F32) + c
    return y


def conv5(z: np.ndarray, w: np.ndarray, bias: float = 0.0) -> np.ndarray:
    """Centred zero-padded 5-tap cross-correlation over axis 0 of a 1-D sequence, plus ``bias``."""
    z = np.asarray(z, dtype=F32)
    w = np.asarray(w, dtype=F32).reshape(5)
    n = z.shape[0]
    zp = np.zeros(n + 4, dtype=F32)
    zp[2:n + 2] = z
    y = np.full(n, F32(bias), dtype=F32)
    for k in range(5):
        y += w[k] * zp[k:k + n]
    return y


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Stable logistic, float32."""
    x = np.asarray(x, dtype=F32)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, F32(1.0) / (F32(1.0) + e), e / (F32(1.0) + e)).astype(F32)


def chunked_rows(n: int, chunk: int = CHUNK) -> list[slice]:
    """Row slices of at most ``chunk`` rows covering ``range(n)``."""
    return [slice(i, min(n, i + chunk)) for i in range(0, n, chunk)] or [slice(0, 0)]
