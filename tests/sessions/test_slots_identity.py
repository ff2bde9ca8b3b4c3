"""SlotTable and session identity, without sockets."""

from __future__ import annotations

import asyncio

import pytest

from pflash_proxy.sessions.identity import chain, message_hash, namespace_seed
from pflash_proxy.sessions.slots import SlotTable
from pflash_proxy.sessions.index.sqlite import SqliteIndex


def test_message_hash_canonicalises_content_forms():
    a = {"role": "user", "content": "hello world"}
    b = {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}],
         "client_ts": 123}
    assert message_hash(a) == message_hash(b)
    assert message_hash(a) != message_hash({"role": "assistant", "content": "hello world"})
    call1 = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"x": 1}'}}]}
    call2 = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"x":1}'}}]}
    call3 = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"x":2}'}}]}
    assert message_hash(call1) == message_hash(call2) != message_hash(call3)


def test_explicit_names_never_share_a_chain():
    msgs = [message_hash({"role": "user", "content": "x"})]
    implicit = chain(namespace_seed("m"), msgs)
    named_a = chain(namespace_seed("m", "alice"), msgs)
    named_b = chain(namespace_seed("m", "bob"), msgs)
    assert len({implicit[0], named_a[0], named_b[0]}) == 3
    assert chain(namespace_seed("other-model"), msgs) != implicit


def test_store_finds_longest_served_prefix(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    seed = namespace_seed("m")
    turn1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    rec = store.new_session(seed, False)
    served = [turn1[0], {"role": "user", "content": "q1 (served version)"}]
    store.save_session(rec, [message_hash(m) for m in turn1], served)
    turn2 = turn1 + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    found, matched, _ = store.lookup(seed, turn2)
    assert found is not None and found.id == rec.id and matched == 2
    assert found.served[1]["content"] == "q1 (served version)"
    other, matched, _ = store.lookup(seed, [{"role": "user", "content": "unrelated"}])
    assert other is None and matched == 0
    # another namespace (explicit name) cannot see it
    assert store.lookup(namespace_seed("m", "alice"), turn2)[0] is None
    store.close()


async def test_slot_table_pins_sessions_and_evicts_lru():
    table = SlotTable(2)
    a = await table.acquire("A")
    b = await table.acquire("B")
    assert {a.slot.id, b.slot.id} == {0, 1} and not a.resident
    table.release(a)
    table.release(b)
    a2 = await table.acquire("A")
    assert a2.resident and a2.slot.id == a.slot.id
    table.release(a2)
    c = await table.acquire("C")  # evicts B, the least recently used
    assert c.evicted is not None and c.evicted.session == "B"
    assert c.slot.id == b.slot.id
    table.release(c)


async def test_one_request_per_session_and_fair_queue():
    table = SlotTable(1)
    order: list[str] = []
    first = await table.acquire("A")

    async def user(name: str) -> None:
        lease = await table.acquire(name)
        order.append(name)
        await asyncio.sleep(0.01)
        table.release(lease)

    tasks = [asyncio.create_task(user(n)) for n in ("B", "A", "C")]
    await asyncio.sleep(0.05)
    assert order == [] and table.queued == 3  # nothing runs on the busy slot
    table.release(first)
    await asyncio.gather(*tasks)
    assert order == ["B", "A", "C"]  # arrival order


async def test_cancelled_waiter_leaves_the_queue():
    table = SlotTable(1)
    held = await table.acquire("A")
    waiter = asyncio.create_task(table.acquire("B"))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert table.queued == 0
    table.release(held)
    lease = await asyncio.wait_for(table.acquire("C"), 1)
    assert lease.slot.id == 0


async def test_restart_empties_idle_slots_and_marks_busy_unknown():
    table = SlotTable(2)
    a = await table.acquire("A")
    b = await table.acquire("B")
    table.release(b)
    table.mark_all_empty()
    assert table.resident("B") is None
    assert a.slot.known is False


def test_prune_forgets_stale_and_surplus_sessions_but_keeps_forks_and_busy(tmp_path):
    import time as _time

    store = SqliteIndex(tmp_path / "s")
    seed = namespace_seed("m")
    doc = {"role": "system", "content": "a long shared document"}

    def saved(question: str, age_days: float, parent=None):
        msgs = [doc, {"role": "user", "content": question}]
        rec = store.new_session(seed, False, parent, 1 if parent else 0)
        store.save_session(rec, [message_hash(m) for m in msgs], msgs)
        rec.last_use = _time.time() - age_days * 86400
        store.update_record(rec)
        return rec, msgs

    old, old_msgs = saved("an old question", 40)
    fork, fork_msgs = saved("a newer question", 1, parent=old)  # shares the document's chain entry
    busy, busy_msgs = saved("a busy old question", 50)
    recent, _ = saved("a recent question", 0)
    gone = store.prune(older_than=_time.time() - 30 * 86400, max_sessions=100, keep={busy.id})
    assert gone == [old.id]
    assert store.get(old.id) is None and store.lookup(seed, old_msgs)[1] == 1  # only the shared prefix is left
    # ... and it belongs to a live session that saved the same document later (the last one to save it)
    assert store.lookup(seed, old_msgs)[0].id == recent.id
    assert store.lookup(seed, fork_msgs)[0].id == fork.id and store.lookup(seed, busy_msgs)[1] == 2
    # over the count limit the least recently used go first; a kept one does not count as removable
    assert store.prune(older_than=None, max_sessions=2, keep={busy.id}) == [fork.id]
    assert set(store.last_uses()) == {busy.id, recent.id}
    assert {r.id for r in store.sessions()} == {busy.id, recent.id}
    store.close()


async def test_a_resident_only_lease_never_displaces_another_session():
    """Issue #13 item 9: a background save of A waited for A's slot; when A lost it meanwhile, the save's lease
    evicted whoever held the slot next, only to save nothing."""
    t = SlotTable(1)
    a = await t.acquire("A")
    c_wait = asyncio.ensure_future(t.acquire("C"))  # queued first: takes the slot when A's request ends
    save_wait = asyncio.ensure_future(t.acquire("A", resident_only=True))
    await asyncio.sleep(0)
    t.release(a)
    c = await c_wait
    assert not c.resident and c.evicted.session == "A"
    assert await asyncio.wait_for(save_wait, 1) is None  # A is gone: nothing to save, nobody displaced
    t.release(c)
    assert t.resident("C") is t.slots[0] and t.queued == 0
    again = await t.acquire("C", resident_only=True)  # a resident session is leased as usual
    assert again is not None and again.resident


async def test_a_new_session_goes_to_the_slot_that_shares_its_opening_even_over_a_free_one():
    """A new session whose first messages (a shared system prompt) a resident session of the same owner opened
    with is placed on that slot, so llama-server reuses the prefix; without ``share``, a free slot first."""
    t = SlotTable(3)
    a = await t.acquire("a")
    a.slot.served_hashes, a.slot.owner = ["sys", "doc-a", "answer-a"], "-"
    t.release(a)
    b = await t.acquire("b")
    b.slot.served_hashes, b.slot.owner = ["other-sys", "doc-b"], "-"
    t.release(b)
    plain = await t.acquire("c")
    assert plain.slot.session == "c" and plain.evicted is None  # the free slot
    t.release(plain)
    plain.slot.session, plain.slot.served_hashes = None, []
    new = await t.acquire("d", share=(["sys", "doc-d"], "-"))
    assert new.slot is a.slot and new.evicted is not None and new.evicted.session == "a"
    t.release(new)
    other_owner = await t.acquire("e", share=(["other-sys", "doc-e"], "key-x"))
    assert other_owner.slot is not b.slot and other_owner.evicted is None  # never onto another owner's content
