"""Global-attention layer detection from drafter metadata and the numpy attention of the scorer (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from pflash_proxy.drafter.attention import KeyCache, global_layers, head_attention, peak_mass, token_relevance
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


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def test_head_attention_is_each_heads_softmax_over_content_with_max_over_question_tokens() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)  # 3 question tokens, 4 heads, dim 8
    k = rng.standard_normal((20, 2, 8)).astype(np.float16)  # 2 kv heads: heads 0,1 read kv 0; heads 2,3 kv 1
    got = head_attention(q, k, 0.5, sink=2, local=3)
    assert got.shape == (4, 20)
    assert (got[:, :2] == 0).all() and (got[:, -3:] == 0).all()  # sink and the question's neighbourhood
    kf = k.astype(np.float32)
    for h in range(4):
        rows = [_softmax(kf[2:17, h // 2] @ q[t, h] * 0.5) for t in range(3)]
        np.testing.assert_allclose(got[h, 2:17], np.max(rows, axis=0), rtol=1e-5)
    # a key made to match head 3's first query wins that head's row, and only heads reading kv head 1 see it
    k2 = k.copy()
    k2[10, 1] = (q[0, 3] * 4).astype(np.float16)
    a = head_attention(q, k2, 0.5, sink=2, local=3)
    assert a[3].argmax() == 10 and a[3, 10] > 0.9 and a[0, 10] == got[0, 10]
    with pytest.raises(DrafterError, match="do not match"):
        head_attention(q, rng.standard_normal((20, 3, 8)).astype(np.float16), 0.5)


def test_token_relevance_takes_the_max_over_selected_heads() -> None:
    per_layer = {5: np.array([[0.1, 0.7, 0.0], [0.5, 0.0, 0.0]], np.float32),
                 11: np.array([[0.0, 0.0, 0.9], [0.2, 0.2, 0.2]], np.float32)}
    np.testing.assert_allclose(token_relevance(per_layer, None), [0.5, 0.7, 0.9])
    np.testing.assert_allclose(token_relevance(per_layer, frozenset({(5, 1), (11, 1)})), [0.5, 0.2, 0.2])
    with pytest.raises(DrafterError, match="none of the selected"):
        token_relevance(per_layer, frozenset({(17, 0)}))


def test_unit_scores_are_the_peaks_plus_a_trace_of_the_background() -> None:
    rel = np.full(200, 0.1)
    rel[50] = 0.9  # one peak token; the 99th percentile sits just below it
    rel[120:124] = 0.2  # above the median only
    got = peak_mass(rel, np.array([0, 100, 150]), np.array([100, 150, 200]))
    q99 = np.quantile(rel, 0.99)
    np.testing.assert_allclose(got, [(0.9 - q99) + 1e-3 * 0.8, 1e-3 * 0.4, 0.0])
    assert got[0] > 100 * got[1] > 0  # a peak outranks any background; the background still orders the rest
    # spread background alone (an "every record" request) leaves no unit ahead of another
    assert peak_mass(np.full(8, 0.2), np.array([0, 4]), np.array([4, 8])).sum() == 0


def test_key_cache_is_bounded_in_bytes() -> None:
    kc = KeyCache(max_bytes=3000)
    a = {5: np.zeros((500, 1, 1), np.float16)}  # 1000 bytes
    for i in range(4):
        kc.put(f"m{i}", a)
    assert kc.get("m0") is None and kc.get("m3") is not None and kc.get("m1") is not None
    kc.put("big", {5: np.zeros((5000, 1, 1), np.float16)})
    assert kc.get("big") is None and kc.get("m3") is not None


def test_request_tail_finds_a_question_the_message_ends_with() -> None:
    from pflash_proxy.drafter.attention import last_paragraph, request_tail
    text = "alpha beta\n\ngamma delta\n\nQuestion: who?\n"
    starts = np.array([0, 6, 12, 18, 25, 35, 40], np.int64)  # byte offsets of 7 stand-in tokens
    payload = {"tail": text, "tail_byte": 0, "byte_starts": starts, "tokens": np.zeros(7)}
    assert request_tail(payload, "gamma delta\n\nQuestion: who?") == 7 - 2  # from byte 12 (token 2) on
    assert request_tail(payload, "Question: who?") == 7 - 4  # byte 24 -> the first token starting at/after it
    short = {**payload, "tail": text[-20:], "tail_byte": len(text) - 20}  # only the tail is kept in the reps
    assert request_tail(short, "Question: who?") == 7 - 4
    assert request_tail(payload, "something else") == 0 and request_tail(payload, "  ") == 0
    assert last_paragraph("gamma delta\n\n  \nQuestion: who?\n") == "Question: who?"


def test_calibration_ranks_the_needle_line_by_mean_relevance_per_token() -> None:
    from pflash_proxy.drafter.calibrate import Read, Task, needle_ranks
    read = Read(Task("", "", 1, "literal"), np.array([0, 0, 1, 2, 2, 2]),
                {5: np.array([[0.9, 0.9, 0.5, 0.1, 0.1, 0.1],    # line 0 (mean 0.9) beats the needle (0.5)
                              [0.1, 0.1, 0.8, 0.2, 0.2, 0.2]])})  # the needle's line first
    assert needle_ranks(read) == {(5, 0): 1, (5, 1): 0}
    assert read.needle_rank(np.array([0.0, 0.0, 0.3, 0.6, 0.0, 0.0])) == 0  # line 2's mean 0.2 < 0.3
