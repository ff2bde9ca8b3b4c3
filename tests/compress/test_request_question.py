"""The request is what the user asked (issue 48): the question found by its form, in a paste followed by its
question, a question followed by its paste, and a task with a tool result now, in the three dialects' shapes."""

from __future__ import annotations

import inspect
import json
import textwrap

import pytest

from pflash_proxy.compress import RequestFinder, TokenizedText
from pflash_proxy.compress.request import asks, prose_line, question_span, question_text

CODE = inspect.getsource(textwrap)  # a real paste: the stdlib's textwrap module (~5K tokens)
QUESTION = "Why does the wrapper drop my trailing spaces when I wrap a paragraph?"
REMINDER = "<system-reminder>\nToday's date is 2026-12-06. The user opened the file textwrap.py.\n</system-reminder>\n"


def find(messages, idx):
    text = messages[idx]["content"] if isinstance(messages[idx]["content"], str) else None
    return RequestFinder().find(messages, idx, TokenizedText.from_text(text) if text is not None else None)


def test_a_paste_then_its_question_is_the_question_alone_and_the_tail_stays_pinned():
    spec = find([{"role": "user", "content": CODE + "\n" + QUESTION + "\n"}], 0)
    assert spec.source == "question" and spec.text == QUESTION + "\n"
    assert spec.pinned_tail_tokens == 512
    n = len(TokenizedText.from_text(CODE).lines)
    assert spec.kept_lines == (n + 1, n + 2)


def test_a_question_then_its_paste():
    spec = find([{"role": "user", "content": QUESTION + "\n\n" + CODE}], 0)
    assert spec.source == "question" and spec.text == QUESTION + "\n" and spec.kept_lines == (0, 1)


def test_a_question_of_several_sentences_and_an_instruction_after_the_paste():
    ask = "I wrap a paragraph with the default settings.\nThe trailing spaces are gone afterwards.\n\n" \
          "Explain which option controls that, and why it is on by default.\n"
    spec = find([{"role": "user", "content": "```python\n" + CODE + "```\n\n" + ask}], 0)
    assert spec.source == "question" and spec.text == ask


def test_the_clients_reminder_after_the_question_is_not_the_question():
    spec = find([{"role": "user", "content": CODE + "\n" + QUESTION + "\n\n" + REMINDER}], 0)
    assert spec.source == "question" and spec.text.strip() == QUESTION


def test_a_document_with_no_question_keeps_the_old_tail():
    doc = "\n\n".join(f"Paragraph {i}: the ledger of the harbour master lists {i} ships at anchor." for i in range(300))
    spec = find([{"role": "user", "content": doc}], 0)
    assert spec.source == "message-tail" and spec.kept_lines is None


def test_a_prose_document_then_its_question_in_the_last_paragraph():
    doc = "\n\n".join(f"Paragraph {i}: the ledger of the harbour master lists {i} ships at anchor." for i in range(300))
    text = doc + "\nWhich paragraph lists\nforty ships at anchor?\n"
    spec = find([{"role": "user", "content": text}], 0)
    assert spec.source == "question" and spec.text == "Which paragraph lists\nforty ships at anchor?\n"


def test_a_tool_result_now_and_a_long_task_in_an_earlier_user_turn_takes_its_question():
    messages = [{"role": "user", "content": CODE + "\n" + QUESTION + "\n"},
                {"role": "assistant", "content": "Let me read the tests.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "Read",
                                                                  "arguments": '{"file_path": "/src/test_tw.py"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": CODE}]
    spec = find(messages, 2)
    assert spec.source == "tool-call" and QUESTION in spec.text
    assert "def dedent" not in spec.text and len(spec.text) < 400  # the paste of the earlier turn is not the query


DIALECT_BODIES = {
    "anthropic": lambda: {"model": "m", "max_tokens": 64, "messages": [
        {"role": "user", "content": "Find out why textwrap drops trailing spaces."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                           "input": {"file_path": "/usr/lib/python3/textwrap.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": CODE},
                                     {"type": "text", "text": "Also: does dedent touch blank lines?"}]}]},
    "responses": lambda: {"model": "m", "input": [
        {"role": "user", "content": "Find out why textwrap drops trailing spaces."},
        {"type": "function_call", "call_id": "t1", "name": "Read",
         "arguments": json.dumps({"file_path": "/usr/lib/python3/textwrap.py"})},
        {"type": "function_call_output", "call_id": "t1", "output": CODE},
        {"role": "user", "content": "Also: does dedent touch blank lines?"}]},
    "chat": lambda: {"model": "m", "messages": [
        {"role": "user", "content": "Find out why textwrap drops trailing spaces."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function", "function": {
                "name": "Read", "arguments": json.dumps({"file_path": "/usr/lib/python3/textwrap.py"})}}]},
        {"role": "tool", "tool_call_id": "t1", "content": CODE},
        {"role": "user", "content": "Also: does dedent touch blank lines?"}]},
}


@pytest.mark.parametrize("dialect", sorted(DIALECT_BODIES))
def test_a_tool_result_in_each_dialect_takes_the_task_and_the_users_words_sent_with_it(dialect):
    from pflash_proxy.dialects.anthropic import AnthropicDialect
    from pflash_proxy.dialects.chat import ChatDialect
    from pflash_proxy.dialects.responses import ResponsesDialect

    cls = {"anthropic": AnthropicDialect, "responses": ResponsesDialect, "chat": ChatDialect}[dialect]
    messages = cls().parse(DIALECT_BODIES[dialect]()).messages
    idx = next(i for i, m in enumerate(messages) if m.get("role") == "tool")
    spec = RequestFinder().find(messages, idx)
    assert spec.source == "tool-call"
    assert "drops trailing spaces" in spec.text and "does dedent touch blank lines?" in spec.text
    assert "def dedent" not in spec.text


def test_the_form_of_a_question():
    assert prose_line("Why does the wrapper drop my trailing spaces?\n")
    assert prose_line("What does array_split do with an uneven split?\n")  # an identifier in a question
    assert not prose_line("    return self._loop.run_until_complete(future)\n")
    assert not prose_line("# The launch code for the orbital relay is 7C-ALPHA-93.\n")  # a comment in the code
    assert not prose_line("  12\tdef wrap(text, width=70, **kwargs):\n")  # a numbered file line
    assert not prose_line("class TextWrapper:\n") and not prose_line('"""Text wrapping and filling."""\n')
    assert asks("Explain the cache.") and asks("the key?") and not asks("The cache is warm.")
    lines = ["x = 1\n"] * 50 + ["\n", "What is x?\n"]
    assert question_span(lines, [3] * len(lines), 512) == (51, 52)
    assert question_text("short question") == "short question"


def test_records_before_the_question_are_the_paste_not_the_question():
    records = "".join(f"REC-{i:05d} | 2026-01-{i % 28 + 1:02d} | team: growth | product: Nimbolt | note: The {i}th "
                      f"delivery of the quarter arrived late again at the depot.\n" for i in range(400))
    spec = find([{"role": "user", "content": records + "\nWhich team filed REC-00042, and what does its note say?"}], 0)
    assert spec.source == "question" and spec.text == "Which team filed REC-00042, and what does its note say?"
    assert not prose_line("REC-00042 | 2026-01-15 | team: growth | note: late\n")
    assert not prose_line("name: retry  kind: function  calls: 12\n")


def test_a_wrapped_documents_line_that_begins_with_a_question_word_is_not_the_question():
    """bench quality's RULER multi-query case: the document's last paragraph has a wrapped line beginning "when";
    only the question is the query (at the previous commit the paragraph joined it, and two of four keys were
    lost)."""
    doc = "\n\n".join(f"Paragraph {i}: the buffer is flushed to the file when it exceeds a certain size or\n"
                      f"when a fileno is needed, and the writer {i} waits." for i in range(300))
    q = "What are all the special magic numbers for amber-orchard and crimson-beacon mentioned in the text?"
    spec = find([{"role": "user", "content": doc + "\n\n" + q}], 0)
    assert spec.source == "question" and spec.text == q
    assert not asks("the buffer is flushed when it is full or\nwhen a fileno is needed.")


def test_a_question_with_symbols_and_a_second_sentence_is_prose():
    line = "Which function returns the number of loops and time taken so that total time >= 0.2? Give its name."
    assert prose_line(line + "\n")
    assert not prose_line("    x = cond ? a : b;\n") and not prose_line('const y = isOk ? "yes" : "no";\n')
    spec = find([{"role": "user", "content": "```python\n" + CODE + "```\n\n" + line}], 0)
    assert spec.source == "question" and spec.text == line


def test_rulers_template_the_question_without_the_last_document():
    """RULER's QA template: documents as "Document N:" and one long line each, then its instruction and the
    question. The instruction joins the question; the last document does not (at the previous commit a
    document's two lines asking something joined it, diluting the query; bench ruler-qa's dev split lost a
    SQuAD case)."""
    doc = ("Jacksonville's plan brought infrastructure improvements, environmental preservation, targeted economic "
           "development and new or improved public facilities. What would the city do next? Nobody knew. " * 3)
    docs = "\n\n".join(f"Document {i}:\n{doc}" for i in range(1, 60))
    instruction = "Answer the question based on the given documents. Only give me the answer and do not output " \
                  "any other words."
    text = (f"{instruction}\n\nThe following are given documents.\n\n{docs}\n\n{instruction}\n\n"
            "Question: The Bank of America Tower was previously known as what? Answer:")
    spec = find([{"role": "user", "content": text}], 0)
    assert spec.source == "question"
    assert spec.text == f"{instruction}\n\nQuestion: The Bank of America Tower was previously known as what? Answer:"


@pytest.mark.parametrize("ask", ["Every call site of the wrapper's fill helper, please.",
                                 "All the places that shorten a line, please!",
                                 "Every place that drops whitespace"])
def test_a_request_without_a_question_mark_or_a_verb_first_is_the_question(ask):
    # a noun phrase of what is wanted, or one that ends in "please": before, no question by form, and the
    # query was the message's tail, the pasted code's last 512 tokens
    spec = find([{"role": "user", "content": CODE + "\n" + ask + "\n"}], 0)
    assert spec.source == "question" and spec.text == ask + "\n"


def test_a_statement_that_opens_with_all_or_every_asks_nothing():
    assert not asks("All tests pass.") and not asks("Every worker restarts on failure.")
    assert not asks("All rights reserved.") and not asks("Each request is retried three times.")
    assert not asks("For more information, please contact support.")
