"""SlotTable's bounded wait: --max-queue refuses at once (429), --queue-timeout-s gives up (503)."""

from __future__ import annotations

import asyncio

import pytest

from pflash_proxy.errors import QueueFull, QueueTimeout
from pflash_proxy.sessions.slots import SlotTable


async def test_beyond_max_queue_a_request_is_refused_with_retry_after():
    t = SlotTable(1, max_queue=1)
    held = await t.acquire("a")
    waiter = asyncio.create_task(t.acquire("b"))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull) as e:
        await t.acquire("c")
    assert e.value.status == 429 and int(e.value.headers["Retry-After"]) >= 1
    assert t.queued == 1 and t.refused["queue_full"] == 1
    t.release(held)
    assert (await waiter).session == "b"


async def test_a_wait_longer_than_the_timeout_gives_up_and_leaves_the_queue():
    t = SlotTable(1, queue_timeout=0.05)
    held = await t.acquire("a")
    with pytest.raises(QueueTimeout) as e:
        await t.acquire("b")
    assert e.value.status == 503 and "Retry-After" in e.value.headers
    assert t.queued == 0
    t.release(held)
    assert (await t.acquire("c")).session == "c"  # nothing stale holds the slot


async def test_background_saves_are_never_refused():
    t = SlotTable(1, max_queue=1, queue_timeout=0.01)
    lease = await t.acquire("a")
    t.release(lease)
    held = await t.acquire("a")
    blocked = asyncio.create_task(t.acquire("x"))
    await asyncio.sleep(0)
    save = asyncio.create_task(t.acquire("a", resident_only=True))  # waits for a's running request
    await asyncio.sleep(0.05)
    assert not save.done()
    t.release(held)
    assert (await save).session == "a"
    with pytest.raises(QueueTimeout):
        await blocked
