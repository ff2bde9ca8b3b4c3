"""Reference hops over a drafter scorer's relevance (``compress/links.py``): no model, fixed scores."""

from __future__ import annotations

import numpy as np

from pflash_proxy.compress.links import HOPS, Linked, ReferenceLinks, propagate
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter
from tests.compress.test_fusion import FixedScorer

CHAIN = ["VAR_QWERT = 48213", "VAR_ZXCVB = VAR_QWERT", "VAR_POIUY = VAR_ZXCVB", "VAR_LKJHG = VAR_POIUY"]


def _doc(extra: dict[int, str]):
    paras = [f"Paragraph {i} is about harbour cranes, tide tables and the weight of cargo number {i}." * 3
             for i in range(14)]
    for k, line in extra.items():
        paras[k] += "\n" + line
    tt = TokenizedText.from_text("\n\n".join(paras) + "\n")
    units = list(UnitSegmenter(4, 64).segment(tt, None))
    where = {ln: next(i for i, u in enumerate(units) if ln in tt.range_text(u.start_line, u.end_line))
             for ln in extra.values()}
    return tt, units, where


def test_a_chain_found_by_nobody_is_raised_in_order_below_the_source():
    tt, units, where = _doc(dict(zip((2, 6, 9, 12), CHAIN)))
    scores = np.full(len(units), 0.01)
    src = where[CHAIN[0]]
    scores[src] = 1.0  # the scorer found the value's line, and nothing of the chain that leads from it
    scores[0] = 0.5  # a unit of prose the scorer also liked, below half the peak: not a source
    got = Linked(FixedScorer(scores)).score(Linked(FixedScorer(scores)).represent(tt, units), "q")
    d = got / np.array([u.tokens for u in units])
    chain = [d[where[ln]] for ln in CHAIN]
    assert chain == sorted(chain, reverse=True) and len(set(chain)) == len(chain)  # the chain keeps its order
    assert np.argmax(d) == src  # below the source that led to it
    low = np.delete(d, [where[ln] for ln in CHAIN] + [0])
    assert min(chain[1:]) > low.max()  # above everything the scorer did not find
    untouched = [i for i in range(len(units)) if i not in [where[ln] for ln in CHAIN[1:]]]
    np.testing.assert_array_equal(got[untouched], scores[untouched])


def test_prose_and_unlinked_messages_rank_exactly_as_the_scorer_said():
    tt, units, _ = _doc({3: "The quartermaster recounted the barrels twice.", 8: "Quartermaster duties end at noon."})
    links = ReferenceLinks.build(tt, units)
    assert links.empty  # words without a digit, an underscore or a hump are not names; "3", "8" are too short
    scores = np.linspace(1.0, 0.1, len(units))
    np.testing.assert_array_equal(propagate(links, scores, np.array([u.tokens for u in units])), scores)


def test_hops_and_reach_are_bounded():
    long_chain = [f"VAR_{c}{c}{c} = " + ("777" if i == 0 else f"VAR_{p}{p}{p}")
                  for i, (p, c) in enumerate(zip("ABCDEFGHIJ", "BCDEFGHIJK"))]
    tt, units, where = _doc(dict(zip(range(1, 11), long_chain)))
    scores = np.full(len(units), 0.01)
    scores[where[long_chain[0]]] = 1.0
    tokens = np.array([u.tokens for u in units])
    got = propagate(ReferenceLinks.build(tt, units), scores, tokens)
    raised = [got[where[ln]] > 0.01 + 1e-12 for ln in long_chain[1:]]
    assert raised == [True] * HOPS + [False] * (len(long_chain) - 1 - HOPS)
    few = propagate(ReferenceLinks.build(tt, units), scores, tokens, reach=2)
    assert [few[where[ln]] > 0.01 + 1e-12 for ln in long_chain[1:4]] == [True, True, False]


def test_raised_units_take_at_most_a_small_share_of_the_message():
    """A whole-file tool output: the source calls helpers defined in big units. Raising them all pushed the
    gold function out of an 8K budget on the tuning set; only units within ``REACH_SHARE`` of the message are."""
    from pflash_proxy.compress.links import REACH_SHARE

    body = "    total = total + weight_of_cargo * tide_factor - crane_offset\n" * 40
    funcs = [f"def helper_{c}(x):\n{body}    return x\n" for c in "abc"]
    caller = "def main_entry(x):\n    y = helper_a(x)\n    return helper_b(y)\n"
    tt = TokenizedText.from_text(caller + "\n" + "\n".join(funcs) + "\nsmall_tail = helper_c(1)\n")
    units = list(UnitSegmenter(4, 4096).segment(tt, None))
    tokens = np.array([u.tokens for u in units])
    scores = np.full(len(units), 0.01)
    scores[0] = 5.0  # the scorer found main_entry
    links = ReferenceLinks.build(tt, units)
    assert not links.empty
    got = propagate(links, scores, tokens, reach_share=1.0)
    assert (got > scores + 1e-12).sum() >= 2  # unbounded: both helpers raised
    bounded = propagate(links, scores, tokens)
    raised = bounded > scores + 1e-12
    assert tokens[raised].sum() <= REACH_SHARE * tokens.sum()
