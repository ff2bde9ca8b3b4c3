"""The JSON of each kind of inspector trace, pinned: keys, their order and the types of their values, as the
writers build them (``sessions.traces``, ``stages.savings``), as the trace log stores and gives them back, and as the
inspector serves them (``inspector.data.view``, the session page's turns). The typed records
(``sessions.trace_records``) must leave all of it as it was: the index, the API and the page's JS read it."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator

import pytest

from pflash_proxy.compress import Excerpt, RecallDecision
from pflash_proxy.contract import Pipeline, ProxyRequest, Stage
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.cli.show import print_session
from pflash_proxy.inspector.data import InspectorData, InspectorViews, view
from pflash_proxy.sessions import traces as tr
from pflash_proxy.sessions.service import SessionService
from pflash_proxy.stages.savings import SavingsStage, price
from pflash_proxy.stages.sessions import SessionCommitStage, SessionStage
from tests.conftest import make_settings
from tests.inspector.test_inspector_trace import _compress, _doc
from tests.sessions.test_fake_engine_pipeline import DOC_A, Proxy, chat


def shape(x: object) -> object:
    """A JSON value's shape: an object as its (key, shape) pairs in order, a list as the set of its items' shapes,
    a scalar as its type's name."""
    if isinstance(x, dict):
        return [(k, shape(v)) for k, v in x.items()]
    if isinstance(x, list):
        shapes: list[object] = []
        for v in x:
            if (s := shape(v)) not in shapes:
                shapes.append(s)
        return ["list", *shapes]
    return type(x).__name__


TEXT = _doc()


def _traces(turn: tr.TurnTraces) -> None:
    """One trace of each kind the stages record, through their recorders, into ``turn``."""
    tt, request, outcome, names, messages = _compress(TEXT)
    assert outcome.mode == "compressed"
    tr.record_compression(turn, 0, messages[0], tt, request, outcome, tt.total_tokens, tt.total_tokens, *names, 123)
    excerpt = Excerpt(label="1", start_line=2, end_line=4, text="a\nb\n", tokens=5, unit_indices=(1, 2))
    tr.record_recall(turn, 0, RecallDecision(recalled=[excerpt], share=0.25))
    tr.record_cache(turn, 0, "hit", "miss", 100, 12, "moved")


class _Recorder(Stage):
    """Records one trace of each kind in the turn's traces, as the compression and session stages do."""

    name = "recorder"

    async def on_request(self, req: ProxyRequest) -> None:
        assert req.notes.session is not None
        _traces(req.notes.session.traces)


@pytest.fixture
async def proxy(tmp_path) -> AsyncIterator[tuple[Proxy, SavingsStage]]:
    slots = tmp_path / "slots"
    slots.mkdir()
    engine = FakeEngine(n_slots=1, save_dir=slots)
    settings = make_settings("http://127.0.0.1:9", tmp_path, slot_save_path=slots)
    service = SessionService(settings, engine)
    savings = SavingsStage(service, None, engine)
    pipeline = Pipeline([SessionStage(service, engine), _Recorder(), savings, SessionCommitStage()])
    await service.start()
    try:
        yield Proxy(engine, service, pipeline, settings), savings
    finally:
        await savings.stop()
        await service.stop()


L_INT, L_STR = ["list", "int"], ["list", "str"]
STAGE_MS = [(k, "float") for k in ("segment", "represent", "score", "select", "spread", "rewrite")]
REQUEST = [("source", "str"), ("pinned_tail_tokens", "int"), ("text", "str"), ("truncated", "bool"), ("lines", L_INT)]
UNITS = [("start", L_INT), ("end", L_INT), ("tokens", L_INT), ("score", ["list", "float"])]
COMPRESSION_HEAD = [
    ("kind", "str"), ("turn", "int"), ("message", "int"), ("role", "str"), ("at", "float"), ("mode", "str"),
    ("reason", "NoneType"), ("scorer", "str"), ("segmenter", "str"), ("message_tokens", "int"),
    ("served_tokens", "int"), ("budget", "int"), ("selection_budget", "int"), ("prompt_tokens", "int"),
    ("uncached_tokens", "int"), ("gutter", "NoneType"), ("spread", "float"), ("stage_ms", STAGE_MS),
    ("n_lines", "int")]
COMPRESSION = [("v", "int"), *COMPRESSION_HEAD, ("text", "str"), ("request", REQUEST), ("units", UNITS),
               ("kept", L_INT), ("pinned", L_INT)]
# as the trace log gives it back: the text and units come back last, from the keys they are stored under
COMPRESSION_STORED = [("v", "int"), *COMPRESSION_HEAD, ("request", REQUEST), ("kept", L_INT), ("pinned", L_INT),
                      ("text", "str"), ("units", UNITS)]
COMPRESSION_VIEW = [*COMPRESSION_HEAD, ("request", REQUEST),
                    ("units", ["list", [("index", "int"), ("lines", L_INT), ("tokens", "int"), ("score", "float"),
                                        ("kept", "bool"), ("pinned", "bool")]]),
                    ("lines", L_STR), ("text_dropped", "bool")]
RECALL_VIEW = [("kind", "str"), ("turn", "int"), ("message", "int"), ("at", "float"), ("share", "float"),
               ("excerpts", ["list", [("from_message", "str"), ("lines", L_INT), ("tokens", "int"),
                                      ("units", L_INT), ("text", "str")]])]
RECALL = [("v", "int"), *RECALL_VIEW]
CACHE_VIEW = [("kind", "str"), ("turn", "int"), ("message", "int"), ("at", "float"), ("announced", "str"),
              ("reported", "str"), ("expected_tokens", "int"), ("cached_tokens", "int"), ("reason", "str")]
CACHE = [("v", "int"), *CACHE_VIEW]
BY_CAUSE_INT = [("compression", "int"), ("cache", "int")]
TURN_HEAD = [
    ("v", "int"), ("kind", "str"), ("turn", "int"), ("at", "float"), ("client", "NoneType"), ("status", "int"),
    ("completed", "bool"), ("cache", "str"), ("expected_cached", "int"), ("pflash", "NoneType"),
    ("why", "NoneType"),
    ("messages", ["list", [("message", "int"), ("mode", "str"), ("tokens", "int"), ("served_tokens", "int"),
                           ("why", "NoneType")]]),
    ("first_byte_ms", "NoneType"), ("queue_ms", "float"), ("prepare_ms", "float"), ("compression_ms", "float"),
    ("cached_tokens", "int"), ("prefilled_tokens", "int"), ("prefill_ms", "float"), ("generated_tokens", "int"),
    ("generate_ms", "float"), ("tokens_avoided", BY_CAUSE_INT)]
TURN = [*TURN_HEAD, ("saved_s", [("compression", "NoneType"), ("cache", "NoneType")]), ("rate_tps", "NoneType")]
TURN_PRICED = [*TURN_HEAD, ("saved_s", [("compression", "float"), ("cache", "float")]), ("rate_tps", "float")]
TOTALS = [("compressed", "int"), ("served_whole", "int"), ("tokens_in", "int"), ("tokens_served", "int"),
          ("recalls", "int"), ("recall_tokens", "int"), ("turns_recorded", "int"), ("turns_timed", "int"),
          ("prefilled_tokens", "int"), ("cached_tokens", "int"), ("avoided_compression", "int"),
          ("avoided_cache", "int"), ("saved_ms_compression", "int"), ("saved_ms_cache", "int")]


def test_each_kind_of_trace_is_built_as_it_is_pinned():
    turn = tr.TurnTraces(1)
    _traces(turn)
    assert [shape(t) for t in turn.items] == [COMPRESSION, RECALL, CACHE]
    assert [shape(view(t)) for t in turn.items] == [COMPRESSION_VIEW, RECALL_VIEW, CACHE_VIEW]
    assert json.loads(json.dumps(turn.items)) == turn.items
    assert turn.counts == {"compressed": 1, "served_whole": 0, "tokens_in": turn.items[0]["message_tokens"],
                           "tokens_served": 123, "recalls": 1, "recall_tokens": 5}


async def test_each_kind_of_trace_is_stored_and_served_as_it_is_pinned(proxy):
    p, savings = proxy
    req, _ = await p.turn(chat(DOC_A, "What is it?"))
    sid = req.response_headers["X-PFlash-Session"]
    await p.pipeline.settled()
    kept = p.service.view().trace_log(sid)
    assert kept is not None
    assert [shape(t) for t in kept.traces] == [TURN, COMPRESSION_STORED, RECALL, CACHE]  # turns first
    assert shape(kept.totals) == TOTALS
    (turn, compression, recall, cache) = kept.traces
    assert [shape(view(t)) for t in (compression, recall, cache)] == [COMPRESSION_VIEW, RECALL_VIEW, CACHE_VIEW]
    assert turn["messages"] == [{"message": 0, "mode": "compressed", "tokens": compression["message_tokens"],
                                 "served_tokens": 123, "why": None}]
    assert turn["tokens_avoided"] == {"compression": compression["message_tokens"] - 123, "cache": 0}
    priced, added = price(turn, {}, {"timed_prefilled_tokens": 1000, "timed_prefill_ms": 1000})
    assert shape(priced) == TURN_PRICED and priced["rate_tps"] == 1000.0
    assert added == {"saved_ms_compression": round(priced["saved_s"]["compression"] * 1000), "saved_ms_cache": 0}
    assert shape(turn) == TURN  # ``price`` copies
    assert savings.stats().turns == 1


PRINTED = """\
prefill: 222 tokens prefilled in 0ms, 0 reused from the slot; time saved ≈ 0ms (compression 0ms for 1,146 tokens, \
cache 0ms for 0 tokens; an estimate)

── turns ────────────────────────────────────────
turn 1: miss, cached 0, prefilled 222 in 0ms, 1,146 not prefilled thanks to compression; time saved ≈ – \
(compression –, cache –; estimate)

── message 1 (system, served in turn 1) ────────────────────────────────────────
[recall · 1 excerpt prepended · omitted share 0.250]
  from message 1, lines 3–4 (5 tokens)
[compressed · 1,269 → 123 tokens · budget 381 · prompt 1,269 · scorer lexical · 11/49 units kept · spread -0.616]
request from question, line 97, marked >: How many visitors did the apiary records list?
 1  │ Section 0: the glacier of Vellmoor keeps glacier records of 0 visitors, all about the glacier.
 2  │
 3  │ Section 1: the violin of Vellmoor keeps violin records of 7 visitors, all about the violin.
 4  │
 5  │ Section 2: the harbour of Vellmoor keeps harbour records of 14 visitors, all about the harbour.
 6  │
 7  │ Section 3: the orchard of Vellmoor keeps orchard records of 21 visitors, all about the orchard.
 8  │
     … 2 lines omitted (unit 4, score 0.008)
11  │ Section 5: the bakery of Vellmoor keeps bakery records of 35 visitors, all about the bakery.
12  │
13  │ Section 6: the railway of Vellmoor keeps railway records of 42 visitors, all about the railway.
14  │
     … 12 lines omitted (units 7–12, scores 0.008)
27  │ Section 13: the apiary of Vellmoor keeps apiary records of 91 visitors, all about the apiary.
28  │
     … 30 lines omitted (units 14–28, scores 0.008)
59  │ Section 29: the apiary of Vellmoor keeps apiary records of 203 visitors, all about the apiary.
60  │
     … 30 lines omitted (units 30–44, scores 0.008)
91  │ Section 45: the apiary of Vellmoor keeps apiary records of 315 visitors, all about the apiary.
92  │
     … 2 lines omitted (unit 46, score 0.008)
95  │ Section 47: the shipyard of Vellmoor keeps shipyard records of 329 visitors, all about the shipyard.
96  │
97 >│ How many visitors did the apiary records list?

── message 2 (user) ────────────────────────────────────────
      │ What is it?
"""


async def test_the_session_page_serves_and_show_prints_each_kind_as_pinned(proxy):
    """The session's API JSON (``InspectorData.session``): its turns as stored less ``v``, its traces as ``view``
    serves them; and ``pflash-proxy show`` prints them as it did."""
    p, _ = proxy
    req, _ = await p.turn(chat(DOC_A, "What is it?"))
    sid = req.response_headers["X-PFlash-Session"]
    await p.pipeline.settled()
    data = InspectorData(InspectorViews(engine=p.engine, sessions=p.service.view, stats=None)).session(sid)
    assert data is not None
    data = json.loads(json.dumps(data))  # as served
    assert shape(data["turns"]) == ["list", TURN[1:]]  # less ``v``
    assert shape(data["traces"]) == ["list", COMPRESSION_VIEW, RECALL_VIEW, CACHE_VIEW]
    out = io.StringIO()
    print_session(data, out)
    printed = [line.rstrip() for line in out.getvalue().splitlines()[1:]]  # the first line says when it was used
    assert printed == PRINTED.splitlines()
