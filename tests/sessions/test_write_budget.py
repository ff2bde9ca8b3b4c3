"""Issue 50 item 9: one write budget for every snapshot save (``WriteBudget``, ``--idle-save-mb-s``),
evictions included, and no snapshot written again of a session that did not change since its last one.

On 19528cf a session displaced from its slot was saved at every displacement, whatever had been written just
before (sessions outnumbering slots wrote about a whole slot per turn, 282 MB in 90 s at a budget far lower), and
the budget paced idle saves only. The in-process ``FakeEngine`` (its files are the slot's tokens as JSON), the
session stages running as the server runs them."""

from __future__ import annotations

import json
import time

from pflash_proxy.sessions.snapshot_store import EVICTION_BURST_S
from tests.sessions.test_fake_engine_pipeline import DOC_A, DOC_B, _proxy, chat
from tests.sessions.test_idle_saves import DOC_C, idle_round, saves


def written(p) -> int:
    """Bytes of snapshot files the engine wrote (kept or not)."""
    return int(p.stats().snapshots.snapshot_bytes_written)


async def test_evictions_share_the_write_budget(tmp_path):
    """Three sessions take turns on one slot, each turn displacing a session that changed. With a budget at which
    one file costs ~10 s, the first displaced session is saved and the next ones keep their last snapshot
    (counted), the turns are all served, and what was written stays within the budget plus its burst."""
    async for p in _proxy(tmp_path, n_slots=1):
        t0 = time.monotonic()
        await p.turn(chat(DOC_A, "How many crates at plot 3?"))
        size = len(json.dumps(p.engine.slots.slots[0].tokens))  # about what a save of one session writes
        rate = size / 10  # bytes per second: one file is ~10 s of budget
        p.write_rate(rate / 1e6)
        caches = []
        for questions in (("Which rows?",), ("Which wind?",), ("How many crates at plot 3?", "And plot 8?"),
                          ("Which rows?", "And the plums?"), ("Which wind?", "And the tide?")):
            doc = {"Which rows?": DOC_C, "Which wind?": DOC_B}.get(questions[0], DOC_A)
            req, _ = await p.turn(chat(doc, *questions))
            caches.append(req.response_headers["X-PFlash-Cache"])
        elapsed = time.monotonic() - t0
        counters = p.stats().snapshots
        assert counters.evicted_saves + counters.evicted_saves_skipped == 5
        assert counters.evicted_saves == 1 and saves(p) == 1, counters
        assert written(p) <= rate * (elapsed + EVICTION_BURST_S) + 2 * size
        # A was saved when B displaced it: its next turn restores that snapshot; the others start again
        assert caches == ["miss", "miss", "restored", "miss", "miss"]


async def test_idle_saves_wait_for_what_evictions_wrote(tmp_path):
    """An eviction's file counts against the idle saves' budget: the idle save after it waits until it is paid
    for (on 19528cf an idle save started at once after any number of eviction saves)."""
    async for p in _proxy(tmp_path, n_slots=2):
        await p.turn(chat(DOC_A, "How many crates at plot 3?"))
        await p.turn(chat(DOC_B, "Who logs the ships?"))
        size = len(json.dumps(p.engine.slots.slots[0].tokens))
        p.write_rate(size / 0.5 / 1e6)
        await p.turn(chat(DOC_C, "Which rows?"))  # displaces A: saved, ~0.5 s of budget owed
        assert p.stats().snapshots.evicted_saves == 1
        started: list[float] = []
        save = p.engine.slots.save

        async def timed_save(slot: int, name: str, started: list[float] = started, save=save) -> int:
            started.append(time.monotonic())
            return await save(slot, name)

        p.engine.slots.save = timed_save  # type: ignore[method-assign]
        t0 = time.monotonic()
        await idle_round(p)  # B and C are due
        assert p.stats().scheduler.idle_saves == 2 and len(started) == 2
        assert started[0] - t0 >= 0.5 * 0.8  # the eviction's file was paid for first
        assert started[1] - started[0] >= 0.5 * 0.8


async def test_an_unchanged_session_is_not_written_again(tmp_path):
    """A session restored from its snapshot and sent the same history again (a retried turn) holds what its
    snapshot holds: displaced again, it is not saved again (on 19528cf it was, every time)."""
    async for p in _proxy(tmp_path, n_slots=1):
        a1 = chat(DOC_A, "How many crates at plot 3?")
        await p.turn(a1)
        await p.turn(chat(DOC_B, "Who logs the ships?"))  # displaces A: saved
        assert saves(p) == 1
        req, _ = await p.turn(a1)  # A's turn again, the same history: its snapshot restored; B saved
        assert req.response_headers["X-PFlash-Cache"] == "restored" and saves(p) == 2
        req, _ = await p.turn(chat(DOC_B, "Who logs the ships?", "At what hour?"))  # displaces A, unchanged
        assert req.response_headers["X-PFlash-Cache"] == "restored"
        assert saves(p) == 2 and p.stats().snapshots.saves_unchanged == 1
        assert p.on_disk(req.response_headers["X-PFlash-Session"])
        # A comes back once more: its snapshot, still the one written first, is restored
        req, _ = await p.turn(chat(DOC_A, "How many crates at plot 3?", "And plot 8?"))
        assert req.response_headers["X-PFlash-Cache"] == "restored"
