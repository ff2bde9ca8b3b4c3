"""benchmarks/flat_gate/k_bounds.py: the range of k (unpinned units the budget keeps) that any ranking can give,
checked against the real selection over every ranking of small hand-made units."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import itertools
import random
import sys
from pathlib import Path

import numpy as np

from pflash_proxy.compress.budget import BudgetSelector
from pflash_proxy.compress.kinds import ContentKind
from pflash_proxy.compress.units import Unit

ROOT = Path(__file__).resolve().parents[2]


def _load():
    path = ROOT / "benchmarks" / "flat_gate" / "k_bounds.py"
    spec = importlib.util.spec_from_file_location("flat_gate_k_bounds", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


kb = _load()


def _units(sizes: list[int]) -> list[Unit]:
    out, line = [], 0
    for i, t in enumerate(sizes):
        out.append(Unit(i, line, line + 1, t, ContentKind.PROSE))
        line += 1
    return out


def _select_k(sizes: list[int], order: tuple[int, ...], budget: int, pinned: set[int]) -> int:
    """The real selector's kept unpinned units when the ranking is ``order`` (best first)."""
    dens = np.zeros(len(sizes))
    for rank, i in enumerate(order):
        dens[i] = len(order) - rank
    kept = BudgetSelector().select(_units(sizes), dens, budget, pinned)
    return len(set(kept) - pinned)


def _greedy_skip(sizes: list[int], cap: int) -> int:
    """Largest first, skipping a unit that does not fit and going on: NOT a lower bound."""
    total = k = 0
    for s in sorted(sizes, reverse=True):
        if total + s <= cap:
            total += s
            k += 1
    return k


def test_largest_first_prefix_is_a_lower_bound_where_the_skipping_greedy_is_not():
    sizes, cap = [8, 7, 7, 4, 1], 14
    ks = {_select_k(sizes, order, cap, set()) for order in itertools.permutations(range(len(sizes)))}
    assert min(ks) == 2 and max(ks) == 3  # 7 7 is a maximal packing of two; 1 4 7 of three
    assert kb.largest_first(sizes, cap) == 1  # 8, then 8 + 7 > 14: stops
    assert kb.largest_first(sizes, cap) <= min(ks)
    assert _greedy_skip(sizes, cap) == 3 > min(ks)  # 8 4 1: a bound computed this way would be wrong
    assert kb.smallest_first(sizes, cap) == 3 == max(ks)  # 1 4 7, the most units that fit


def test_every_ranking_of_the_selector_lies_within_the_bounds():
    rng = random.Random(7)
    for _ in range(150):
        n = rng.randint(2, 6)
        sizes = [rng.randint(1, 12) for _ in range(n)]
        pin = rng.randint(0, 1)  # a pinned tail unit, kept whatever its rank and not counted
        pinned = {n - 1} if pin else set()
        budget = rng.randint(1, 40)
        free = [s for i, s in enumerate(sizes) if i not in pinned]
        cap = budget - sum(sizes[i] for i in pinned)
        ks = [_select_k(sizes, order, budget, pinned) for order in itertools.permutations(range(n))]
        lo, hi = kb.largest_first(free, cap), kb.smallest_first(free, cap)
        assert lo <= min(ks) and max(ks) <= hi, (sizes, pinned, budget, ks, lo, hi)
        assert max(ks) == hi  # smallest first keeps exactly as many as fit


def test_k_bounds_by_hand():
    # unpinned 100 50 50 20 20 10, pinned 100, budget 300, note 10, markers at most 5, prose (no forced share)
    b = kb.Budgeting((100, 50, 50, 20, 20, 10), 100, 300, note_tokens=10, marker_tokens=5)
    # k_hi: the most units within 300 - 100 = 200: 10 20 20 50 50 (150), + 100 passes -> 5
    # X = 10 + (5 + 1) * 5 = 40; k_lo: the largest first within 300 - 40 - 100 = 160: 100 50 (150) -> 2
    assert b.extra_max(5) == 40
    assert kb.k_bounds(b) == (2, 5)
    # a named unpinned definition is always kept: k_lo is at least the named units
    named = dataclasses.replace(b, named_units=3, named_tokens=60)
    assert kb.k_bounds(named)[0] == 3
    # cut definitions: close_blocks may add 0.1 * 300 = 30 tokens (and takes them off the room)
    closing = dataclasses.replace(b, blocks=True)
    assert closing.close_max == 30
    assert kb.k_bounds(closing) == (1, 5)  # within 230: still 5 (+ 100 passes); X = 70: within 130 -> 100 -> 1
    # code, the forced units over the room: the first choice and the units of its definition (up to half the
    # budget less its own tokens) are all kept, more than the 100 - 80 = 20 tokens of room hold (4 units)
    forced = kb.Budgeting((5,) * 40, 80, 100, code=True)
    assert kb.k_bounds(forced) == (4, 1 + 45 // 5)
    assert kb.k_bounds(dataclasses.replace(forced, code=False)) == (4, 4)  # prose: the first choice alone


def test_threshold_and_verdict():
    assert kb.threshold_k(10.0, 0.0, 50) == 10  # (10 - 10) / 10 = 0 <= 0
    assert kb.spread(10.0, 9) > 0.0
    assert kb.verdict(10, 12, 10.0, 0.0) == "compressed"
    assert kb.verdict(9, 12, 10.0, 0.0) == "depends"
    assert kb.verdict(3, 9, 10.0, 0.0) == "whole"
    assert kb.threshold_k(10.0, -0.5, 15) is None  # would need 20 kept units
    assert kb.threshold_k(2.5, -0.314, 10) == 4  # 2.5 / 0.686 = 3.64


def test_the_pipeline_keeps_k_within_the_bounds_for_any_ranking():
    import collections

    from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText

    body = inspect.getsource(collections)
    question = "List every method in this file that uses `self`, with its line."
    messages = [{"role": "user", "content": f"{body}\n{question}"}]
    tt = TokenizedText.from_text(messages[0]["content"])
    request = RequestFinder().find(messages, 0, tt)
    comp = Compressor(CompressionSettings())
    first = comp.compress(tt, request, tt.total_tokens + 64, True, "paste", "1")
    a = first.analysis
    assert first.mode == "compressed" and a is not None
    bud = kb.budgeting(tt, a, first.budget_tokens, "paste", "1")
    lo, hi = kb.k_bounds(bud)
    assert 1 <= lo < hi <= len(bud.sizes)
    toks = np.array([u.tokens for u in a.units])
    seen = []
    for scores in kb.rankings(toks, 6).values():
        out = comp.compress(tt, request, tt.total_tokens + 64, True, "paste", "1",
                            analysis=dataclasses.replace(a, scores=scores))
        assert out.mode == "compressed"
        seen.append(out.units_kept - len(a.pinned))
    assert all(lo <= k <= hi for k in seen), (lo, hi, seen)
    assert len(set(seen)) > 1  # the ranking does move k
