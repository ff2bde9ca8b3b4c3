"""A request's turn is one object (``SessionService.begin`` -> ``Turn``): what it holds is released by ``close``,
exactly once, and by ``begin`` itself when it fails or is cancelled before it returns the turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pflash_proxy.sessions.service import TurnAsk
from pflash_proxy.sessions.slots import SlotReport
from tests.sessions.test_fake_engine_pipeline import DOC_A, DOC_B, Proxy, _proxy, chat


@pytest.fixture
async def saving(tmp_path) -> AsyncIterator[Proxy]:
    async for p in _proxy(tmp_path, save_every_turn=True):
        yield p


async def test_a_turn_closed_twice_releases_and_saves_once(saving):
    await saving.turn(chat(DOC_A, "Which plot?"))
    await saved(saving, 1)
    turn = await saving.service.begin(TurnAsk("chat", {}, messages=chat(DOC_A, "Which plot?", "And the next?")))
    assert turn.record is not None and turn.slot == 0 and turn.cache == "hit"
    answer = await saving.engine.complete({"messages": turn.served, "max_tokens": 1, **turn.pin})
    await turn.commit(turn.served, 100)
    seen = turn.observe(SlotReport.of(200, saving.engine.cache_report(answer)))
    assert seen is not None and seen.reported == "hit"
    await turn.close()
    await turn.close()  # a second close does nothing: no second release, no second save
    await saved(saving, 2)
    await asyncio.sleep(0.1)
    assert saving.engine.calls.get("save", 0) == 2 and not saving.service.view().slots()[0].busy
    assert saving.service.stats().snapshots.saves_unchanged == 0  # no save of it was even tried again


async def saved(p, n: int) -> None:
    """Wait until the engine was asked for ``n`` saves (``--save-every-turn`` saves in the background)."""
    for _ in range(200):
        if p.engine.calls.get("save", 0) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{p.engine.calls.get('save', 0)} saves, not {n}")


async def test_a_begin_cancelled_while_it_readies_the_slot_releases_the_lease(one):
    await one.turn(chat(DOC_A, "Which plot?"))  # A holds the only slot, unsaved
    saving, go = asyncio.Event(), asyncio.Event()
    real_save = one.engine.slots.save

    async def slow_save(slot: int, name: str) -> int:
        saving.set()
        await go.wait()
        return await real_save(slot, name)
    one.engine.slots.save = slow_save  # type: ignore[method-assign]
    # B displaces A from the only slot: A is saved first, and B's begin is cancelled meanwhile
    begun = asyncio.ensure_future(one.service.begin(TurnAsk("chat", {}, messages=chat(DOC_B, "Which ship?"))))
    await asyncio.wait_for(saving.wait(), 5)
    begun.cancel()
    go.set()
    try:
        await begun
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(0.05)
    assert not one.service.view().slots()[0].busy  # the lease went back
    again = await asyncio.wait_for(one.service.begin(TurnAsk("chat", {}, messages=chat(DOC_B, "Which ship?"))), 5)
    assert again.slot == 0
    await again.close()


async def test_an_anonymous_and_a_batch_turn_are_the_same_object(two):
    anonymous = await two.service.begin(TurnAsk("anonymous", {}))
    assert anonymous.record is None and anonymous.slot is not None and not anonymous.batch
    await anonymous.close()
    batch = await two.service.begin(TurnAsk("batch", {}))
    assert batch.batch and batch.slot is None and all(s.busy for s in two.service.view().slots())
    assert batch.observe(SlotReport(cached_tokens=5, prompt_tokens=10)) is None  # a batch learns nothing
    await batch.close()
    assert not any(s.busy or s.known for s in two.service.view().slots())  # released, content unknown


async def test_a_committed_recall_source_is_kept_with_the_history_across_a_restart(tmp_path):
    """What compression omitted (``CompressionNote.recall``) reaches the record only through ``Turn.commit``, and
    the next turn, on a restarted service over the same index, finds it on its record."""
    from pflash_proxy.sessions.index.sqlite import SqliteIndex
    from tests.sessions.test_fake_engine_pipeline import _proxy
    from tests.sessions.test_redis_index import _recall_source

    source = _recall_source("amber")
    first = chat(DOC_A, "Which plot?")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    index = SqliteIndex(tmp_path / "index")
    async for p in _proxy(tmp_path / "a", index=index):
        turn = await p.service.begin(TurnAsk("chat", {}, messages=first))
        assert turn.record is not None and turn.record.recall_sources == []
        assert await turn.commit(turn.served, 100, recall=source)
        await turn.close()
    index.close()
    again = SqliteIndex(tmp_path / "index")
    async for p in _proxy(tmp_path / "b", index=again):
        turn = await p.service.begin(TurnAsk("chat", {}, messages=chat(DOC_A, "Which plot?", "And the next?")))
        assert turn.record is not None and turn.matched == len(first)
        assert [s.omitted_texts for s in turn.record.recall_sources] == [source.omitted_texts]
        await turn.close()
    again.close()
