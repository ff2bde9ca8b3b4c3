"""Probe file format: round trip, numpy forward vs an independent float64 reference, and rejections."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pflash_proxy.drafter import hashing
from pflash_proxy.drafter.probe_writer import (random_head_weights, random_request_weights,
                                               random_segment_weights, write_request_probe,
                                               write_scorer_head, write_segment_probe)
from pflash_proxy.drafter.probes import (SEED_DRAFTER_SHA256, SEGMENT_TENSORS, ProbeFileError, ProbeMismatch,
                                         load_request_probe, load_scorer_head, load_segment_probe)

D = 96


def ref_forward(w: dict[str, np.ndarray], prefix: str, tap: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """float64, loop-based: LayerNorm -> Linear -> erf GELU -> row -> 5-tap conv + bias + residual logit."""
    g = {k: v.astype(np.float64) for k, v in w.items()}
    T = tap.shape[0]
    z = np.zeros(T)
    for t in range(T):
        x = tap[t].astype(np.float64)
        mu = sum(x) / len(x)
        var = sum((xi - mu) ** 2 for xi in x) / len(x)
        xn = [(xi - mu) / math.sqrt(var + eps) * a + b
              for xi, a, b in zip(x, g["probe.norm.weight"], g["probe.norm.bias"])]
        h = g["probe.fc.weight"] @ np.array(xn) + g["probe.fc.bias"]
        h = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in h])
        z[t] = float(h @ g[f"{prefix}.weight"]) + g[f"{prefix}.bias"][0]
    out = np.zeros(T)
    cw = g[f"{prefix}.conv.weight"]
    for t in range(T):
        acc = g[f"{prefix}.conv.bias"][0]
        for k in range(5):
            i = t + k - 2
            if 0 <= i < T:
                acc += cw[k] * z[i]
        out[t] = acc + z[t]
    return out


def test_segment_table_has_16_tensors_and_seed_defaults(tmp: Path) -> None:
    assert len(SEGMENT_TENSORS) == 16
    path = tmp / "seg.gguf"
    write_segment_probe(path, random_segment_weights(D))
    p = load_segment_probe(path)
    assert p.meta.tap_block == 14 and p.meta.d == D and p.meta.tap_tensor == "l_out-14"
    assert p.meta.drafter_sha256 == SEED_DRAFTER_SHA256
    assert abs(p.threshold - 0.8) < 1e-6 and p.min_segment == 32 and p.max_segment == 512
    assert p.oversize_split == "line_aligned"
    from gguf import GGUFReader
    assert len(GGUFReader(str(path)).tensors) == 16


@pytest.mark.parametrize("out", ["unit", "container", "subunit"])
def test_segment_forward_matches_float64_reference(tmp: Path, out: str) -> None:
    w = random_segment_weights(D, seed=3)
    write_segment_probe(tmp / "seg.gguf", w)
    p = load_segment_probe(tmp / "seg.gguf")
    tap = (np.random.default_rng(0).standard_normal((37, D)) * 3 + 0.5).astype(np.float32)
    got = getattr(p.forward(tap), out)
    ref = ref_forward(w, f"probe.{out}", tap)
    assert got.dtype == np.float32 and got.shape == (37,)
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * np.abs(ref).max())


def test_conv_is_centred_and_zero_padded(tmp: Path) -> None:
    """An impulse at token 10 in the row logit shows the kernel un-flipped at tokens 8..12."""
    w = random_segment_weights(D, seed=4)
    w["probe.unit.conv.weight"] = np.array([1, 2, 3, 4, 5], np.float32)
    w["probe.unit.conv.bias"] = np.array([0.25], np.float32)
    write_segment_probe(tmp / "seg.gguf", w)
    p = load_segment_probe(tmp / "seg.gguf")
    z = np.zeros(20, np.float32)
    z[10] = 1.0
    y = p.rows["unit"].conv_weight, p.rows["unit"].conv_bias
    from pflash_proxy.drafter.nn import conv5
    r = conv5(z, *y)
    np.testing.assert_allclose(r[8:13], np.array([5, 4, 3, 2, 1]) + 0.25)
    assert np.allclose(r[:8], 0.25) and np.allclose(r[13:], 0.25)
    r0 = conv5(np.r_[np.float32(1.0), np.zeros(4, np.float32)], y[0], 0.0)
    np.testing.assert_allclose(r0, [3, 2, 1, 0, 0])  # zero padding left of token 0


def test_request_probe_and_head_round_trip(tmp: Path) -> None:
    w = random_request_weights(D)
    write_request_probe(tmp / "req.gguf", w, {"query_pin": 256})
    rp = load_request_probe(tmp / "req.gguf")
    assert rp.query_pin == 256 and rp.query_tokens == 128
    tap = np.random.default_rng(1).standard_normal((9, D)).astype(np.float32)
    np.testing.assert_allclose(rp.forward(tap), ref_forward(w, "probe.request", tap), rtol=2e-4, atol=1e-3)
    hw = random_head_weights(D, rank=16)
    write_scorer_head(tmp / "head.gguf", hw)
    h = load_scorer_head(tmp / "head.gguf")
    assert h.rank == 16 and h.unit_weight.shape == (16, D)
    np.testing.assert_array_equal(h.query_weight, hw["head.query.weight"])


def test_mismatched_drafter_names_both_hashes(tmp: Path) -> None:
    write_segment_probe(tmp / "seg.gguf", random_segment_weights(D))
    fake = tmp / "other-drafter.gguf"
    fake.write_bytes(b"not the seed drafter")
    import hashlib
    other = hashlib.sha256(b"not the seed drafter").hexdigest()
    with pytest.raises(ProbeMismatch) as e:
        load_segment_probe(tmp / "seg.gguf", fake)
    assert SEED_DRAFTER_SHA256 in str(e.value) and other in str(e.value) and "\n" not in str(e.value)
    write_request_probe(tmp / "req.gguf", random_request_weights(D), drafter_sha256=other)
    assert load_request_probe(tmp / "req.gguf", fake).meta.drafter_sha256 == other
    with pytest.raises(ProbeMismatch):
        load_scorer_head(_head(tmp), fake)


def _head(tmp: Path) -> Path:
    write_scorer_head(tmp / "head.gguf", random_head_weights(D, 8))
    return tmp / "head.gguf"


@pytest.mark.parametrize("cut", [0, 7, 100, 2000, -600])
def test_truncated_or_corrupt_files_raise_one_clear_line(tmp: Path, cut: int) -> None:
    write_segment_probe(tmp / "seg.gguf", random_segment_weights(D))
    data = (tmp / "seg.gguf").read_bytes()
    bad = tmp / "bad.gguf"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    with pytest.raises(ProbeFileError) as e:
        load_segment_probe(bad)
    msg = str(e.value)
    assert str(bad) in msg and "\n" not in msg


def test_wrong_kind_and_missing_file(tmp: Path) -> None:
    write_segment_probe(tmp / "seg.gguf", random_segment_weights(D))
    with pytest.raises(ProbeFileError, match="architecture 'segmentprobe', expected 'requestprobe'"):
        load_request_probe(tmp / "seg.gguf")
    with pytest.raises(ProbeFileError, match="does not exist"):
        load_segment_probe(tmp / "nope.gguf")
    w = random_segment_weights(D)
    w["probe.fc.bias"] = np.full(256, np.nan, np.float32)
    write_segment_probe(tmp / "nan.gguf", w)
    with pytest.raises(ProbeFileError, match="non-finite"):
        load_segment_probe(tmp / "nan.gguf")


def test_drafter_hash_is_cached_by_size_and_mtime(tmp: Path) -> None:
    f = tmp / "drafter.gguf"
    f.write_bytes(b"a" * 1000)
    cache = tmp / "hashes.json"
    n0 = hashing.HASH_CALLS["n"]
    h1 = hashing.file_sha256(f, cache)
    h2 = hashing.file_sha256(f, cache)
    assert h1 == h2 and hashing.HASH_CALLS["n"] == n0 + 1
    hashing._MEMO.clear()  # a new process: the JSON cache answers without hashing
    assert hashing.file_sha256(f, cache) == h1 and hashing.HASH_CALLS["n"] == n0 + 1
    f.write_bytes(b"b" * 1001)  # changed size -> hashed again
    assert hashing.file_sha256(f, cache) != h1 and hashing.HASH_CALLS["n"] == n0 + 2
