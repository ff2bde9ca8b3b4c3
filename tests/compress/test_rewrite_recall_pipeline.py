from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pflash_proxy.compress.budget import DEFAULT_CURVE, BudgetCurve, BudgetSelector, message_budget
from pflash_proxy.compress.pipeline import CompressionSettings, Compressor, Landing, landing_key, middle_budget
from pflash_proxy.compress.recall import RecallGate, format_recall_block
from pflash_proxy.compress.request import RequestFinder, RequestSpec
from pflash_proxy.compress.rewrite import MARKER_RE, Rewriter
from pflash_proxy.compress.scores import LexicalScorer
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import Unit, UnitSegmenter

from .corpus import FLAT_CURVE, NEEDLE, document_with_needle, prose_paragraphs

QUESTION = "What is the vault combination for the Zebulon archive, and who may open it?"


def _check_markers(original: TokenizedText, served: str, expect_note: str) -> int:
    """Rebuild the original from the served text: kept lines verbatim, markers cover their range."""
    out = served.splitlines(keepends=True)
    assert out[0].startswith("[pflash: showing ") and expect_note in out[0]
    pos, markers = 0, 0
    for line in out[1:]:
        m = re.match(MARKER_RE, line.rstrip("\n"))
        if m:
            a, b = int(m.group(1)), int(m.group(2) or m.group(1))
            assert a == pos + 1 and a <= b and (m.group(2) is None) == (a == b)
            pos = b
            markers += 1
        else:
            assert line == original.lines[pos], f"line {pos + 1} not verbatim"
            pos += 1
    assert pos == len(original.lines)
    return markers


def test_rewrite_markers_and_note_exact():
    tt = TokenizedText.from_text(document_with_needle())
    units = UnitSegmenter().segment(tt)
    kept = [0, 3, 4, len(units) - 1]
    rw = Rewriter().rewrite(tt, units, kept, "tool", "4")
    markers = _check_markers(tt, rw.text, "of this tool output (message 4)")
    assert markers == len(rw.omitted) == 2
    assert "call the tool again for that range" in rw.text.splitlines()[0]
    assert rw.shown_lines == sum(units[i].n_lines for i in kept)
    assert f"showing {rw.shown_lines:,} of {rw.total_lines:,} lines" in rw.text
    paste = Rewriter().rewrite(tt, units, kept, "paste")
    assert "ask about it and it will be brought back" in paste.text.splitlines()[0]


_RUNS = [(0, 1), (8, 45), (998, 2120), (99_999, 100_000), (5, 123_456), (1199, 1211), (40, 41)]


def test_marker_token_estimate_counts_words_and_one_token_per_digit():
    from pflash_proxy.compress.rewrite import OmittedRange, marker_line, marker_tokens
    from pflash_proxy.compress.text import approx_tokens
    runs = [OmittedRange(a, b, (i,)) for i, (a, b) in enumerate(_RUNS)]
    words = [approx_tokens(re.sub(r"\d", "", marker_line(r))) + 2 for r in runs]  # + 2: the newline, a space
    digits = [len(re.sub(r"\D", "", marker_line(r))) for r in runs]
    assert marker_tokens(runs) == sum(words) + sum(digits)


def test_markers_are_short_in_a_real_tokenizer_and_never_underestimated(gemma_model):
    """Gemma (as Qwen) gives each digit a token: a marker is counted at most 2 tokens over, never under, and one
    for a range of 4-digit lines costs at most 17 tokens (the ``N lines omitted: lines A–B`` form cost 22)."""
    from llama_cpp import Llama

    from pflash_proxy.compress.rewrite import OmittedRange, marker_line, marker_tokens

    vocab = Llama(model_path=str(gemma_model), vocab_only=True, verbose=False)
    for i, (a, b) in enumerate(_RUNS):
        r = OmittedRange(a, b, (i,))
        real = len(vocab.tokenize((marker_line(r) + "\n").encode(), add_bos=False, special=False))
        assert real <= marker_tokens([r]) <= real + 2, marker_line(r)
    assert len(vocab.tokenize(b"[\xe2\x80\xa6 lines 1200\xe2\x80\x931211 omitted \xe2\x80\xa6]\n", add_bos=False,
                              special=False)) <= 17
    assert marker_line(OmittedRange(1199, 1211, (0,))) == "[… lines 1200–1211 omitted …]"
    assert marker_line(OmittedRange(6, 7, (0,))) == "[… line 7 omitted …]"


def test_single_line_marker_and_no_trailing_newline():
    text = "\n\n".join(prose_paragraphs(4)) + "\n\nlast line"
    tt = TokenizedText.from_text(text)
    units = UnitSegmenter(min_segment=1).segment(tt)
    rw = Rewriter().rewrite(tt, units, list(range(len(units) - 1)), "prompt")
    assert rw.text.endswith(f"[… line {len(tt.lines)} omitted …]")


def _compress(tt, request, in_conversation=False, prompt_extra=200, **kw):
    settings = CompressionSettings(**kw)
    return Compressor(settings).compress(tt, request, tt.total_tokens + prompt_extra, in_conversation, "paste", "1")


def _units_of(tokens):
    return [Unit(i, i, i + 1, t, "prose") for i, t in enumerate(tokens)]


def test_pipeline_needle_document_budget_and_needle_kept():
    text = document_with_needle(n_paragraphs=40) + "\n" + QUESTION + "\n"
    tt = TokenizedText.from_text(text)
    assert 2500 < tt.total_tokens < 4500
    req = RequestFinder().find([{"role": "user", "content": text}], 0, tt)
    out = _compress(tt, req, curve=FLAT_CURVE)  # 0.3 of a 3.5K paste: its 512-token tail takes most of it
    assert out.mode == "compressed", out.reason
    curve = BudgetCurve.parse(FLAT_CURVE)
    nominal = message_budget(curve, out.prompt_tokens, tt.total_tokens, 256)
    pinned = sum(out.analysis.units[i].tokens for i in out.analysis.pinned)
    budget, note = middle_budget(nominal, pinned, tt.total_tokens)  # a 3.5K paste: its 512-token tail widens it
    assert out.budget_tokens == budget > nominal and out.budget_note == "insufficient_middle_budget"
    assert 0.9 * budget <= out.served_message_tokens <= budget  # a ceiling: ~50-token units land below it
    assert out.kept_tokens < tt.total_tokens * 0.5
    assert NEEDLE in out.text and QUESTION in out.text
    _check_markers(tt, out.text, "of this message (message 1)")
    assert set(out.stage_ms) >= {"segment", "represent", "score", "select", "rewrite"}
    assert out.recall is not None and out.recall.omitted
    # the default curve gives a paste this small about half of itself: the tail leaves the ranked units enough
    out = _compress(tt, req)
    nominal = message_budget(BudgetCurve.parse(DEFAULT_CURVE), out.prompt_tokens, tt.total_tokens, 256)
    assert out.budget_tokens == nominal > 0.45 * tt.total_tokens and out.budget_note is None
    assert NEEDLE in out.text and QUESTION in out.text


@pytest.mark.parametrize("ratio", ["0.10", "0.12", "0.15", "0.2", "0.3"])
def test_budget_is_a_ceiling_note_and_markers_included(ratio):
    """The served message (kept units, note and markers) never passes the budget when the always-kept units
    leave room: the selection is rerun until it lands at most on it, within a unit of it."""
    tt = TokenizedText.from_text(document_with_needle())
    out = _compress(tt, RequestSpec("sourdough starter yeast acidity", 0, "latest-user"), in_conversation=True,
                    prompt_extra=0, curve=f"1000:{ratio}")
    assert out.mode == "compressed"
    assert out.budget_tokens - 80 <= out.served_message_tokens <= out.budget_tokens


def test_selector_never_passes_the_budget_to_fill_it():
    units = _units_of([100, 100, 100, 51])
    assert BudgetSelector().select(units, np.array([4.0, 3.0, 2.0, 1.0]), 350) == [0, 1, 2]


def test_landing_re_runs_until_at_most_the_budget():
    out = object()
    land = Landing(1000, (out, 1010))  # 1 % over: not landed
    assert land.next_adjust() == 10
    land.offer("lower", 995)
    assert land.best == ("lower", 995) and land.next_adjust() is None
    land = Landing(1000, (out, 900))  # 10 % under: raise the budget
    assert land.next_adjust() == -100
    land.offer("over", 1004)  # over is worse than any landing at most the budget
    assert land.best == (out, 900)
    assert landing_key(1000, 1000) < landing_key(990, 1000) < landing_key(1001, 1000)


class CountingScorer(LexicalScorer):
    """The lexical scorer, counting its calls (a drafter scorer's represent is a whole drafter pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = {"represent": 0, "score": 0}

    def represent(self, tt, units):
        self.calls["represent"] += 1
        return super().represent(tt, units)

    def score(self, reps, query):
        self.calls["score"] += 1
        return super().score(reps, query)


def test_budget_rerun_reuses_the_analysis():
    text = document_with_needle(n_paragraphs=40) + "\n" + QUESTION + "\n"
    tt = TokenizedText.from_text(text)
    req = RequestFinder().find([{"role": "user", "content": text}], 0, tt)
    scorer = CountingScorer()
    comp = Compressor(CompressionSettings(), scorer=scorer)
    first = comp.compress(tt, req, tt.total_tokens + 200, False, "paste", "1")
    assert first.mode == "compressed" and first.analysis is not None
    assert scorer.calls == {"represent": 1, "score": 1}
    again = comp.compress(tt, req, tt.total_tokens + 200, False, "paste", "1", budget_adjust=80,
                          analysis=first.analysis)
    assert scorer.calls == {"represent": 1, "score": 1}  # no second read of the message
    fresh = comp.compress(tt, req, tt.total_tokens + 200, False, "paste", "1", budget_adjust=80)
    assert again.text == fresh.text and again.kept_tokens < first.kept_tokens
    assert again.stage_ms["represent"] == first.stage_ms["represent"]  # the cost paid once is still reported


def test_pinned_tail_always_kept():
    text = document_with_needle() + "\nUnrelated closing remark about teapots and porcelain glazes.\n"
    tt = TokenizedText.from_text(text)
    out = _compress(tt, RequestSpec(QUESTION, 64, "message-tail"))
    assert out.mode == "compressed"
    assert out.text.endswith("Unrelated closing remark about teapots and porcelain glazes.\n")
    unpinned = _compress(tt, RequestSpec(QUESTION, 0, "latest-user"))
    assert not unpinned.text.endswith("porcelain glazes.\n")


def test_kept_code_units_are_whole_functions():
    tt = TokenizedText.from_text(document_with_needle())
    out = _compress(tt, RequestSpec("dedent common leading whitespace margin", 0, "latest-user"))
    assert out.mode == "compressed"
    import inspect
    import textwrap
    src = inspect.getsource(textwrap.dedent)
    assert src.rstrip("\n") in out.text  # the whole function, not a piece


def _flat_records(n=300):
    return "\n".join(json.dumps({"id": i, "from": f"user{i}@example.com", "subject": f"Invoice {i} for project X",
                                 "body": f"Please find the invoice number {i} attached."}) for i in range(n)) + "\n"


def test_flat_relevance_cold_full_flat_and_conversation_compressed():
    tt = TokenizedText.from_text(_flat_records())
    req = RequestSpec("List every message that mentions an invoice", 0, "latest-user")
    cold = _compress(tt, req, in_conversation=False)
    assert cold.mode == "full-flat" and cold.text == tt.text and "spread" in cold.reason
    warm = _compress(tt, req, in_conversation=True)  # a list-every request needs every match now (issue 48)
    assert warm.mode == "full-flat" and warm.text == tt.text
    # a flat ranking for a pointed request inside a running conversation is compressed: recall brings lines back
    zero = _compress(tt, RequestSpec("sourdough starter yeast acidity", 0, "latest-user"), in_conversation=True)
    assert zero.mode == "compressed" and zero.text != tt.text and zero.kept_tokens < tt.total_tokens


class _Garbage:
    name = "garbage"

    def __init__(self, kind):
        self.kind = kind

    def represent(self, tt, units):
        if self.kind == "raise-represent":
            raise RuntimeError("drafter died")
        return LexicalScorer().represent(tt, units)

    def score(self, reps, query):
        if self.kind == "nan":
            return np.full(reps.n_units, np.nan)
        if self.kind == "short":
            return np.ones(reps.n_units - 1)
        if self.kind == "negative":
            return -np.ones(reps.n_units)
        raise ValueError("head exploded")


@pytest.mark.parametrize("kind", ["nan", "short", "negative", "raise", "raise-represent"])
def test_garbage_scorer_full_error(kind):
    tt = TokenizedText.from_text(document_with_needle())
    out = Compressor(CompressionSettings(), scorer=_Garbage(kind)).compress(
        tt, RequestSpec(QUESTION, 0, "latest-user"), tt.total_tokens, False, "tool", "2")
    assert out.mode == "full-error" and out.text == tt.text and out.reason


def test_cannot_segment_full_error():
    tt = TokenizedText.from_text("word " * 20 + "\n")  # one unit (a long line is cut: ``test_longlines``)
    out = Compressor().compress(tt, RequestSpec("word", 0, "latest-user"), tt.total_tokens, False, "paste")
    assert out.mode == "full-error" and "CannotSegment" in out.reason and out.text == tt.text


def test_recall_gate_above_and_below_theta():
    text = document_with_needle()
    tt = TokenizedText.from_text(text)
    out = _compress(tt, RequestSpec("sourdough starter yeast acidity", 0, "latest-user"), in_conversation=True,
                    prompt_extra=0, curve="1000:0.13")  # every sourdough unit fits, the needle is no filler
    assert out.mode == "compressed" and NEEDLE not in out.text
    gate = RecallGate(theta=0.075, recall_budget=2048)
    scorer = LexicalScorer()
    hit = gate.decide([out.recall], "What was the vault combination of the Zebulon archive?", scorer)
    assert hit.share >= 0.075 and hit.recalled
    assert any(NEEDLE in e.text for e in hit.recalled)
    assert sum(e.tokens for e in hit.recalled) <= 2048
    block = format_recall_block(hit.recalled)
    first = hit.recalled[0]
    assert block.startswith(f"[pflash recall: from earlier message 1, lines {first.start_line + 1}–")
    assert "".join(tt.lines[first.start_line:first.end_line]) in block
    miss = gate.decide([out.recall], "Why does a sourdough starter need feeding?", scorer)
    assert miss.share < 0.075 and not miss.recalled and format_recall_block(miss.recalled) == ""
