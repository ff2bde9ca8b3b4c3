"""Numpy training of the three probe files' weights (no torch: the models are one layer deep).

Probes (segment: rows unit/container/subunit; request: one row), per ``docs/probes.md``:

1. ``x = LayerNorm(tap)``; the affine of that LayerNorm is kept at identity (weight 1, bias 0), so the
   normalised taps are computed once, when they are read (``features.normalised``), and stored as float16.
2. ``a = x W^T + b``, ``h = GELU(a)``, ``z_o = h w_o + b_o``, ``out_o = conv5(z_o) + z_o``. Documents are
   concatenated; the convolution never reads across a document boundary (a mask per shift).
3. Loss: binary cross-entropy with the positives weighted (``pos_weight``: boundaries are rare), per row.
   Gradients by hand, through the convolution's transpose, GELU's derivative ``Phi(a) + a phi(a)`` and the
   linear layer; Adam with a small weight decay, minibatches of whole documents.

Scorer head:

4. ``u_j = W_u m_j + b_u`` with ``m_j`` the mean normalised tap of unit ``j``; ``q = W_q n + b_q`` with ``n``
   the mean normalised tap of the request tokens (the last ``query_tokens`` of them);
   ``l_j = s (u_j . q) / sqrt(r) + c``.
5. Loss per question: listwise ``-log sum_{gold} softmax(l)`` (ranking) plus ``bce_weight`` x BCE of
   ``sigmoid(l)`` against the gold labels (so ``p`` stays a probability). Adam; the epoch with the best
   held-out listwise loss is kept (early stopping).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pflash_proxy.drafter import nn

F32 = np.float32


class Adam:
    def __init__(self, params: dict[str, np.ndarray], lr: float, wd: float = 0.0) -> None:
        self.p, self.lr, self.wd, self.t = params, lr, wd, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        b1, b2 = 0.9, 0.999
        for k, g in grads.items():
            if self.wd and self.p[k].ndim == 2:
                g = g + self.wd * self.p[k]
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mh = self.m[k] / (1 - b1 ** self.t)
            vh = self.v[k] / (1 - b2 ** self.t)
            self.p[k] -= (self.lr * mh / (np.sqrt(vh) + 1e-8)).astype(F32)


def _gelu_grad(a: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + nn.erf(a * F32(0.7071067811865476))) + a * np.exp(-0.5 * a * a) * F32(0.3989422804014327)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


@dataclass
class ProbeData:
    """Concatenated documents: normalised taps, labels per row, document id per token."""
    x: np.ndarray  # (N, d) float16
    y: np.ndarray  # (N, rows) float32 in {0, 1}
    doc: np.ndarray  # (N,) int
    bounds: list[tuple[int, int]] = field(default_factory=list)  # token range of each document


def probe_data(parts: list[tuple[np.ndarray, np.ndarray]]) -> ProbeData:
    xs, ys, ds, bounds, at = [], [], [], [], 0
    for k, (x, y) in enumerate(parts):
        xs.append(x)
        ys.append(np.asarray(y, F32).reshape(len(x), -1))
        ds.append(np.full(len(x), k, np.int32))
        bounds.append((at, at + len(x)))
        at += len(x)
    return ProbeData(np.concatenate(xs), np.concatenate(ys), np.concatenate(ds), bounds)


def init_probe(d: int, rows: list[str], prior: np.ndarray, rng: np.random.Generator, hidden: int = 256
               ) -> dict[str, np.ndarray]:
    p = {"fc.weight": (rng.standard_normal((hidden, d)) / math.sqrt(d)).astype(F32),
         "fc.bias": np.zeros(hidden, F32)}
    for k, o in enumerate(rows):
        p[f"{o}.weight"] = (rng.standard_normal(hidden) / math.sqrt(hidden)).astype(F32)
        pr = float(np.clip(prior[k], 1e-4, 1 - 1e-4))
        p[f"{o}.bias"] = np.array([math.log(pr / (1 - pr))], F32)
        p[f"{o}.conv.weight"] = np.zeros(5, F32)
        p[f"{o}.conv.bias"] = np.zeros(1, F32)
    return p


def probe_forward(p: dict[str, np.ndarray], rows: list[str], x: np.ndarray, doc: np.ndarray
                  ) -> tuple[np.ndarray, tuple]:
    """Logits (N, rows) and what the backward pass needs (step 2)."""
    x = np.asarray(x, F32)
    a = x @ p["fc.weight"].T + p["fc.bias"]
    h = nn.gelu(a)
    n = len(x)
    outs, zs, masks = [], [], []
    for s in range(-2, 3):
        m = np.zeros(n, bool)
        lo, hi = max(0, -s), min(n, n - s)
        m[lo:hi] = doc[lo:hi] == doc[lo + s:hi + s]
        masks.append(m)
    for o in rows:
        z = h @ p[f"{o}.weight"] + p[f"{o}.bias"][0]
        out = z + p[f"{o}.conv.bias"][0]
        for k, s in enumerate(range(-2, 3)):
            sh = np.zeros(n, F32)
            lo, hi = max(0, -s), min(n, n - s)
            sh[lo:hi] = z[lo + s:hi + s]
            out = out + p[f"{o}.conv.weight"][k] * sh * masks[k]
        zs.append(z)
        outs.append(out)
    return np.stack(outs, 1), (x, a, h, zs, masks)


def probe_backward(p: dict[str, np.ndarray], rows: list[str], cache: tuple, dout: np.ndarray
                   ) -> dict[str, np.ndarray]:
    x, a, h, zs, masks = cache
    n = len(x)
    g: dict[str, np.ndarray] = {}
    dh = np.zeros_like(h)
    for r, o in enumerate(rows):
        do, z = dout[:, r], zs[r]
        dz = do.copy()
        dw = np.zeros(5, F32)
        for k, s in enumerate(range(-2, 3)):
            lo, hi = max(0, -s), min(n, n - s)
            m = masks[k][lo:hi]
            dw[k] = float(np.sum(do[lo:hi] * z[lo + s:hi + s] * m))
            dz[lo + s:hi + s] += p[f"{o}.conv.weight"][k] * do[lo:hi] * m
        g[f"{o}.conv.weight"] = dw
        g[f"{o}.conv.bias"] = np.array([do.sum()], F32)
        g[f"{o}.weight"] = (h.T @ dz).astype(F32)
        g[f"{o}.bias"] = np.array([dz.sum()], F32)
        dh += np.outer(dz, p[f"{o}.weight"])
    da = dh * _gelu_grad(a)
    g["fc.weight"] = (da.T @ x).astype(F32)
    g["fc.bias"] = da.sum(0).astype(F32)
    return g


def bce(out: np.ndarray, y: np.ndarray, pos_weight: np.ndarray, row_weight: np.ndarray
        ) -> tuple[float, np.ndarray]:
    """Weighted BCE with logits, mean over tokens; returns (loss, dloss/dout) (step 3)."""
    w = (1 + (pos_weight - 1) * y) * row_weight
    loss = float(np.sum(w * (_softplus(out) - y * out)) / len(out))
    return loss, (w * (nn.sigmoid(out) - y) / len(out)).astype(F32)


def train_probe(train: ProbeData, valid: ProbeData, rows: list[str], pos_weight: list[float],
                row_weight: list[float], epochs: int, seed: int, lr: float = 2e-3, batch_tokens: int = 16384,
                progress: Callable[[int, float, float], None] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = init_probe(train.x.shape[1], rows, train.y.mean(0), rng)
    opt = Adam(p, lr, wd=1e-4)
    pw, rw = np.asarray(pos_weight, F32), np.asarray(row_weight, F32)
    best, best_p = math.inf, {k: v.copy() for k, v in p.items()}
    for ep in range(epochs):
        order = rng.permutation(len(train.bounds))
        batch: list[int] = []
        tot = 0
        for k in list(order) + [None]:
            if k is not None:
                batch.append(k)
                tot += train.bounds[k][1] - train.bounds[k][0]
            if batch and (tot >= batch_tokens or k is None):
                idx = np.concatenate([np.arange(*train.bounds[j]) for j in batch])
                out, cache = probe_forward(p, rows, train.x[idx], train.doc[idx])
                _, dout = bce(out, train.y[idx], pw, rw)
                opt.step(probe_backward(p, rows, cache, dout))
                batch, tot = [], 0
        vl = probe_loss(p, rows, valid, pw, rw)
        if vl < best:
            best, best_p = vl, {k: v.copy() for k, v in p.items()}
        if progress is not None:
            progress(ep + 1, vl, best)
    return best_p


def probe_loss(p: dict[str, np.ndarray], rows: list[str], data: ProbeData, pw: np.ndarray, rw: np.ndarray) -> float:
    tot, n = 0.0, 0
    for a, b in data.bounds:
        out, _ = probe_forward(p, rows, data.x[a:b], data.doc[a:b])
        loss, _ = bce(out, data.y[a:b], pw, rw)
        tot += loss * (b - a)
        n += b - a
    return tot / max(n, 1)


# ------------------------------------------------------------------------------------------------ the head
@dataclass
class HeadExample:
    m: np.ndarray  # (units, d) mean normalised tap per unit
    n: np.ndarray  # (d,) mean normalised tap of the request tokens
    gold: np.ndarray  # (units,) bool
    tokens: np.ndarray  # (units,) tokens per unit


def _head_logits(p: dict[str, np.ndarray], ex: HeadExample, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    u = ex.m @ p["unit.weight"].T + p["unit.bias"]
    q = p["query.weight"] @ ex.n + p["query.bias"]
    dot = u @ q / math.sqrt(r)
    return p["scale"][0] * dot + p["bias"][0], u, q


def head_loss(p: dict[str, np.ndarray], ex: HeadExample, r: int, bce_weight: float
              ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    logits, u, q = _head_logits(p, ex, r)
    sm = np.exp(logits - logits.max())
    sm /= sm.sum()
    pg = sm[ex.gold].sum()
    y = ex.gold.astype(F32)
    loss = -math.log(max(pg, 1e-12)) + bce_weight * float(np.mean(_softplus(logits) - y * logits))
    dl = sm - np.where(ex.gold, sm / max(pg, 1e-12), 0) + bce_weight * (nn.sigmoid(logits) - y) / len(logits)
    return loss, dl.astype(F32), u, q


def train_head(train: list[HeadExample], valid: list[HeadExample], rank: int, epochs: int, seed: int,
               lr: float = 1e-3, bce_weight: float = 0.5, wd: float = 1e-3,
               progress: Callable[[int, float, float], None] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = train[0].m.shape[1]
    p = {"unit.weight": (rng.standard_normal((rank, d)) / math.sqrt(d)).astype(F32),
         "unit.bias": np.zeros(rank, F32),
         "query.weight": (rng.standard_normal((rank, d)) / math.sqrt(d)).astype(F32),
         "query.bias": np.zeros(rank, F32), "scale": np.array([4.0], F32), "bias": np.array([-2.0], F32)}
    opt = Adam(p, lr, wd=wd)
    sr = math.sqrt(rank)
    best, best_p = math.inf, {k: v.copy() for k, v in p.items()}
    for ep in range(epochs):
        for k in rng.permutation(len(train)):
            ex = train[k]
            _, dl, u, q = head_loss(p, ex, rank, bce_weight)
            s = p["scale"][0]
            du = (s / sr) * np.outer(dl, q)
            dq = (s / sr) * (u.T @ dl)
            opt.step({"unit.weight": (du.T @ ex.m).astype(F32), "unit.bias": du.sum(0).astype(F32),
                      "query.weight": np.outer(dq, ex.n).astype(F32), "query.bias": dq.astype(F32),
                      "scale": np.array([float(dl @ (u @ q)) / sr], F32), "bias": np.array([dl.sum()], F32)})
        vl = float(np.mean([head_loss(p, ex, rank, 0.0)[0] for ex in valid])) if valid else 0.0
        if vl < best:
            best, best_p = vl, {k: v.copy() for k, v in p.items()}
        if progress is not None:
            progress(ep + 1, vl, best)
    return best_p


def head_probs(p: dict[str, np.ndarray], ex: HeadExample) -> np.ndarray:
    return nn.sigmoid(_head_logits(p, ex, p["unit.weight"].shape[0])[0])
