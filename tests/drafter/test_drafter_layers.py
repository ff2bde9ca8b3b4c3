"""Global-attention layer detection from drafter metadata (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from pflash_proxy.drafter.attention import global_layers, mean_attention, unit_mass
from pflash_proxy.drafter.runtime import DrafterError


def meta(d: dict[str, str]):
    return d.get


def test_gemma3_builtin_pattern_gives_5_11_17() -> None:
    m = meta({"general.architecture": "gemma3", "gemma3.attention.sliding_window": "512"})
    assert global_layers(m, 18) == (5, 11, 17)


def test_explicit_pattern_array_interval_and_override() -> None:
    m = meta({"general.architecture": "x", "x.attention.sliding_window": "128",
              "x.attention.sliding_window_pattern": "4"})
    assert global_layers(m, 12) == (3, 7, 11)
    m = meta({"general.architecture": "x", "x.attention.sliding_window": "128",
              "x.attention.sliding_window_pattern": "[true, false, true, false]"})
    assert global_layers(m, 4) == (1, 3)
    m = meta({"general.architecture": "qwen35", "qwen35.full_attention_interval": "4"})
    assert global_layers(m, 24) == (3, 7, 11, 15, 19, 23)
    assert global_layers(meta({"general.architecture": "llama"}), 3) == (0, 1, 2)
    assert global_layers(meta({}), 3, override=[2, 0]) == (0, 2)
    with pytest.raises(DrafterError, match="configure"):
        global_layers(meta({"general.architecture": "mystery", "mystery.attention.sliding_window": "64"}), 8)


def test_mean_attention_and_unit_mass() -> None:
    att = {5: np.array([4.0, 0.0, 8.0], np.float32), 11: np.array([0.0, 4.0, 8.0], np.float32)}
    a = mean_attention(att, n_head=2, n_query=2)  # mean over layers / (heads * query tokens)
    np.testing.assert_allclose(a, [0.5, 0.5, 2.0])
    np.testing.assert_allclose(unit_mass(a, np.array([0, 2]), np.array([2, 3])), [1.0, 2.0])
    with pytest.raises(DrafterError):
        mean_attention({5: np.array([np.nan], np.float32)}, 1, 1)
