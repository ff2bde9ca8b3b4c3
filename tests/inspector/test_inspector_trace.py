"""Compression traces (``inspector.trace``): what they hold, their bounds, and that they never fail a request."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText
from pflash_proxy.inspector import trace as tr
from pflash_proxy.inspector.data import view
from pflash_proxy.sessions.store import SessionRecord

TOPICS = ["glacier", "violin", "harbour", "orchard", "telescope", "bakery", "railway", "lighthouse", "vineyard",
          "monastery", "observatory", "foundry", "tannery", "apiary", "quarry", "shipyard"]


def _doc() -> str:
    paras = [f"Section {i}: the {t} of Vellmoor keeps {t} records of {i * 7} visitors, all about the {t}."
             for i, t in enumerate(TOPICS * 3)]
    return "\n\n".join(paras) + "\n\nHow many visitors did the apiary records list?"


def _compress(text: str):
    settings = CompressionSettings(threshold=100, curve="100:0.3", query_pin=16, min_segment=8, max_segment=128)
    comp = Compressor(settings)
    tt = TokenizedText.from_text(text)
    messages = [{"role": "user", "content": text}]
    request = RequestFinder(query_pin=16).find(messages, 0, tt)
    outcome = comp.compress(tt, request, tt.total_tokens, True, "paste", "1")
    stage = SimpleNamespace(scorer=comp.scorer, compressor=comp)
    return tt, request, outcome, stage, messages


def test_a_compressed_trace_holds_units_scores_request_span_and_the_original():
    text = _doc()
    tt, request, outcome, stage, messages = _compress(text)
    assert outcome.mode == "compressed"
    rec = SessionRecord(id="a" * 32, seed="s")
    tr.record_compression(rec, 0, messages[0], tt, request, outcome, tt.total_tokens, tt.total_tokens, stage, 123)
    (t,) = rec.traces
    assert t["turn"] == 1 and t["message"] == 0 and t["mode"] == "compressed" and t["scorer"] == "lexical"
    assert t["budget"] == outcome.budget_tokens and t["served_tokens"] == 123
    v = view(t)
    assert "\n".join(v["lines"]) == text
    kept = {u["index"] for u in v["units"] if u["kept"]}
    assert kept and len(kept) < len(v["units"]) and set(outcome.recall.omitted).isdisjoint(kept)
    a, b = v["request"]["lines"]
    assert v["lines"][a:b] == ["How many visitors did the apiary records list?"]
    assert v["units"][-1]["pinned"]
    totals = rec.trace_totals
    assert totals["compressed"] == 1 and totals["tokens_in"] == tt.total_tokens and totals["tokens_served"] == 123
    pickle.loads(pickle.dumps(rec))  # plain data: the record still pickles (diskcache)
    assert all(type(x).__module__ == "builtins" for x in (t["units"]["score"][0], t["units"]["start"][0]))


def test_a_flat_message_served_whole_keeps_its_scores_and_reason():
    records = "\n".join(f"invoice {i}: customer {i % 17} paid the invoice amount of {i * 3} euros" for i in range(120))
    text = records + "\n\nList every invoice."
    settings = CompressionSettings(threshold=100, curve="100:0.3", query_pin=32, min_segment=8, max_segment=128)
    comp = Compressor(settings)
    tt = TokenizedText.from_text(text)
    request = RequestFinder(query_pin=32).find([{"role": "user", "content": text}], 0, tt)
    outcome = comp.compress(tt, request, tt.total_tokens, False, "paste", "1")
    assert outcome.mode == "full-flat"
    rec = SessionRecord(id="b" * 32, seed="s")
    stage = SimpleNamespace(scorer=comp.scorer, compressor=comp)
    tr.record_compression(rec, 0, {"role": "user"}, tt, request, outcome, tt.total_tokens, tt.total_tokens, stage,
                          tt.total_tokens)
    v = view(rec.traces[0])
    assert v["mode"] == "full-flat" and "too flat" in v["reason"] and v["spread"] > 0.11
    assert v["units"] and all(u["kept"] for u in v["units"])  # served whole, with the scores that were flat
    assert v["lines"][slice(*v["request"]["lines"])] == ["List every invoice."]
    assert rec.trace_totals["served_whole"] == 1


def test_traces_are_bounded_in_number_and_text(monkeypatch):
    monkeypatch.setattr(tr, "MAX_TRACES", 3)
    monkeypatch.setattr(tr, "MAX_TEXT_CHARS", 2 * len(_doc()) + 10)
    tt, request, outcome, stage, messages = _compress(_doc())
    rec = SessionRecord(id="c" * 32, seed="s")
    for turn in range(5):
        rec.turns = turn
        tr.record_compression(rec, 0, messages[0], tt, request, outcome, 1, 1, stage, 1)
    traces = rec.traces
    assert [t["turn"] for t in traces] == [3, 4, 5]  # the newest MAX_TRACES
    assert [t["text"] is not None for t in traces] == [False, True, True]  # the oldest lost its text
    assert view(traces[0])["lines"] is None and view(traces[0])["text_dropped"] and view(traces[0])["units"]
    assert rec.trace_totals["compressed"] == 5  # totals outlive dropped traces


def test_recording_never_raises():
    rec = SessionRecord(id="d" * 32, seed="s")
    tr.record_compression(rec, 0, {}, None, None, None, 0, 0, None, 0)  # garbage in: logged, skipped
    tr.record_recall(rec, 0, None)
    assert not rec.traces
