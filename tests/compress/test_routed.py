"""``--scorer auto``: code goes to BM25 without touching the drafter's scorer; prose, records and tool output go
to the drafter's scorer; recall re-asks the scorer that made the reps."""

from __future__ import annotations

import inspect
import pickle
import textwrap

import numpy as np

from pflash_proxy.compress.kinds import ContentKind
from pflash_proxy.compress.pipeline import CompressionSettings, Compressor
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.routed import RoutedScorer, is_code
from pflash_proxy.compress.scores import LexicalScorer, UnitReps
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter


class CountingScorer:
    """Stands in for the drafter's scorer: counts its calls, prefers the last unit."""

    name = "head-attention"
    heads = ((5, 1),)

    def __init__(self) -> None:
        self.calls = {"represent": 0, "score": 0}

    def represent(self, tt, units):
        self.calls["represent"] += 1
        return UnitReps(self.name, len(units), np.asarray([u.tokens for u in units]), None)

    def score(self, reps, query):
        self.calls["score"] += 1
        s = np.full(reps.n_units, 0.01)
        s[-1] = 1.0
        return s


def prose() -> TokenizedText:
    paras = [f"Paragraph {i} tells of the harbour town, its ferries and the weather of week {i}. " * 4
             for i in range(60)]
    return TokenizedText.from_text("\n\n".join(paras))


def test_code_is_scored_by_bm25_and_never_reaches_the_drafter():
    tt = TokenizedText.from_text(inspect.getsource(textwrap))
    units = list(UnitSegmenter().segment(tt, None))
    assert is_code(units)
    drafter = CountingScorer()
    scorer = RoutedScorer(LexicalScorer(), drafter)
    reps = scorer.represent(tt, units)
    q = "What does indent do with the predicate argument?"
    got = scorer.score(reps, q)
    lexical = LexicalScorer()
    np.testing.assert_allclose(got, lexical.score(lexical.represent(tt, units), q))
    again = pickle.loads(pickle.dumps(reps))  # recall: the reps travel pickled and are asked again
    np.testing.assert_allclose(scorer.score(again, "And dedent?"), lexical.score(lexical.represent(tt, units),
                                                                                "And dedent?"))
    assert drafter.calls == {"represent": 0, "score": 0}


def test_prose_goes_to_the_drafter_scorer_and_the_pipeline_follows_it():
    tt = prose()
    units = list(UnitSegmenter().segment(tt, None))
    assert not is_code(units) and {u.kind for u in units} != {ContentKind.CODE}
    drafter = CountingScorer()
    scorer = RoutedScorer(LexicalScorer(), drafter)
    assert scorer.name == "auto" and scorer.heads == drafter.heads  # /pflash/stats reads the drafter side
    comp = Compressor(CompressionSettings(threshold=256, curve="1000:0.2 4000:0.2"), scorer=scorer)
    out = comp.compress(tt, RequestSpec("Which week had the storm?", 0, "tool-call"), tt.total_tokens, True,
                        "tool", "1")
    assert drafter.calls["represent"] == 1 and drafter.calls["score"] == 1
    assert out.mode == "compressed" and "week 59" in out.text  # the drafter's choice (the last unit) was kept


def test_a_message_half_code_half_prose_is_code_only_when_code_holds_half_its_tokens():
    code = inspect.getsource(textwrap.indent)
    tt_code = TokenizedText.from_text(code * 3 + "\n\nA short note after the code.\n")
    tt_prose = TokenizedText.from_text(code + "\n\n" + prose().text)
    seg = UnitSegmenter()
    assert is_code(list(seg.segment(tt_code, None)))
    assert not is_code(list(seg.segment(tt_prose, None)))
