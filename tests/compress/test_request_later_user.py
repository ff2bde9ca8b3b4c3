"""A long user message followed by a user message of its own: the later one is the request (issue #25)."""

from pflash_proxy.compress import RequestFinder, TokenizedText


def test_a_paste_then_its_question_takes_the_question_unpinned():
    paste = "\n\n".join(f"Section {i}: the archive holds {i * 3} ledgers." for i in range(200))
    messages = [{"role": "user", "content": paste},
                {"role": "user", "content": [{"type": "text", "text": "Which section holds 33 ledgers?"}]}]
    spec = RequestFinder(query_pin=64).find(messages, 0, TokenizedText.from_text(paste))
    assert spec.text == "Which section holds 33 ledgers?"
    assert spec.pinned_tail_tokens == 0  # the paste's own last paragraph is not the question


def test_a_paste_ending_in_its_question_still_pins_its_tail():
    paste = "\n\n".join(f"Section {i}: the archive holds {i * 3} ledgers." for i in range(200))
    text = paste + "\n\nWhich section holds 33 ledgers?"
    spec = RequestFinder(query_pin=64).find([{"role": "user", "content": text}], 0, TokenizedText.from_text(text))
    assert spec.text.rstrip().endswith("Which section holds 33 ledgers?") and spec.pinned_tail_tokens == 64
