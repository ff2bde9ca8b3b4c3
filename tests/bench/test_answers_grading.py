"""Exact-match grading of `bench answers` (no server)."""

from __future__ import annotations

from pflash_proxy.bench.cases import generate
from pflash_proxy.bench.answers import correct, expected


def test_exact_match_needs_every_answer_as_a_whole_word():
    assert correct("The special magic number is 4821930.", ["4821930"])
    assert not correct("The number is 48219301.", ["4821930"])
    assert correct("Yuki has been there", ["yuki"]) and not correct("Yukiko", ["Yuki"])
    assert correct("VAR_ABCDE and VAR_FGHIJ", ["VAR_ABCDE", "VAR_FGHIJ"])
    assert not correct("VAR_ABCDE only", ["VAR_ABCDE", "VAR_FGHIJ"])
    assert correct("It was 07:30  UTC", ["07:30 UTC"]) and not correct("", [])


def test_expected_answers_are_strings_from_the_case():
    cases = generate(["ruler_multivalue", "nolima"], [2048], seed=2)
    assert len(expected(cases[0])) == 4 and all(isinstance(a, str) for a in expected(cases[0]))
    assert expected(cases[1]) == [cases[1].answer]
