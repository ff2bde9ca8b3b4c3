"""Idle saves (``SlotScheduler.idle_save_loop`` / ``idle_due``, ``--idle-save-s``, ``--idle-save-mb-s``) on the
in-process ``FakeEngine``, the session stages running as the server runs them: a slot that is busy is never
saved (neither under a lease of the proxy's nor while the engine works on it), the I/O budget spaces the saves,
a session is saved once per change, and nothing is saved of a slot that a restart may have emptied.

The rounds are run by the tests themselves (``SlotScheduler.idle_save_round(0)``: every resident session counts as idle), so
no test waits for a clock; one test runs the loop itself."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from pflash_proxy.sessions.index.sqlite import SqliteIndex
from pflash_proxy.sessions.slots import Slot
from tests.sessions.test_fake_engine_pipeline import DOC_A, DOC_B, Proxy, RemoteStore, _proxy, chat

DOC_C = "The orchard by the river grows plums in rows of seven and apples in rows of five. " * 12


def saves(p: Proxy) -> int:
    """Saves the engine was asked for (evicted, idle or any other)."""
    return p.engine.calls.get("save", 0)


async def idle_round(p: Proxy) -> None:
    """One idle-save round in which every resident session counts as idle (the loop's own step, run here so no test
    waits for a clock)."""
    service = p.service  # the round is the scheduler's, through the service's snapshot store: reaches inside
    await asyncio.wait_for(service._scheduler.idle_save_round(0, service._snapshots), 10)


def slot(p: Proxy, i: int = 0) -> Slot:
    """Slot ``i`` as the service's view shows it now (a copy)."""
    return p.service.view().slots()[i]


async def test_a_slot_leased_after_the_round_chose_it_is_skipped_not_waited_for(two):
    """Two idle sessions are due; while the first is saved, the second's next turn takes its slot. The round does
    not wait for that turn to end and then save the slot right after it (not idle, and the turn after it would
    wait behind the save): it moves on, and the session is saved once it has been idle again."""
    await two.turn(chat(DOC_A, "How many crates at plot 3?"))
    await two.turn(chat(DOC_B, "Who logs the ships?"))
    a, b = two.service.view().slots()
    started, go = asyncio.Event(), asyncio.Event()
    save = two.engine.slots.save

    async def slow_save(slot: int, name: str) -> int:
        started.set()
        await go.wait()
        return await save(slot, name)

    two.engine.slots.save = slow_save  # type: ignore[method-assign]
    round_ = asyncio.create_task(idle_round(two))
    await asyncio.wait_for(started.wait(), 5)  # A's save is under way
    assert b.session is not None
    async with two.holding(b.session):  # B's next turn begins
        go.set()
        await asyncio.wait_for(round_, 5)  # the round ended without waiting for B's turn
        assert slot(two, 0).snapshot_current and not slot(two, 1).snapshot_current and saves(two) == 1
        assert two.stats().scheduler.idle_saves == 1 and two.stats().snapshots.saves_refused == 0
    await idle_round(two)  # idle again: saved now
    assert slot(two, 1).snapshot_current and saves(two) == 2 and two.stats().scheduler.idle_saves == 2


async def test_a_slot_the_engine_reports_busy_is_not_saved_and_is_saved_once_idle(one):
    """The engine works on the slot without a lease of the proxy's (a client's own request past the proxy): no
    save is sent to it; the session's change is still saved once the slot is idle."""
    await one.turn(chat(DOC_A, "How many crates at plot 3?"))
    one.engine.slots.busy.add(slot(one).id)
    await idle_round(one)
    await idle_round(one)
    assert saves(one) == 0 and not slot(one).snapshot_current and one.stats().snapshots.saves_refused >= 1
    one.engine.slots.busy.clear()
    await idle_round(one)
    assert saves(one) == 1 and slot(one).snapshot_current and one.stats().scheduler.idle_saves == 1


async def test_a_leased_slot_is_not_due(one):
    await one.turn(chat(DOC_A, "How many crates at plot 3?"))
    sid = slot(one).session
    assert sid is not None
    async with one.holding(sid):
        await idle_round(one)
        assert saves(one) == 0 and one.engine.calls.get("states", 0) == 0  # not even asked


@pytest.mark.parametrize("remote", [False, True], ids=["local-index", "remote-index"])
async def test_the_mb_s_budget_spaces_the_saves(tmp_path, remote):
    """Three due sessions, a budget at which each snapshot takes ~0.3 s: the saves start that far apart, whatever
    the index (a remote one, where the snapshot's record is not read back on the loop, paced nothing)."""
    store = (RemoteStore if remote else SqliteIndex)(tmp_path / "index")
    async for p in _proxy(tmp_path, index=store, n_slots=3):
        for doc in (DOC_A, DOC_B, DOC_C):
            await p.turn(chat(doc, "Which rows?"))
        await _paced_round(p, pace_s=0.3)


async def _paced_round(p: Proxy, pace_s: float) -> None:
    sizes = [len(json.dumps(s.tokens)) for s in p.engine.slots.slots]  # what the fake will write per slot
    rate = max(sizes) / pace_s
    p.write_rate(rate / 1e6)
    started: list[tuple[int, float]] = []
    save = p.engine.slots.save

    async def timed_save(slot: int, name: str) -> int:
        started.append((slot, time.monotonic()))
        return await save(slot, name)

    p.engine.slots.save = timed_save  # type: ignore[method-assign]
    await idle_round(p)
    assert len(started) == 3 and p.stats().scheduler.idle_saves == 3
    for (slot, t0), (_, t1) in zip(started, started[1:]):
        budget_s = sizes[slot] / rate
        assert t1 - t0 >= budget_s * 0.95, (t1 - t0, budget_s)


async def test_a_session_is_saved_once_per_change(one):
    await one.turn(chat(DOC_A, "How many crates at plot 3?"))
    for _ in range(3):
        await idle_round(one)
    assert saves(one) == 1 and one.stats().scheduler.idle_saves == 1
    await one.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?"))  # a hit: the slot changed
    for _ in range(3):
        await idle_round(one)
    assert saves(one) == 2 and one.stats().scheduler.idle_saves == 2
    # a save the engine's record refuses (its slot holds a prompt of another length) is not asked again every
    # round: only after the next change
    await one.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?", "And in all?"))
    one.engine.slots.slots[0].prompt_tokens = 3
    states = one.engine.calls.get("states", 0)
    for _ in range(3):
        await idle_round(one)
    assert saves(one) == 2 and one.stats().snapshots.saves_refused == 1
    assert one.engine.calls["states"] == states + 1


async def test_the_loop_saves_an_idle_session_once(tmp_path):
    """``--idle-save-s`` itself: the background loop saves a session idle that long, once."""
    async for p in _proxy(tmp_path, idle_save_s=0.2):
        await p.turn(chat(DOC_A, "How many crates at plot 3?"))
        for _ in range(100):
            if slot(p).snapshot_current:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.6)  # a few more rounds
        assert slot(p).snapshot_current and saves(p) == 1 and p.stats().scheduler.idle_saves == 1


async def test_no_save_after_a_restart_the_proxy_noticed(one):
    await one.turn(chat(DOC_A, "How many crates at plot 3?"))
    await idle_round(one)
    await one.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?"))  # changed since that snapshot
    sid = slot(one).session
    assert sid is not None
    snapshot = one.service.view().snapshot(sid)
    one.engine.restart("the test restarted it")
    await idle_round(one)
    await one.service.ensure_ready()  # the next request describes the engine again
    await idle_round(one)
    assert saves(one) == 1 and one.service.view().snapshot(sid) == snapshot  # the previous snapshot stays


async def test_no_save_after_a_restart_nobody_noticed(one):
    """The engine came back empty between two health probes: the slot's state (no task since it started) refuses
    the save, the previous snapshot stays, and the restart is noticed once."""
    await one.turn(chat(DOC_A, "How many crates at plot 3?"))
    await idle_round(one)
    await one.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?"))
    sid = slot(one).session
    assert sid is not None
    snapshot = one.service.view().snapshot(sid)
    for s in one.engine.slots.slots:
        s.tokens, s.task, s.prompt_tokens = [], None, None
    await idle_round(one)
    await idle_round(one)
    assert saves(one) == 1 and one.service.view().snapshot(sid) == snapshot
    assert one.stats().snapshots.saves_refused == 1 and one.stats().scheduler.upstream_restarts == 1


async def test_a_turn_answered_across_a_noticed_restart_is_not_saved_nor_noticed_twice(two):
    """A turn's answer arrives after a restart was noticed (and the engine described again by another request):
    what the table learns from it may be the old process's, so its slot is not saved, and the one restart counts
    once (a second notice would also empty every slot restored since)."""
    await two.turn(chat(DOC_A, "How many crates at plot 3?"))
    await idle_round(two)

    async def restarted() -> None:
        two.engine.restart("killed after it answered")
        await two.service.ensure_ready()  # another request met the engine back before this answer was read

    await two.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?"), answered=restarted)
    req, _ = await two.turn(chat(DOC_B, "Who logs the ships?"))  # another session, on the restarted engine
    sid_b = req.response_headers["X-PFlash-Session"]
    b = two.service.view().resident_slot(sid_b)
    await idle_round(two)
    assert two.stats().scheduler.upstream_restarts == 1
    assert saves(two) == 2 and b is not None and slot(two, b).snapshot_current  # B's idle save, not A's
    assert two.service.view().resident_slot(sid_b) == b  # B's slot was not forgotten
