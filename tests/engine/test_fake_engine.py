"""``FakeEngine``'s fault injection and the server behaviour it copies, beyond the shared contract
(``test_engine_contract.py``)."""

from __future__ import annotations

import pytest

from pflash_proxy.engine import Engine, EngineNotReady, EngineRefused, EngineUnreachable, Slots
from pflash_proxy.engine.fake import FakeEngine, words
from pflash_proxy.llama.engine import LlamaServerEngine
from pflash_proxy.llama.upstream import Upstream


def test_both_engines_implement_the_protocols():
    for engine in (FakeEngine(), LlamaServerEngine(Upstream("http://127.0.0.1:9"))):
        assert isinstance(engine, Engine) and isinstance(engine.slots, Slots)


def test_the_whitespace_tokens_join_to_the_text():
    for text in ("", "one", "  lead and trail  ", "a\n\nb\tc", "\n"):
        assert "".join(words(text)) == text
    assert words("  two words ") == ["  ", "two ", "words "]


async def test_an_injected_fault_is_raised_as_often_as_asked():
    fake = FakeEngine()
    fake.fail("count_text", EngineUnreachable("down"), times=2)
    for _ in range(2):
        with pytest.raises(EngineUnreachable):
            await fake.count_text("x")
    assert await fake.count_text("x y") == 2 and fake.calls["count_text"] == 3
    fake.fail("healthy", EngineUnreachable("down"))
    assert not await fake.healthy() and await fake.healthy()


async def test_a_restart_empties_every_slot():
    fake = FakeEngine()
    body = fake.slots.pin({"messages": [{"role": "user", "content": "a b c d"}]}, 1)
    await fake.complete(body)
    fake.restart("test")
    states = await fake.slots.states()
    assert states is not None and all(s.task is None and s.prompt_tokens is None for s in states)
    report = fake.cache_report(await fake.complete(body))
    assert report is not None and report.cached_tokens == 0


async def test_a_failed_restore_leaves_the_slot_empty_and_saving_can_be_off():
    fake = FakeEngine(n_ctx=8)
    body = {"messages": [{"role": "user", "content": "a b"}]}
    await fake.complete(body)
    fake.n_ctx = 2  # the file no longer fits the slot
    await fake.slots.save(0, "s.bin")
    with pytest.raises(EngineRefused):
        await fake.slots.restore(0, "s.bin")
    assert fake.slots.slots[0].tokens == []
    fake.slots.saving = False
    assert await fake.slots.can_save() is False
    with pytest.raises(EngineRefused) as off:
        await fake.slots.save(0, "t.bin")
    assert off.value.engine_status == 501


async def test_busy_slots_and_an_engine_that_reports_none():
    fake = FakeEngine()
    fake.slots.busy.add(1)
    states = await fake.slots.states()
    assert states is not None and [s.busy for s in states] == [False, True]
    fake.slots.report_states = False
    assert await fake.slots.states() is None


async def test_a_request_waits_for_a_starting_engine_up_to_its_wait():
    import asyncio

    fake = FakeEngine(wait_s=1.0)
    fake.set_ready(False, "loading")
    asyncio.get_running_loop().call_later(0.05, fake.set_ready, True)
    assert await fake.count_text("a b") == 2  # waited, then served
    fake.wait_s = 0.01
    fake.set_ready(False, "loading")
    with pytest.raises(EngineNotReady):
        await fake.count_text("a b")


async def test_slot_files_in_a_save_directory_restore_what_was_saved(tmp_path):
    fake = FakeEngine(save_dir=tmp_path)
    body = fake.slots.pin({"messages": [{"role": "user", "content": "a b\nc \\n d"}]}, 1)
    await fake.complete(body)
    held = list(fake.slots.slots[1].tokens)
    assert await fake.slots.save(1, "one.bin") == len(held) and (tmp_path / "one.bin").is_file()
    (tmp_path / "one.bin").rename(tmp_path / "two.bin")  # a proxy renames its files: the name is what counts
    await fake.slots.erase(1)
    assert await fake.slots.restore(0, "two.bin") == len(held) and fake.slots.slots[0].tokens == held
    (tmp_path / "bad.bin").write_text("not json")
    with pytest.raises(EngineRefused):
        await fake.slots.restore(0, "bad.bin")
    assert fake.slots.files == {}  # nothing kept in memory


async def test_an_engine_whose_probe_fails_is_not_reachable():
    fake = FakeEngine()
    assert await fake.reachable(1) and await fake.setup_warning("/x") is None
    fake.fail("healthy", EngineUnreachable("down"))
    assert not await fake.reachable(1)
