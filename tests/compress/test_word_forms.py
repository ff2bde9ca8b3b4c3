"""Prose word forms (issue 48, recall in users' words): a question's word matches its other forms in prose units
("PPP" / "PPPs", "populated" / "population"), never in code."""

from __future__ import annotations

import dataclasses

import numpy as np

from pflash_proxy.compress.kinds import ContentKind
from pflash_proxy.compress.lexicon import stem, word_forms
from pflash_proxy.compress.scores import LexicalScorer
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import Unit

FILLER = ("The committee met on a Tuesday to review the budget of the regional water board and its pumps.",
          "Rainfall in the northern valleys was below the average of the previous decade for most months.",
          "A new bridge over the river opened after four years of work and several delays in its funding.",
          "The museum added a wing for textiles, with looms and dyes gathered from villages along the coast.")


def _units(paragraphs: list[str], kind: ContentKind = ContentKind.PROSE) -> tuple[TokenizedText, list[Unit]]:
    text = "".join(p + "\n" for p in paragraphs)
    counts = [len(p.split()) + 1 for p in paragraphs]
    tt = TokenizedText.from_text(text, counts)
    return tt, [Unit(i, i, i + 1, t, kind) for i, t in enumerate(counts)]


def test_stem_joins_inflections_and_derivations_and_leaves_short_and_latin_words():
    assert stem("ppps") == stem("ppp") == "ppp"
    assert stem("population") == stem("populated") == stem("populating") == "popul"
    assert stem("segregation") == stem("segregating") == stem("segregated")
    assert stem("cities") == stem("city") and stem("studied") == stem("studies") == stem("study")
    assert stem("unjustly") == "unjust" and stem("only") == stem("onli") != stem("on")
    assert stem("class") == "class" and stem("analysis") == "analysis" and stem("virus") == "virus"
    assert stem("is") == "is" and stem("x86s") == "x86s"
    assert "population" in word_forms("populated") and "ppps" in word_forms("ppp")
    assert all(stem(f) == stem("protests") for f in word_forms("protests")) and "protests" not in word_forms(
        "protests")


def test_a_question_word_matches_its_other_forms_in_prose_only():
    paragraphs = [*FILLER, "Projects are run as Public-Private Partnering (PPPs) with private finance.",
                  "It is the third most populated megalopolis in the country, after two on the coasts."]
    asks = {"What is a PPP also known as?": 4, "Which megalopolis has the third largest population?": 5}
    for question, gold in asks.items():
        tt, units = _units(paragraphs)
        plain, forms = LexicalScorer(forms=False), LexicalScorer()
        s_forms = forms.score(forms.represent(tt, units), question)
        s_plain = plain.score(plain.represent(tt, units), question)
        assert int(np.argmax(s_forms)) == gold and s_forms[gold] > s_plain[gold], question
        assert np.allclose(np.delete(s_forms, gold), np.delete(s_plain, gold))  # nothing else moved
        # code: the same lines as code units score exactly as without forms
        tt, units = _units(paragraphs, ContentKind.CODE)
        assert np.array_equal(forms.score(forms.represent(tt, units), question),
                              plain.score(plain.represent(tt, units), question))


def test_a_unit_counts_the_best_form_once_and_reps_without_the_prose_mask_score_as_before():
    tt, units = _units([*FILLER, "Cities and a city: the city grew as cities do."])
    scorer = LexicalScorer()
    reps = scorer.represent(tt, units)
    one = scorer.score(reps, "which city")[4]
    assert one == LexicalScorer(forms=False).score(LexicalScorer(forms=False).represent(tt, units), "which city")[4]
    old = dataclasses.replace(reps, payload=dataclasses.replace(reps.payload, prose=None))  # stored before forms
    assert scorer.score(old, "which cities")[4] > 0 and scorer.score(old, "which town")[4] == 0
    assert scorer.score(old, "what about citi")[4] == 0  # no form matching without the mask
