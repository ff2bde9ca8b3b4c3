"""A request that asks for every match, in any wording, is recognised by what it asks (issue 48, '"Every X"
without a phrase list'), and is served whole or with every match; a request about the whole message is served
whole when cold; pointed ones are still compressed."""

from __future__ import annotations

import inspect
import subprocess

import pytest

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.pipeline import CompressionSettings
from pflash_proxy.compress.forms import NAME, every_intent
from pflash_proxy.compress.spread import asks_for_every, asks_for_whole

from .every_dev import EVERY, POINTED

SOURCE = inspect.getsource(subprocess)  # ~22K tokens of real code; _remaining_time is used in 8 places


def test_the_dev_phrasings():
    """The issue's misses and the dev phrasings (``every_dev``): at least 90 % each way on dev (the issue's bar)."""
    for q in ("Which functions call retry?", "Where is retry used?", "Describe all handlers",
              "What does each handler do?", "Give a Summary of what this module does"):
        assert asks_for_every(q), q
    every = sum(asks_for_every(q) for q in EVERY)
    pointed = sum(not asks_for_every(q) for q in POINTED)
    assert every >= 0.9 * len(EVERY) and pointed >= 0.9 * len(POINTED), (every, pointed)


@pytest.mark.parametrize("sentence, intent", [
    ("give a summary of what this module does", "whole"), ("what is this file for?", "whole"),
    (f"summarize the {NAME} class.", "every"), ("tl;dr?", "whole"), ("summarize, please.", "whole"),
    (f"which functions call {NAME}?", "every"), ("which functions call retry?", "whole"),
    ("what does each function here do?", "whole"), ("quote all of its fields.", "every"),
    ("what does trimcoef return when every coefficient is small?", None),
    ("which function returns all items of a list?", None), ("what causes the deadlock?", None),
    # bench quality's code questions: a singular "which function" is about one thing, whatever its predicate
    ("which function returns the number of loops and time taken so that total time >= 0.2?", None),
    ("which function reads until one from a list of a regular expressions matches?", None),
])
def test_every_intent(sentence, intent):
    assert every_intent(sentence) == intent


def compress(question: str, in_conversation: bool = False):
    text = SOURCE + "\n" + question + "\n"
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find([{"role": "user", "content": text}], 0, tt)
    return Compressor(CompressionSettings(threshold=1024)).compress(tt, request, tt.total_tokens, in_conversation,
                                                                    "paste", "1")


@pytest.mark.parametrize("question", ["Where is _remaining_time used?", "Which functions call _remaining_time?",
                                      "Show me every call to _remaining_time.", "Who calls _remaining_time?"])
def test_every_match_is_kept_or_the_message_served_whole(question):
    out = compress(question)
    if out.mode == "full-flat":
        return
    assert out.mode == "compressed"
    lines = [ln for ln in SOURCE.splitlines() if "_remaining_time" in ln]
    assert len(lines) == 9 and all(ln in out.text for ln in lines), question


def test_a_pointed_question_about_the_same_name_is_compressed():
    out = compress("What does _remaining_time return when no timeout was given?")
    assert out.mode == "compressed" and out.served_message_tokens < 0.35 * out.message_tokens
    assert "def _remaining_time(self, endtime):" in out.text


def test_a_request_about_the_whole_message_is_served_whole_warm_or_cold_and_says_why():
    out = compress("Give a Summary of what this module does")
    assert asks_for_whole("Give a Summary of what this module does")
    assert out.mode == "full-flat" and "a request about the whole message" in out.reason
    warm = compress("Give a Summary of what this module does", in_conversation=True)
    assert warm.mode == "full-flat"  # warm too: the answer needs the whole message in this turn


class _Peaked:
    """A drafter-like scorer that puts its relevance on one unit whatever the query (as in test_flat_gate)."""

    name = "peaked"

    def represent(self, tt, units):
        import numpy as np

        from pflash_proxy.compress.scores import UnitReps

        return UnitReps(self.name, len(units), np.array([u.tokens for u in units]), None)

    def score(self, reps, query):
        import numpy as np

        out = np.full(reps.n_units, 1e-3)
        out[3] = 10.0
        return out


def test_every_match_is_kept_whatever_the_serving_scorer_ranks_first():
    """BM25 of the every-clause finds the matches; a serving scorer whose ranking would leave some out still
    serves every one of them (they fit the budget), or the message whole."""
    question = "Where is _remaining_time used?"
    text = SOURCE + "\n" + question + "\n"
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find([{"role": "user", "content": text}], 0, tt)
    out = Compressor(CompressionSettings(threshold=1024), scorer=_Peaked()).compress(
        tt, request, tt.total_tokens, False, "paste", "1")
    assert out.mode == "compressed", out.reason
    lines = [ln for ln in SOURCE.splitlines() if "_remaining_time" in ln]
    assert all(ln in out.text for ln in lines)


@pytest.mark.parametrize("task", [
    "Removing every value stored under a key and getting them back, the default is ignored when the key is "
    "missing. Why?",
    "We need to send every request through a proxy. How do I configure that for the client?",
    "How is a common segment count found for all of them?",
    "Where are the frames of an animation written out?",
    "which responses get retried automatically?",
])
def test_a_users_bug_report_or_how_question_is_not_every_x(task):
    """Users'-words code tasks (dev) that were read as every-X: a statement of what happens is no request, and a
    how/where question or a plural of values is about one definition."""
    assert not asks_for_every(task)


def test_the_agents_narration_asks_nothing():
    """A read's request holds the agent's narration ("... to find where this is handled"): only the user's words
    decide whether it asks for every match."""
    msgs = [{"role": "user", "content": "Why does parsing fail on a trailing comma?"},
            {"role": "assistant", "content": "Let me look at rrule.py to find where this is used.", "tool_calls": [
                {"id": "t", "type": "function", "function": {"name": "Read", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t", "content": SOURCE}]
    spec = RequestFinder().find(msgs, 2)
    # the narration's words alone read as "where is this used" by the form rules
    assert every_intent("let me look at the file to find where this is used.") is not None
    assert spec.user_text == "Why does parsing fail on a trailing comma?"
    tt = TokenizedText.from_text(SOURCE)
    out = Compressor(CompressionSettings(threshold=1024)).compress(tt, spec, tt.total_tokens, True, "tool")
    assert out.mode == "compressed" and out.analysis.gate_scores is None


def test_an_instruction_before_the_question_is_not_what_it_asks():
    """A question after an instruction ("Read the file and answer: which part ...") is read from its question
    word: the quantifiers of the thing it describes are not a request for every match (the code-reads bench's
    described questions were served whole on the merge of the every-X and question-finding work)."""
    q = ("Read echopkg/other.py and answer: Which part of this source does this: gather every entry from the walnut "
         "records and weigh each against the falcon totals?")
    assert every_intent(q) is None
    assert every_intent("Read the file and answer: which functions call retry?") is not None
