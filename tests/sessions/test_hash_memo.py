"""The message-hash memo (``sessions/identity.py``, step 5): the same hash as serialising the message, a long
message sent again (a conversation's history, parsed anew each turn) is not serialised again, and the memo keeps
no more bytes than its bound (tests/sessions/test_memory_bounds.py: with hostile shapes)."""

from __future__ import annotations

import json
import random
import string

from pflash_proxy.sessions import identity
from pflash_proxy.sessions.identity import MEMO_MIN_CHARS, canonical_message, message_hash
from pflash_proxy.sessions.lru import ValueCache

LONG = "x" * MEMO_MIN_CHARS


def _messages(rng: random.Random) -> list[dict]:
    def text(n: int) -> str:
        return "".join(rng.choice(string.ascii_letters + " \n\"\\é\U0001f600") for _ in range(n))

    out: list[dict] = []
    for _ in range(60):
        n = rng.choice([10, MEMO_MIN_CHARS - 1, MEMO_MIN_CHARS, 3 * MEMO_MIN_CHARS])
        shape = rng.randrange(5)
        if shape == 0:
            out.append({"role": rng.choice(["user", "assistant", "system"]), "content": text(n)})
        elif shape == 1:
            out.append({"role": "user", "content": [{"type": "text", "text": text(n // 2)},
                                                    {"type": "text", "text": text(n // 2)},
                                                    {"type": "image_url", "image_url": {"url": "data:,x"}}]})
        elif shape == 2:
            args = {"path": text(n), "flag": rng.choice([True, 1, 1.0, None, "1"])}
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": json.dumps(args)}}]})
        elif shape == 3:
            out.append({"role": "tool", "tool_call_id": rng.choice(["c1", 1, None]), "name": "read",
                        "content": text(n)})
        else:
            out.append({"role": rng.choice([None, 1, True]), "content": {"odd": text(n)}})
    return out


def test_the_memo_gives_the_hash_of_the_serialised_message_and_keeps_json_types_apart():
    rng = random.Random(7)
    memo = ValueCache()
    messages = _messages(rng) + _messages(rng)
    for m in messages + json.loads(json.dumps(messages)):  # again, as a new request parses them
        assert message_hash(m, memo) == message_hash(m, None)
    assert len(memo) > 0
    # true, 1 and 1.0 are equal in Python and three different JSON texts: three hashes, in either order
    for order in ([True, 1, 1.0], [1.0, 1, True]):
        memo = ValueCache()
        hashes = [message_hash({"role": "assistant", "content": LONG, "tool_calls": [
            {"id": "c", "function": {"name": "f", "arguments": json.dumps({"flag": v})}}]}, memo) for v in order]
        assert len(set(hashes)) == 3


def test_every_canonical_field_is_part_of_the_memo_key():
    assert set(canonical_message({})) == {"role", "content", "tool_calls", "tool_call_id", "name"}
    memo = ValueCache()
    base = {"role": "tool", "content": LONG, "tool_call_id": "a", "name": "n",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}
    variants = [base, {**base, "role": "user"}, {**base, "content": LONG + "y"}, {**base, "tool_call_id": "b"},
                {**base, "name": "m"}, {**base, "tool_calls": []}, {**base, "content": [{"type": "text", "text": LONG}]}]
    hashes = [message_hash(v, memo) for v in variants]
    assert hashes == [message_hash(v, None) for v in variants]
    assert len(set(hashes[:-1])) == len(variants) - 1  # the last: a plain string is one text part
    assert hashes[-1] == hashes[0]


def test_a_long_message_sent_again_is_not_serialised_again(monkeypatch):
    body = json.dumps([{"role": "user", "content": LONG + "a"}, {"role": "user", "content": "short"}])
    calls = []
    dumps = json.dumps
    monkeypatch.setattr(identity.json, "dumps", lambda *a, **k: (calls.append(1), dumps(*a, **k))[1])
    memo = ValueCache()
    first = [message_hash(m, memo) for m in json.loads(body)]
    assert len(calls) == 2
    assert [message_hash(m, memo) for m in json.loads(body)] == first  # parsed anew: other string objects
    assert len(calls) == 3  # the short one only


def test_the_memo_keeps_no_more_bytes_than_its_bound():
    texts = [f"{i:04d}" + LONG for i in range(12)]
    one: ValueCache[str] = ValueCache()
    message_hash({"role": "user", "content": texts[0]}, one)
    entry = one.size  # the bytes of its key's objects, its digest and the entry's own
    assert entry > len(texts[0])
    memo = ValueCache(4 * entry + 10)
    for t in texts:
        message_hash({"role": "user", "content": t}, memo)
        message_hash({"role": "user", "content": texts[0]}, memo)  # the first stays in use
        assert memo.size <= memo.max_size
    assert len(memo) == 4
    assert memo.get(identity._memo_key(canonical_message({"role": "user", "content": texts[0]}), [0, 0])) is not None
    message_hash({"role": "user", "content": "y" * memo.max_size}, memo)  # over the bound: not kept
    assert len(memo) == 4


def test_arguments_nested_too_deep_to_freeze_are_hashed_as_before():
    for depth in (400, 900):  # 900: the frozen form is too deep for Python's recursion, json.dumps is not
        args = "[" * depth + "]" * depth
        m = {"role": "assistant", "content": LONG, "tool_calls": [{"id": "c", "function": {"name": "f",
                                                                                        "arguments": args}}]}
        assert message_hash(m, ValueCache()) == message_hash(m, None)
