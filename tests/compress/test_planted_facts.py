"""A planted literal fact asked word for word is kept (issue 48, "The request is what the user asked"): the
scorer's query is the question found by its form, not the message's last 512 tokens, at every size, in code and
prose, at the start, middle and end, whether the question follows the paste, precedes it or comes on its own.
The full grid, 4K-64K, through the proxy: ``pflash-proxy bench planted``."""

from __future__ import annotations

import pytest

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.pipeline import CompressionSettings

from .planted import messages, planted

SETTINGS = CompressionSettings(threshold=1024)


def served(kind, tokens, where, ask, fact=0):
    case = planted(kind, tokens, where, fact)
    msgs, idx = messages(case, ask)
    text = msgs[idx]["content"]
    tt = TokenizedText.from_text(text)
    request = RequestFinder(SETTINGS.query_pin).find(msgs, idx, tt)
    out = Compressor(SETTINGS).compress(tt, request, tt.total_tokens, False, "paste")
    return case, request, out


def test_the_issue_case_asyncio_paste_then_its_question():
    """The issue's reproduction: ~3.7K tokens of asyncio's first modules, the launch code planted before a
    function, the question at the end: the question is the query (not the code before it) and the fact is kept."""
    case, request, out = served("code", 3700, "middle", "after")
    assert request.source == "question" and request.text.strip() == case.question
    assert request.pinned_tail_tokens == SETTINGS.query_pin  # the tail stays pinned for recency
    assert out.mode == "compressed" and out.kept_tokens < 0.6 * out.message_tokens
    assert case.fact in out.text


@pytest.mark.parametrize("ask", ["after", "before"])
@pytest.mark.parametrize("tokens", [4096, 8192, 16384])
@pytest.mark.parametrize("kind", ["code", "prose"])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_planted_fact_is_kept(kind, tokens, where, ask):
    """Small sizes of the grid (at 19528cf: code, question after, 16K: 1 of 6 at the start and middle; question
    before: 10 of 36 at 4K-16K)."""
    for fact in range(3):
        case, request, out = served(kind, tokens, where, ask, fact)
        assert out.mode == "compressed", out.reason
        assert case.fact in out.text, (kind, tokens, where, fact, request.text)


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_question_before_the_paste_is_the_query_and_is_kept(kind):
    case, request, out = served(kind, 6000, "end", "before")
    assert request.source == "question" and request.text.strip() == case.question
    assert request.kept_lines == (0, 1)
    assert out.mode == "compressed" and case.fact in out.text
    assert out.text.count(case.question) == 1  # the question itself reaches the model


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_question_in_its_own_message(kind):
    case, request, out = served(kind, 6000, "start", "message")
    assert request.source == "latest-user" and request.text == case.question
    assert out.mode == "compressed" and case.fact in out.text


@pytest.mark.parametrize("ask", ["after", "before"])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_hard_wrapped_prose_without_paragraph_breaks(where, ask):
    """RULER's essays are hard-wrapped with no blank line between paragraphs, and a line of a code example or a
    rhetorical question may sit near the end: the question is still the user's (at the previous commit the
    essay's last lines were taken for it whenever one of them began with "is" or "how", and 10 of 30 prose
    facts of `bench planted`'s dev split were lost)."""
    case = planted("prose", 6000, where, 1)
    lines = [line for line in case.text.split("\n") if line.strip()]
    lines += ["    x = f(a, b)  # the example", "The example ends here, as essays often do, with a few more words.",
              "Is a program, like a proof, a pruned tree that in the", "past had false starts branching off all over",
              "it, and so the test of a language is how clean the path", "to the finished program was, not the result."]
    body = "\n".join(lines) + "\n"
    text = body + "\n" + case.question + "\n" if ask == "after" else case.question + "\n\n" + body
    tt = TokenizedText.from_text(text)
    request = RequestFinder(SETTINGS.query_pin).find([{"role": "user", "content": text}], 0, tt)
    assert request.source == "question" and request.text.strip() == case.question
    out = Compressor(SETTINGS).compress(tt, request, tt.total_tokens, False, "paste")
    assert case.fact in out.text
