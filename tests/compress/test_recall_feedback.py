"""Recall's second hop (issue 48, recall in users' words): a follow-up whose evidence is a paragraph that only a
first paragraph names (HotpotQA's bridge) shares no word with the question; recall widens the question with the
names its best units hold (``RecallGate.widened``)."""

from __future__ import annotations

from pflash_proxy.compress.recall import RecallGate, RecallSource, asked_anew, feedback_terms
from pflash_proxy.compress.scores import LexicalScorer

from .test_word_forms import FILLER, _units


BRIDGE = ["Mirrowby Hollow is a 2004 children's novel by Tessaly Quorn. Reviewers compared it to Ormund Vey's "
          "novel The Glass Orchard, for its cellar of doors.",
          "The Glass Orchard is an 1871 fantasy novel written under the pseudonym Ormund Vey by the surveyor "
          "Halbrecht Sonnweil, who mapped the eastern canals.",
          *[f"The author {w} wrote stories of the sea in volume {i}."
            for i, w in enumerate(("Aldous", "Brigid", "Corwin", "Delphine"))],
          *FILLER]
QUESTION = 'What was the real name of the author of the book "Mirrowby Hollow" has been compared to?'


def _source(paragraphs: list[str], kept: set[int]) -> RecallSource:
    tt, units = _units(paragraphs)
    reps = LexicalScorer().represent(tt, units)
    return RecallSource(label="1", reps=reps, unit_lines=tuple((u.start_line, u.end_line) for u in units),
                        unit_tokens=tuple(u.tokens for u in units),
                        omitted_texts={i: p + "\n" for i, p in enumerate(paragraphs) if i not in kept},
                        kept_texts={i: p + "\n" for i, p in enumerate(paragraphs) if i in kept},
                        line_tokens=tuple(u.tokens for u in units), unit_kinds=tuple("prose" for _ in units))


def test_feedback_names_are_the_capitalised_words_not_opening_a_sentence_nor_asked():
    names = feedback_terms(BRIDGE[0], QUESTION).split()
    assert {"Tessaly", "Quorn", "Ormund", "Vey's", "Glass", "Orchard", "2004"} <= set(names)
    assert "Mirrowby" not in names and "Reviewers" not in names and "The" not in names


def test_recall_follows_the_names_of_the_best_unit_to_the_second_hop():
    src = _source(BRIDGE, kept={6, 7})
    budget = sum(src.unit_tokens[:2]) + 2 * 24  # room for the two hops, not for the four decoys as well
    with_feedback = RecallGate(recall_budget=budget).decide([src], QUESTION, LexicalScorer())
    without = RecallGate(recall_budget=budget, feedback=False).decide([src], QUESTION, LexicalScorer())
    got = {u for e in with_feedback.recalled for u in e.unit_indices}
    assert {0, 1} <= got
    assert 1 not in {u for e in without.recalled for u in e.unit_indices}  # the bridge shares no word with it
    assert with_feedback.share == without.share  # the gate reads the question alone


INSTRUCTION = "Answer the question based on the given documents. Only give me the answer and nothing else.\n"


def test_the_question_less_the_template_the_client_repeats():
    src = _source([INSTRUCTION.strip(), *FILLER, "Question: Which river was bridged?"], kept={0, 5})
    follow = INSTRUCTION + "\nQuestion: Who is to blame for acting unjustly? Answer:"
    assert asked_anew(follow, [src]).split() == [":", "Who", "is", "to", "blame", "for", "acting", "unjustly?", ":"]
    assert asked_anew("Who is to blame?", [src]) == "Who is to blame?"  # nothing repeated
    assert asked_anew(INSTRUCTION, [src]) == INSTRUCTION  # nothing else would be left


def test_a_repeated_template_does_not_hide_the_new_question_from_the_gate():
    paragraphs = [INSTRUCTION.strip(), *FILLER, *FILLER, "In this view, argued at length in the essays of that period and in many later commentaries on them, persons alone behave unjustly.",
                  *FILLER, f"{INSTRUCTION.strip()} Question: Which river was bridged after the delays? Answer:"]
    src = _source(paragraphs, kept={0, 1, 2, 3, 4, 14})
    follow = INSTRUCTION + "\nQuestion: Who is to blame for acting unjustly? Answer:"
    plain = RecallGate(anew=False).decide([src], follow, LexicalScorer())
    anew = RecallGate().decide([src], follow, LexicalScorer())
    assert plain.share < RecallGate().theta and not plain.recall  # the template's words in the kept units weigh
    assert anew.share > 0.5 and 9 in {u for e in anew.recalled for u in e.unit_indices}


def test_the_best_scored_omitted_unit_comes_back_before_many_small_ones():
    long = ("Southern California is the third most populated megalopolis in the country, after two on the coasts, "
            + " ".join(f"with suburb {w} and its hills and farms," for w in ("Ardel", "Brisk", "Calder", "Dunmore",
                                                                            "Elgin", "Farrow", "Garth", "Hollin"))
            + " and a long coast of beaches and ports.")
    small = [f"The megalopolis {w} grew." for w in ("Arno", "Bode", "Cale", "Dorn", "Esk", "Fal")]
    src = _source([*FILLER, long, *small], kept={0, 1})
    question = "Where does southern California's megalopolis stand in terms of population nationwide?"
    budget = src.unit_tokens[4] + 24 + 10  # room for the long one and a small one or two, not for all of them
    got = RecallGate(recall_budget=budget).decide([src], question, LexicalScorer())
    assert 4 in {u for e in got.recalled for u in e.unit_indices}
    by_density = RecallGate(recall_budget=budget, first=False).decide([src], question, LexicalScorer())
    assert 4 not in {u for e in by_density.recalled for u in e.unit_indices}
