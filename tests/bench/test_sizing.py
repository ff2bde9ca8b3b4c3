"""Sizing cases in the upstream's tokens (`bench.sizing`), with stand-in tokenizers of known ratios."""

from __future__ import annotations

import asyncio

import pytest

from pflash_proxy.bench.cases import default_count_tokens, generate
from pflash_proxy.bench.sizing import TOLERANCE, sized_case, sized_cases


def _counter(bytes_per_token: float):
    calls = []

    async def count(text: str) -> int:
        calls.append(len(text))
        return round(len(text.encode()) / bytes_per_token)

    count.calls = calls  # type: ignore[attr-defined]
    return count


@pytest.mark.parametrize("family", ["ruler_single", "vartrack", "multiturn", "aggregation"])
def test_a_dense_tokenizer_gets_a_case_of_the_asked_length(family):
    # 2 bytes per token: the bytes/4 estimate alone would make the case twice as long as asked.
    count = _counter(2.0)
    case = asyncio.run(sized_case(count, family, 4096, seed=3))
    assert abs(case.meta["real_tokens"] - 4096) <= TOLERANCE * 4096
    assert case.meta["generated_at"] < 4096 * 0.6
    assert case.case_id == f"{family}-4k-0-s3" and case.target_tokens == 4096
    assert 2 <= len(count.calls) <= 4  # the estimate, then at most a few corrections


def test_cap_keeps_the_case_inside_the_slot():
    case = asyncio.run(sized_case(_counter(4.0), "ruler_single", 8192, cap=6000))
    assert case.meta["real_tokens"] <= 6000
    assert case.meta["real_tokens"] >= 6000 / (1 + TOLERANCE) * (1 - TOLERANCE)
    assert case.case_id.startswith("ruler_single-8k-") and case.target_tokens == 8192


def test_agent_variant_follows_the_labelled_length_not_the_resizing_target():
    # At 16K the agent case is a log; resizing to ~half must not flip it to the source variant.
    plain = generate(["agent"], [16384])[0]
    sized = asyncio.run(sized_case(_counter(2.0), "agent", 16384))
    assert plain.meta["variant"] == sized.meta["variant"] == "log"


def test_sized_cases_keep_generate_order_and_an_exact_estimator_changes_nothing():
    async def estimate(text: str) -> int:
        return default_count_tokens(text)

    sized = asyncio.run(sized_cases(estimate, ["ruler_single", "nolima"], [2048, 4096], per_family=2))
    plain = generate(["ruler_single", "nolima"], [2048, 4096], per_family=2)
    assert [c.case_id for c in sized] == [c.case_id for c in plain]
    within = [abs(c.meta["real_tokens"] - c.target_tokens) <= TOLERANCE * c.target_tokens for c in sized]
    first_try = [c for c, ok in zip(sized, within) if ok and c.meta["generated_at"] == c.target_tokens]
    assert all(within) and first_try
    for s, p in zip(first_try, [p for p in plain if p.case_id in {c.case_id for c in first_try}]):
        assert s.messages == p.messages


def test_per_family_counts_one_number_or_per_family_overrides():
    import argparse

    from pflash_proxy.bench import _per_family

    async def estimate(text: str) -> int:
        return default_count_tokens(text)

    assert _per_family("3") == 3
    counts = _per_family("1,nolima=3")
    assert counts == {"*": 1, "nolima": 3}
    cases = asyncio.run(sized_cases(estimate, ["ruler_single", "nolima"], [2048], per_family=counts))
    assert [c.case_id for c in cases] == ["ruler_single-2k-0-s0"] + [f"nolima-2k-{i}-s0" for i in range(3)]
    for bad in ("x", "1,nolima=-2", "nolima=two"):
        with pytest.raises(argparse.ArgumentTypeError):
            _per_family(bad)
