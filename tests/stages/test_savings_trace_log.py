"""A turn's traces go to the session's trace log after its answer (``stages.savings.SavingsStage``, step 5).

The session record, which every turn reads at its lookup and writes at its commit, carries none of them; the
answer does not wait for their write; a session's writes land in turn order; ``settle`` (what ``/pflash/stats``,
the metrics and the inspector await) and ``stop`` wait for them; a failed write costs the traces, never the turn.
Run on the in-process ``FakeEngine`` through the session stages as the server runs them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest

from pflash_proxy.contract import Pipeline
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.stages import savings as turns
from pflash_proxy.stages.savings import SavingsStage, price
from pflash_proxy.sessions.index import SessionIndex, StoreError, TraceLog, open_index
from pflash_proxy.sessions.service import SessionService
from pflash_proxy.stages.sessions import SessionCommitStage, SessionStage
from tests.conftest import make_settings
from tests.sessions.test_fake_engine_pipeline import DOC_A, Proxy, chat

QUESTIONS = [f"What is held at plot {i}?" for i in range(6)]


class Proxied(Proxy):
    savings: SavingsStage
    index: SessionIndex


@pytest.fixture
async def proxy(tmp_path) -> AsyncIterator[Proxied]:
    slots = tmp_path / "slots"
    slots.mkdir()
    engine = FakeEngine(n_slots=1, save_dir=slots)
    settings = make_settings("http://127.0.0.1:9", tmp_path, slot_save_path=slots)
    index = open_index(settings.proxy.home, settings.cluster.index)  # the test's own: it injects faults in it
    service = SessionService(settings, engine, index=index)
    savings = SavingsStage(service, None, engine)
    pipeline = Pipeline([SessionStage(service, engine), savings, SessionCommitStage()])
    await service.start()
    p = Proxied(engine, service, pipeline, settings)
    p.savings, p.index = savings, index
    try:
        yield p
    finally:
        await savings.stop()
        await service.stop()


def _gate(proxy: Proxied) -> tuple[threading.Event, list[int]]:
    """The index's trace-log writes wait for the event (a slow disk); returns it and the turns written."""
    gate, written = threading.Event(), []
    store = proxy.index
    real = store.update_trace_log

    def slow(sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog | None:
        assert gate.wait(10)
        out = real(sid, update)
        written.append(out.traces[-1]["turn"] if out else -1)
        return out

    store.update_trace_log = slow  # type: ignore[method-assign]
    return gate, written


async def test_the_record_carries_no_traces_and_the_log_holds_every_turn(proxy):
    for i in range(1, len(QUESTIONS) + 1):
        req, _ = await proxy.turn(chat(DOC_A, *QUESTIONS[:i]))
        sid = req.response_headers["X-PFlash-Session"]
        await proxy.pipeline.settled()
        rec = proxy.service.view().session(sid)
        assert rec is not None and rec.traces == [] and rec.trace_totals == {}
    kept = proxy.service.view().trace_log(sid)
    assert kept is not None and [t["turn"] for t in kept.traces] == [1, 2, 3, 4, 5, 6]
    assert kept.totals["turns_recorded"] == 6 and kept.totals["turns_timed"] == 6
    assert all(t["prefilled_tokens"] is not None for t in kept.traces)
    assert proxy.savings.stats().turns == 6


async def test_the_answer_does_not_wait_for_the_trace_write_and_settle_does(proxy):
    gate, written = _gate(proxy)
    req, _ = await asyncio.wait_for(proxy.turn(chat(DOC_A, QUESTIONS[0])), 5)  # finished with the write held
    assert req.response_headers["X-PFlash-Cache"] == "miss" and written == []
    assert proxy.savings.stats().turns == 0  # counted once written, with the session's rate
    settling = asyncio.ensure_future(proxy.pipeline.settled())
    await asyncio.sleep(0.1)
    assert not settling.done()  # a reader waits for it
    gate.set()
    await asyncio.wait_for(settling, 5)
    assert written == [1] and proxy.savings.stats().turns == 1


async def test_a_sessions_quick_turns_go_in_one_write_in_turn_order(proxy):
    gate, written = _gate(proxy)
    for i in range(1, 4):  # within FLUSH_AFTER_S of each other
        req, _ = await proxy.turn(chat(DOC_A, *QUESTIONS[:i]))
    gate.set()
    await proxy.pipeline.settled()
    assert written == [3]  # one read and one write of the log for the three
    kept = proxy.service.view().trace_log(req.response_headers["X-PFlash-Session"])
    assert kept is not None and [t["turn"] for t in kept.traces] == [1, 2, 3]


async def test_a_writes_turns_join_the_log_in_one_pass_each_priced_at_the_turns_before_it(proxy, monkeypatch):
    """The turns one write gathers go into the log in one ``append`` (not one pass over the whole log per turn),
    and each is priced, and its totals added, as if written one after another."""
    gate, written = _gate(proxy)
    appends: list[int] = []
    real = turns.append

    def counting(kept: TraceLog, turn):  # type: ignore[no-untyped-def]
        appends.append(len(turn.items))
        return real(kept, turn)

    monkeypatch.setattr(turns, "append", counting)
    for i in range(1, 4):
        req, _ = await proxy.turn(chat(DOC_A, *QUESTIONS[:i]))
    gate.set()
    await proxy.pipeline.settled()
    assert written == [3] and len(appends) == 1
    kept = proxy.service.view().trace_log(req.response_headers["X-PFlash-Session"])
    assert kept is not None
    logged = [t for t in kept.traces if t["kind"] == "turn"]
    assert [t["turn"] for t in logged] == [1, 2, 3]
    totals: dict[str, int] = {}
    for t in logged:  # priced one after another: at the session's totals up to the turn
        built = {"turns_recorded": 1, "turns_timed": 1, "prefilled_tokens": t["prefilled_tokens"],
                 "cached_tokens": t["cached_tokens"], "avoided_compression": t["tokens_avoided"]["compression"],
                 "avoided_cache": t["cached_tokens"]}
        if t["prefill_ms"]:
            built["prefill_ms"] = round(t["prefill_ms"])
            if t["prefilled_tokens"] >= turns.MIN_TIMED_PROMPT:
                built["timed_prefilled_tokens"] = t["prefilled_tokens"]
                built["timed_prefill_ms"] = max(1, round(t["prefill_ms"]))
        bare = {k: v for k, v in t.items() if k not in ("rate_tps", "saved_s")}
        bare.update(rate_tps=None, saved_s={"compression": None, "cache": None})
        again, added = price(bare, built, totals)
        assert again["saved_s"] == t["saved_s"] and again["rate_tps"] == t["rate_tps"]
        for k, v in added.items():
            totals[k] = totals.get(k, 0) + v
    assert {k: kept.totals.get(k) for k in totals} == totals


async def test_back_to_back_turns_over_a_second_share_one_write(proxy):
    """A write costs a decode and an encode of the whole log: turns that follow each other for over a second
    (an agent's tool loop) still cost one (FLUSH_AFTER_S), with no reader asking for it."""
    gate, written = _gate(proxy)
    gate.set()
    for i in range(1, 4):
        await proxy.turn(chat(DOC_A, *QUESTIONS[:i]))
        await asyncio.sleep(0.45)
    assert written == []  # 1.35 s after the first turn: still gathering
    await asyncio.sleep(turns.FLUSH_AFTER_S)
    assert written == [3]


async def test_a_write_waits_for_the_sessions_write_before_it(proxy, monkeypatch):
    monkeypatch.setattr(turns, "FLUSH_AFTER_S", 0.0)
    gate, written = _gate(proxy)
    await proxy.turn(chat(DOC_A, *QUESTIONS[:1]))
    await asyncio.sleep(0.05)  # its write started and waits on the disk
    await proxy.turn(chat(DOC_A, *QUESTIONS[:2]))
    await asyncio.sleep(0.05)
    gate.set()
    await proxy.pipeline.settled()
    assert written == [1, 2]
    kept = proxy.service.view().trace_log(next(iter(proxy.service.view().last_uses())))
    assert kept is not None and [t["turn"] for t in kept.traces] == [1, 2]


async def test_turns_apart_go_in_writes_of_their_own(proxy, monkeypatch):
    monkeypatch.setattr(turns, "FLUSH_AFTER_S", 0.05)
    gate, written = _gate(proxy)
    gate.set()
    await proxy.turn(chat(DOC_A, *QUESTIONS[:1]))
    await asyncio.sleep(0.3)  # written on its own, without a reader asking
    assert written == [1] and proxy.savings.stats().turns == 1
    await proxy.turn(chat(DOC_A, *QUESTIONS[:2]))
    await proxy.pipeline.settled()
    assert written == [1, 2]


async def test_stop_waits_for_the_writes_in_flight(proxy):
    gate, written = _gate(proxy)
    await proxy.turn(chat(DOC_A, QUESTIONS[0]))
    stopping = asyncio.ensure_future(proxy.savings.stop())
    await asyncio.sleep(0.1)
    assert not stopping.done() and written == []
    gate.set()
    await asyncio.wait_for(stopping, 5)
    assert written == [1]


async def test_a_failed_write_costs_the_traces_not_the_turn(proxy, caplog):
    def fail(sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog | None:
        raise StoreError("session index: disk full")

    proxy.index.update_trace_log = fail  # type: ignore[method-assign]
    req, answer = await proxy.turn(chat(DOC_A, QUESTIONS[0]))
    assert answer and req.response_headers["X-PFlash-Session"]
    await proxy.pipeline.settled()
    assert "could not save the traces of turns 1 of session" in caplog.text
    assert proxy.savings.stats().turns == 1 and proxy.savings.stats().turns_timed == 1  # its own rate


def test_a_turn_is_priced_at_the_rate_of_the_sessions_totals_before_it_and_its_own():
    turn = {"kind": "turn", "prefilled_tokens": 100, "prefill_ms": 50.0, "cached_tokens": 0,
            "tokens_avoided": {"compression": 1000, "cache": 0}, "saved_s": {"compression": None, "cache": None}}
    totals = {"turns_timed": 1, "timed_prefilled_tokens": 100, "timed_prefill_ms": 50}
    priced, added = price(turn, totals, {"timed_prefilled_tokens": 300, "timed_prefill_ms": 150})
    assert priced["rate_tps"] == 2000.0 and priced["saved_s"] == {"compression": 0.5, "cache": 0.0}
    assert added["saved_ms_compression"] == 500 and turn["saved_s"]["compression"] is None  # copies
    alone, _ = price(turn, totals, {})
    assert alone["saved_s"]["compression"] == 0.5  # the same rate from the turn alone here: 100 / 50 ms
    untimed, same = price({**turn, "prefilled_tokens": None}, {"turns_recorded": 1}, {})
    assert untimed["saved_s"] == {"compression": None, "cache": None} and same == {"turns_recorded": 1}


async def test_the_turn_trace_is_built_by_the_trace_write_not_before_the_answer(proxy, monkeypatch):
    """The answer's path only notes what the turn trace needs (``contract.TurnNote``); the trace write builds it,
    with the time the answer ended."""
    built: list[int] = []
    real = proxy.savings.turn_trace

    def spy(req):
        built.append(req.notes.turn.number)
        return real(req)

    monkeypatch.setattr(proxy.savings, "turn_trace", spy)
    before = time.time()
    req, _ = await proxy.turn(chat(DOC_A, QUESTIONS[0]))
    answered = time.time()
    assert built == []  # the turn ended (on_response, on_finish): nothing built yet
    await asyncio.sleep(0.2)
    await proxy.pipeline.settled()
    assert built == [1]
    kept = proxy.service.view().trace_log(req.response_headers["X-PFlash-Session"])
    assert kept is not None and before <= kept.traces[-1]["at"] <= answered
