"""Compression traces (``sessions.traces``, shown by the inspector): what they hold, their bounds, and that they never fail a request."""

from __future__ import annotations

import json

from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText
from pflash_proxy.sessions import traces as tr
from pflash_proxy.inspector.data import view
from pflash_proxy.sessions.index import SessionRecord, TraceLog

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
    names = (comp.scorer.name, tr.segmenter_name(comp.segmenter))  # the scorer's and the segmenter's
    return tt, request, outcome, names, messages


def test_a_compressed_trace_holds_units_scores_request_span_and_the_original():
    text = _doc()
    tt, request, outcome, names, messages = _compress(text)
    assert outcome.mode == "compressed"
    turn = tr.TurnTraces(1)
    tr.record_compression(turn, 0, messages[0], tt, request, outcome, tt.total_tokens, tt.total_tokens, *names, 123)
    (t,) = turn.items
    assert t["turn"] == 1 and t["message"] == 0 and t["mode"] == "compressed" and t["scorer"] == "lexical"
    assert t["budget"] == outcome.budget_tokens and t["served_tokens"] == 123
    v = view(t)
    assert "\n".join(v["lines"]) == text
    kept = {u["index"] for u in v["units"] if u["kept"]}
    assert kept and len(kept) < len(v["units"]) and set(outcome.recall.omitted).isdisjoint(kept)
    a, b = v["request"]["lines"]
    assert v["lines"][a:b] == ["How many visitors did the apiary records list?"]
    assert v["units"][-1]["pinned"]
    totals = turn.counts
    assert totals["compressed"] == 1 and totals["tokens_in"] == tt.total_tokens and totals["tokens_served"] == 123
    assert json.loads(json.dumps(turn.items)) == turn.items  # plain data: stored as JSON as it is
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
    turn = tr.TurnTraces(1)
    tr.record_compression(turn, 0, {"role": "user"}, tt, request, outcome, tt.total_tokens, tt.total_tokens,
                          comp.scorer.name, tr.segmenter_name(comp.segmenter), tt.total_tokens)
    v = view(turn.items[0])
    assert v["mode"] == "full-flat" and "too flat" in v["reason"] and v["spread"] > 0.11
    assert v["units"] and all(u["kept"] for u in v["units"])  # served whole, with the scores that were flat
    assert v["lines"][slice(*v["request"]["lines"])] == ["List every invoice."]
    assert turn.counts["served_whole"] == 1


def test_traces_are_bounded_in_number_and_text(monkeypatch):
    monkeypatch.setattr(tr, "MAX_TRACES", 3)
    monkeypatch.setattr(tr, "MAX_TEXT_CHARS", 2 * len(_doc()) + 10)
    tt, request, outcome, names, messages = _compress(_doc())
    kept = TraceLog()
    for n in range(1, 6):
        turn = tr.TurnTraces(n)
        tr.record_compression(turn, 0, messages[0], tt, request, outcome, 1, 1, *names, 1)
        kept = tr.append(kept, turn)
    traces = kept.traces
    assert [t["turn"] for t in traces] == [3, 4, 5]  # the newest MAX_TRACES
    assert [t["text"] is not None for t in traces] == [False, True, True]  # the oldest lost its text
    assert view(traces[0])["lines"] is None and view(traces[0])["text_dropped"] and view(traces[0])["units"]
    assert kept.totals["compressed"] == 5  # totals outlive dropped traces


def test_a_sessions_log_follows_what_its_record_kept_before_the_log():
    rec = SessionRecord(id="e" * 32, seed="s", traces=[{"kind": "turn", "turn": 1, "cache_n": 7}],
                        trace_totals={"turns_timed": 1, "cache_n": 7})
    turn = tr.TurnTraces(2)
    turn.add({"kind": "turn", "turn": 2, "cached_tokens": 5}, {"turns_timed": 1, "cached_tokens": 5})
    both = tr.log_of(rec, tr.append(TraceLog(), turn))
    assert [t["turn"] for t in both.traces] == [1, 2]
    assert both.totals == {"turns_timed": 2, "cached_tokens": 12}  # version-1 names renamed, then added
    assert tr.log_of(rec, None).totals == {"turns_timed": 1, "cached_tokens": 7}


def test_recording_never_raises():
    turn = tr.TurnTraces(1)
    tr.record_compression(turn, 0, {}, None, None, None, 0, 0, "", "", 0)  # garbage in: logged, skipped
    tr.record_recall(turn, 0, None)
    assert not turn.items and not turn.counts
