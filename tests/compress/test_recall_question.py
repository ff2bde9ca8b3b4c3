"""Recall in users' words (issue 48): a follow-up about another part of the same document brings that part back
through recall, driven by the same signal as compression: the question, not the client's reminders around it."""

from __future__ import annotations

from pflash_proxy.compress import Compressor, RecallGate, RequestFinder, TokenizedText
from pflash_proxy.compress.recall import FEEDBACK_ADDS
from pflash_proxy.compress.pipeline import CompressionSettings
from pflash_proxy.compress.request import follow_up_query
from pflash_proxy.compress.lexicon import stem
from pflash_proxy.compress.scores import LexicalScorer, terms

from .planted import FACTS, planted

REMINDER = ("<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
            "# important-instruction-reminders\nDo what has been asked; nothing more, nothing less.\n"
            "NEVER create files unless they're absolutely necessary for achieving your goal. ALWAYS prefer editing "
            "an existing file to creating a new one. The value of the expression and the name of the object are "
            "in the current scope.\n</system-reminder>\n")


def first_turn():
    case = planted("prose", 12000, "start", 0)
    at = case.text.index("\n\n", len(case.text) // 2)  # a second fact, asked in the follow-up, half way
    text = case.text[:at] + f"\n\n{FACTS[1][0]}" + case.text[at:]
    text = text + "\n" + case.question + "\n"
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find([{"role": "user", "content": text}], 0, tt)
    out = Compressor(CompressionSettings(threshold=1024)).compress(tt, request, tt.total_tokens, False, "paste", "1")
    assert out.mode == "compressed" and case.fact in out.text and FACTS[1][0] not in out.text
    return out


def test_follow_up_query_is_the_question_without_the_reminder():
    msg = {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": FACTS[1][1]}]}
    assert follow_up_query(msg) == FACTS[1][1]


def test_a_follow_up_with_a_reminder_recalls_its_part_and_only_what_the_question_asks():
    out = first_turn()
    msg = {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": FACTS[1][1]}]}
    words = {stem(w) for w in terms(FACTS[1][1])}  # a question's word matches its other forms in prose ("keys")
    for gate in (RecallGate(feedback=False), RecallGate()):
        decision = gate.decide([out.recall], follow_up_query(msg), LexicalScorer())
        assert decision.recall and any(FACTS[1][0] in e.text for e in decision.recalled)
        # nothing pulled in by the reminder's words; with feedback, at most FEEDBACK_ADDS units by the names of the
        # best ones (the second hop)
        unasked = [u for e in decision.recalled for u in e.unit_indices
                   if not words & {stem(w) for w in terms(out.recall.omitted_texts[u])}]
        assert len(unasked) <= (FEEDBACK_ADDS if gate.feedback else 0)
