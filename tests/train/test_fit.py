"""The hand-written gradients of ``train.fit`` against finite differences, and training that learns."""

from __future__ import annotations

import numpy as np

from pflash_proxy.train import fit


def _num_grad(f, p, key, idx, eps=1e-3):
    old = p[key][idx]
    p[key][idx] = old + eps
    a = f()
    p[key][idx] = old - eps
    b = f()
    p[key][idx] = old
    return (a - b) / (2 * eps)


def test_probe_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    d, rows = 12, ["unit", "subunit"]
    x = rng.standard_normal((20, d)).astype(np.float32)
    doc = np.array([0] * 9 + [1] * 11)
    y = (rng.random((20, 2)) < 0.3).astype(np.float32)
    p = fit.init_probe(d, rows, np.array([0.3, 0.3]), rng, hidden=8)
    for k in p:
        p[k] = p[k].astype(np.float64)
        if "conv.weight" in k:
            p[k] = rng.standard_normal(5) * 0.5
    pw, rw = np.array([3.0, 1.0]), np.array([1.0, 0.5])

    def loss():
        out, _ = fit.probe_forward(p, rows, x.astype(np.float64), doc)
        return fit.bce(out, y, pw, rw)[0]

    out, cache = fit.probe_forward(p, rows, x.astype(np.float64), doc)
    g = fit.probe_backward(p, rows, cache, fit.bce(out, y, pw, rw)[1])
    for key, idx in [("fc.weight", (3, 5)), ("fc.bias", (2,)), ("unit.weight", (4,)), ("subunit.bias", (0,)),
                     ("unit.conv.weight", (0,)), ("unit.conv.weight", (4,)), ("subunit.conv.bias", (0,))]:
        assert np.isclose(g[key][idx], _num_grad(loss, p, key, idx), rtol=2e-2, atol=1e-5), key


def test_conv_does_not_read_across_documents():
    rng = np.random.default_rng(1)
    p = fit.init_probe(4, ["unit"], np.array([0.5]), rng, hidden=3)
    p["unit.conv.weight"][:] = 1.0
    x = rng.standard_normal((6, 4)).astype(np.float32)
    joined, _ = fit.probe_forward(p, ["unit"], x, np.array([0, 0, 0, 1, 1, 1]))
    alone, _ = fit.probe_forward(p, ["unit"], x[:3], np.array([0, 0, 0]))
    assert np.allclose(joined[:3], alone)


def test_head_gradients_match_finite_differences():
    rng = np.random.default_rng(2)
    d, r = 10, 4
    ex = fit.HeadExample(rng.standard_normal((7, d)), rng.standard_normal(d), np.array([0, 0, 1, 0, 1, 0, 0], bool),
                         np.full(7, 20))
    p = {"unit.weight": rng.standard_normal((r, d)), "unit.bias": rng.standard_normal(r),
         "query.weight": rng.standard_normal((r, d)), "query.bias": rng.standard_normal(r),
         "scale": np.array([2.0]), "bias": np.array([-1.0])}
    loss = lambda: fit.head_loss(p, ex, r, 0.5)[0]  # noqa: E731
    _, dl, u, q = fit.head_loss(p, ex, r, 0.5)
    sr = np.sqrt(r)
    du = p["scale"][0] / sr * np.outer(dl, q)
    dq = p["scale"][0] / sr * (u.T @ dl)
    grads = {"unit.weight": du.T @ ex.m, "query.weight": np.outer(dq, ex.n), "query.bias": dq,
             "scale": np.array([dl @ (u @ q) / sr]), "bias": np.array([dl.sum()])}
    for key, idx in [("unit.weight", (1, 3)), ("query.weight", (2, 0)), ("query.bias", (1,)), ("scale", (0,)),
                     ("bias", (0,))]:
        assert np.isclose(grads[key][idx], _num_grad(loss, p, key, idx, 1e-5), rtol=1e-3, atol=1e-7), key


def test_head_training_learns_a_planted_direction():
    rng = np.random.default_rng(3)
    d = 16

    def example():
        m = rng.standard_normal((12, d)).astype(np.float32)
        n = rng.standard_normal(d).astype(np.float32)
        g = rng.integers(12)
        m[g] += 1.5 * n  # the gold unit points where the question points
        gold = np.zeros(12, bool)
        gold[g] = True
        return fit.HeadExample(m, n, gold, np.full(12, 30))

    train, valid = [example() for _ in range(200)], [example() for _ in range(50)]
    p = fit.train_head(train, valid, 16, 30, seed=0, lr=3e-3)
    top1 = np.mean([np.argmax(fit.head_probs(p, ex)) == np.flatnonzero(ex.gold)[0] for ex in valid])
    assert top1 > 0.8
