"""When the pinned tail and the question take most of the budget, the message is not silently cut to its two
ends (issue 48): the budget is widened for the top units, or the message served whole, and the outcome says
which (``insufficient_middle_budget``)."""

from __future__ import annotations

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.pipeline import MIDDLE_SHARE, CompressionSettings, middle_budget

from .planted import messages, planted

SETTINGS = CompressionSettings(threshold=1024)


def run(tokens: int):
    case = planted("code", tokens, "middle")
    msgs, idx = messages(case, "after")
    tt = TokenizedText.from_text(str(msgs[idx]["content"]))
    request = RequestFinder(SETTINGS.query_pin).find(msgs, idx, tt)
    return case, Compressor(SETTINGS).compress(tt, request, tt.total_tokens, False, "paste")


def test_middle_budget_widens_only_when_the_pins_leave_too_little():
    assert middle_budget(1000, 400, 4000) == (1000, None)
    wide, note = middle_budget(1000, 700, 4000)
    assert wide == 700 + int(MIDDLE_SHARE * 1000) and note.startswith("insufficient_middle_budget")
    assert "widened to 1200" in note
    whole, note = middle_budget(300, 500, 600)
    assert whole == 600 and "whole" in note


def test_a_short_paste_whose_tail_fills_the_budget_gets_room_for_its_top_units_and_says_so():
    case, out = run(2000)
    a = out.analysis
    pinned = sum(a.units[i].tokens for i in a.pinned)
    nominal = int(0.3 * out.message_tokens)
    assert pinned > nominal - MIDDLE_SHARE * nominal  # the case: the pin leaves the ranked units too little
    assert out.mode == "compressed" and out.budget_note == "insufficient_middle_budget"
    assert out.reason.startswith("insufficient_middle_budget") and out.budget_tokens > nominal
    unpinned_kept = out.kept_tokens - pinned
    assert unpinned_kept > 2 * (nominal - pinned) > 0  # the ranked units got room, not just the two ends
    assert case.fact in out.text


def test_a_budget_widened_to_the_whole_message_serves_it_whole_and_says_so():
    case, out = run(700)
    assert out.mode == "full-budget" and out.reason.startswith("insufficient_middle_budget")
    assert out.text.startswith(case.text[:200])


def test_a_long_paste_is_not_widened():
    _, out = run(8000)
    assert out.mode == "compressed" and out.budget_note is None and out.reason is None
