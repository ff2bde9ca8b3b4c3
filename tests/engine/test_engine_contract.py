"""The ``Engine`` / ``Slots`` contract (``pflash_proxy.engine``), run against every engine the proxy has: the real
llama-server (``LlamaServerEngine``, a server of its own for this module, gemma-3-270m, 2 slots) and the in-process
``FakeEngine``. A fake that passes the same tests fits wherever the real engine does."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pflash_proxy.compress.text import split_lines
from pflash_proxy.engine import Engine, EngineNotReady, EngineRefused, Slots, counts_per_line
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.llama.engine import LlamaServerEngine
from pflash_proxy.llama.upstream import Upstream
from tests.conftest import start_llama_server

TEXT = "naïve café — ünïcode 😀 tokens\n    indented line two\n\nthree: {\"k\": [1, 2]}\n"


@dataclass
class Harness:
    engine: Engine
    complete: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    set_ready: Callable[[bool, str], None]
    watch_epochs: Callable[[], Awaitable[None]]  # until the engine can vouch for an epoch

    @property
    def slots(self) -> Slots:
        assert self.engine.slots is not None
        return self.engine.slots


@pytest.fixture(scope="module")
def engine_server(gemma_model, tmp_path_factory):
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("engine-llama"))
    yield server
    server.stop()


@pytest.fixture(params=[pytest.param("llama-server", marks=pytest.mark.llama), "fake"])
async def harness(request) -> AsyncIterator[Harness]:
    if request.param == "fake":
        fake = FakeEngine(n_slots=2)

        async def watch() -> None:
            fake.start_watching()
        yield Harness(fake, fake.complete, fake.set_ready, watch)
        return
    server = request.getfixturevalue("engine_server")
    upstream = Upstream(server.url)
    await upstream.start()

    async def complete(body: dict[str, Any]) -> dict[str, Any]:
        status, data = await upstream.call("POST", "/v1/chat/completions", body)
        assert status == 200, data
        return data

    engine = LlamaServerEngine(upstream)

    async def watch_epochs() -> None:
        engine.start_watching()
        for _ in range(100):
            if upstream.sentinel.current() is not None:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the sentinel never held a connection")

    def set_ready(ready: bool, reason: str) -> None:
        upstream.wait_s = 0
        upstream.set_ready(ready, reason)
    try:
        yield Harness(engine, complete, set_ready, watch_epochs)
    finally:
        await upstream.close()


def chat(words: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": words}], "max_tokens": 1, "temperature": 0}


def unique(n: int = 40) -> str:
    """A message no other test sent: ``n`` words starting with a fresh one."""
    return " ".join([uuid.uuid4().hex[:8]] + [f"word{i}" for i in range(n)])


async def test_a_text_is_counted_and_the_special_tokens_on_request(harness):
    e = harness.engine
    short, long = await e.count_text("one two three"), await e.count_text("one two three four five six seven")
    assert 0 < short < long
    assert await e.count_text("one two three", add_special=True) == short + 1  # the BOS token


async def test_the_pieces_join_to_the_text_and_count_per_line(harness):
    e = harness.engine
    pieces = await e.pieces(TEXT)
    assert b"".join(p.text for p in pieces) == TEXT.encode("utf-8")
    assert len(pieces) == await e.count_text(TEXT)
    lines = split_lines(TEXT)
    per_line = counts_per_line(lines, pieces)
    assert sum(per_line) == len(pieces) and len(per_line) == len(lines)
    assert all(n > 0 for n, line in zip(per_line, lines) if line.strip())


async def test_a_prompt_is_counted_with_its_template(harness):
    e = harness.engine
    text = "Hello there, how are you today?"
    one = await e.count_prompt(chat(text))
    assert one > await e.count_text(text)  # the role markers and BOS around the message
    assert await e.count_prompt(chat(text + " And tomorrow, and the day after that?")) > one
    with pytest.raises(EngineRefused) as err:
        await e.count_prompt({"messages": "not a list"})
    assert 400 <= err.value.engine_status < 600 and err.value.status == 502


async def test_a_repeated_turn_reports_its_prompt_from_the_cache(harness):
    e, body = harness.engine, harness.slots.pin(chat(unique()), 1)
    first = e.cache_report(await harness.complete(body))
    assert first is not None and first.prompt_tokens == await e.count_prompt(body)
    assert first.new_tokens > 20  # a prompt nobody sent before: evaluated, not taken from the cache
    second = e.cache_report(await harness.complete(body))
    assert second is not None and second.prompt_tokens == first.prompt_tokens
    assert second.cached_tokens >= first.prompt_tokens - 2 and second.new_tokens <= 2
    assert e.cache_report(None) is None and e.cache_report({"choices": []}) is None


async def test_the_model_is_described_with_a_stable_identity(harness):
    a, b = await harness.engine.describe(), await harness.engine.describe(wait=False)
    assert a.n_slots == 2 and a.identity == b.identity and len(a.identity) == 16
    int(a.identity, 16)
    assert a.n_ctx is not None and a.n_ctx > 0


async def test_slots_are_pinned_and_unpinned():
    for slots in (FakeEngine().slots, LlamaServerEngine(Upstream("http://127.0.0.1:9")).slots):
        pinned = slots.pin({"messages": []}, 1)
        assert pinned == {"messages": [], **slots.pin_fields(1)} and slots.pin_fields(1) != slots.pin_fields(0)
        assert slots.unpin(pinned) == {"messages": []}


async def test_a_slot_is_saved_erased_and_restored(harness):
    e, slots = harness.engine, harness.slots
    body_a = slots.pin(chat(unique()), 0)
    a = e.cache_report(await harness.complete(body_a))
    assert a is not None
    states = await slots.states()
    assert states is not None and [s.id for s in states] == [0, 1] and not any(s.busy for s in states)
    assert states[0].task is not None and states[0].prompt_tokens == a.prompt_tokens
    name = f"contract-{uuid.uuid4().hex}.bin"
    saved = await slots.save(0, name)
    assert saved >= a.prompt_tokens

    await slots.erase(0)
    again = e.cache_report(await harness.complete(body_a))
    assert again is not None and again.cached_tokens == 0  # the erase emptied it

    e.cache_report(await harness.complete(slots.pin(chat(unique()), 0)))  # another prompt displaces it
    assert await slots.restore(0, name) == saved
    back = e.cache_report(await harness.complete(body_a))
    assert back is not None and back.cached_tokens >= a.prompt_tokens - 2


async def test_slot_actions_the_engine_refuses(harness):
    slots = harness.slots
    assert await slots.can_save() is True
    with pytest.raises(EngineRefused) as bad_name:
        await slots.save(0, "../outside.bin")
    assert bad_name.value.engine_status == 400
    with pytest.raises(EngineRefused):
        await slots.restore(1, f"missing-{uuid.uuid4().hex}.bin")


async def test_an_engine_that_is_not_ready_says_so(harness):
    e = harness.engine
    harness.set_ready(False, "testing readiness")
    try:
        assert e.not_ready_reason == "testing readiness"
        with pytest.raises(EngineNotReady):
            await e.count_text("hello")
        with pytest.raises(EngineNotReady):
            await e.wait_ready(0.05)
    finally:
        harness.set_ready(True, "")
    assert e.not_ready_reason is None and await e.count_text("hello") > 0
    await e.wait_ready(0.05)
    assert await e.healthy()


async def test_a_restart_tells_the_listeners_and_ends_the_epoch(harness):
    e = harness.engine
    await harness.watch_epochs()
    heard: list[str] = []
    e.on_restart(heard.append)
    before = e.epoch()
    assert before is not None and e.vouches(before)
    e.note_restart("a check found the slots empty")
    assert heard == ["a check found the slots empty"]
    assert not e.vouches(before) and not e.vouches(None)
    e.stop_watching()
    assert e.epoch() is None and not e.vouches(e.epoch())
    assert isinstance(e.stats().as_json(), dict) and e.address


async def test_the_answer_that_carries_the_report_is_marked(harness):
    raw = json.dumps(await harness.complete(chat(unique(5)))).encode()
    assert any(m in raw for m in harness.engine.report_markers)
    assert not any(m in b'{"choices": [{"delta": {"content": "x"}}]}' for m in harness.engine.report_markers)


async def test_an_engine_that_is_there_is_reachable_and_says_what_it_cannot_show(harness):
    e = harness.engine
    assert await e.reachable(5)
    warning = await e.setup_warning("/the/save/dir")
    assert warning is None or (isinstance(warning, str) and warning)  # one line for the log, or nothing
