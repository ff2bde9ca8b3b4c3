"""Every in-memory cache of the session layer is bounded by the bytes it keeps alive, however the client's JSON is
typed: the message-hash memo (``identity.MEMO``), the served-message and recall caches (``codec.RecordParts``),
the embedded index's decoded records (``SqliteIndex._decodes``).

The hostile shapes are the ones a client can send for free: tool-call arguments of numbers (a float is 24 bytes
in Python for its 4 bytes of JSON, and counted zero by a bound on characters), deep nesting, and many small items.
Each test measures what the cache keeps alive with ``tracemalloc`` after the request's own objects are gone, and
checks it against the cache's bound."""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from collections.abc import Callable

import pytest

from pflash_proxy.sessions.identity import MEMO_MIN_CHARS, message_hash
from pflash_proxy.sessions.index import SessionRecord
from pflash_proxy.sessions.lru import ENTRY_BYTES, ValueCache, footprint
from pflash_proxy.sessions.index.codec import RecordParts
from pflash_proxy.sessions.index.sqlite import SqliteIndex

TEXT = "lorem ipsum dolor sit amet " * (MEMO_MIN_CHARS // 20)  # enough characters to be memoised


def _numbers(rng: random.Random, n: int) -> object:
    return {"values": [rng.random() * 1000 for _ in range(n)], "ids": [rng.randrange(10**9) for _ in range(n)]}


def _nested(rng: random.Random, n: int) -> object:
    """``n`` levels in all: chains of lists and objects 100 deep (within what ``json`` itself serialises)."""
    chains = []
    for _ in range(max(1, n // 100)):
        out: object = [rng.random()]
        for i in range(100):
            out = {"k": out, "n": i} if i % 2 else [out, i]
        chains.append(out)
    return chains


def _small_items(rng: random.Random, n: int) -> object:
    return [{"a": rng.randrange(10**6), "b": [True, None], "c": {}} for _ in range(n)]


SHAPES: dict[str, Callable[[random.Random, int], object]] = {"numbers": _numbers, "nested": _nested,
                                                             "small items": _small_items}


def _tool_message(args: object) -> dict[str, object]:
    """An assistant turn whose tool call carries ``args`` (as clients send them: a JSON string), with enough text
    to be memoised."""
    return {"role": "assistant", "content": TEXT, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}]}


def _held(fill: Callable[[int], None], rounds: int) -> int:
    """Bytes still allocated after ``fill(i)`` ran for each round (each builds its own objects and drops them)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(rounds):
            fill(i)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape", SHAPES)
def test_footprint_counts_at_least_what_a_parsed_value_takes(shape):
    rng = random.Random(1)
    text = json.dumps(SHAPES[shape](rng, 3000))
    kept: list[object] = [None]
    # the least of three: tracemalloc also counts what other threads allocate meanwhile (the suite leaves some)
    sizes = []
    for _ in range(3):
        kept[0] = None
        sizes.append(_held(lambda i: kept.__setitem__(0, json.loads(text)), 1))
    held = min(sizes)
    assert footprint(kept[0]) >= held > 0
    assert footprint(kept[0]) <= 3 * held  # conservative, not wildly so


def test_footprint_measures_any_depth_and_ends_on_cycles():
    deep: list[object] = []
    node = deep
    for _ in range(100_000):  # deeper than any recursion reaches
        node.append([])
        node = node[0]  # type: ignore[assignment]
    assert footprint(deep) >= 100_000 * 56
    loop: list[object] = []
    loop.append(loop)
    assert footprint(loop) > 0


@pytest.mark.parametrize("shape", SHAPES)
def test_the_hash_memo_keeps_no_more_bytes_than_its_bound(shape):
    """Twelve requests of hostile arguments (fresh objects each, as each request parses its body): the memo's
    count stays within its bound and what it keeps alive is no more than it counts. On 19528cf the memo counted
    the text alone (~300 characters an entry) and kept every request's numbers alive: several MB each."""
    rng = random.Random(2)
    n = {"numbers": 600, "nested": 600, "small items": 100}[shape]  # ~60 KB each in memory
    bodies = [json.dumps(_tool_message(SHAPES[shape](rng, n))) for _ in range(12)]
    memo: ValueCache[str] = ValueCache(256 << 10)  # a few of them

    def request(i: int) -> None:
        m = json.loads(bodies[i])
        assert message_hash(m, memo) == message_hash(m, None)

    held = _held(request, len(bodies))
    assert memo.size <= memo.max_size
    assert len(memo) >= 1  # hostile messages are still memoised while they fit
    assert held <= memo.max_size + 64 * 1024, f"the memo keeps {held} bytes alive, its bound is {memo.max_size}"
    assert held <= memo.size + 64 * 1024  # it counts what it holds


def test_the_hash_memo_counts_each_entry_at_least_as_its_objects_take():
    """One entry's count against the memory the entry keeps alive (measured): numbers, nesting, small items."""
    rng = random.Random(3)
    for shape, make in SHAPES.items():
        body = json.dumps(_tool_message(make(rng, 1000)))
        memo: ValueCache[str] = ValueCache(64 << 20)

        def request(i: int, body: str = body, memo: ValueCache[str] = memo) -> None:
            message_hash(json.loads(body), memo)

        held = _held(request, 1)
        assert len(memo) == 1
        # the memo's own table (allocated with its first entry) aside
        assert memo.size + 1024 >= held, f"{shape}: counted {memo.size}, holds {held}"


@pytest.mark.parametrize("shape", SHAPES)
def test_the_served_message_cache_keeps_no_more_bytes_than_its_bound(shape):
    """Records saved with hostile served messages (tool calls of numbers, nesting, small items): the served-message
    cache stays within its bound in memory, not only in stored JSON bytes."""
    rng = random.Random(4)
    bodies = [json.dumps(_tool_message(SHAPES[shape](rng, 2000))) for _ in range(40)]
    parts = RecordParts(served_bytes=1 << 20, recall_bytes=1 << 20)

    def save(i: int) -> None:
        rec = SessionRecord.new("seed", False)
        rec.served = [json.loads(bodies[i])]
        parts.committed(parts.new(rec))

    held = _held(save, len(bodies))
    assert parts.served.size <= parts.served.max_size
    assert held <= parts.served.max_size + 64 * 1024, f"the cache keeps {held} bytes alive"


def test_the_served_message_cache_counts_messages_read_back_as_they_take(tmp_path):
    """A message read back from the index (``load_served``) is counted by what its decoded objects take."""
    store = SqliteIndex(tmp_path / "idx")
    try:
        rng = random.Random(5)
        rec = store.new_session("seed", False)
        msgs = [json.loads(json.dumps(_tool_message(_numbers(rng, 3000))))]
        store.save_session(rec, ["h1"], msgs)
        store.parts.served.discard([f"{rec.id}:0"])
        assert store.get(rec.id) is not None  # read back from SQLite, into the cache
        assert len(store.parts.served) == 1
        assert store.parts.served.size >= footprint(msgs[0])
    finally:
        store.close()


def test_the_decoded_records_are_bounded_by_bytes(tmp_path):
    """Sessions with long histories (many small messages: a record lists every message's hash): the records the
    embedded index keeps decoded stay within their byte bound."""
    store = SqliteIndex(tmp_path / "idx")
    store._decodes = ValueCache(512 << 10, 1024)
    try:
        for s in range(12):
            rec = store.new_session("seed", False)
            hashes = [f"{s:04d}{i:060d}" for i in range(1000)]
            store.save_session(rec, hashes, [{"role": "user", "content": str(i)} for i in range(1000)])
        assert store._decodes.size <= 512 << 10
        assert 1 <= len(store._decodes) < 12
    finally:
        store.close()


def test_entry_bytes_are_counted():
    cache: ValueCache[int] = ValueCache(10 * ENTRY_BYTES)
    for i in range(20):
        cache.put(i, i, 0)
    assert len(cache) == 10 and cache.size == 10 * ENTRY_BYTES
