"""Hostile JSON through the proxy in front of the real llama-server (gemma): no body gets a 5xx.

1. Issue 26 item 7, each case on its own: a non-string ``text`` in a ``/v1/messages`` or ``/v1/responses``
   content part, a message nested ~600 levels deep in each dialect, and a chat request followed by the same
   conversation as a Responses request. Each gets a 400 in the client's dialect (or, for the last, an answer).
2. Property-based (hypothesis): for each of ``/v1/chat/completions``, ``/v1/messages`` and ``/v1/responses``,
   bodies that are random JSON (objects over the dialects' own keys, values and roles) or mutations of valid
   requests (a value replaced by random JSON, removed, wrapped in a list, nested up to 1,200 levels, or the
   request streamed) are posted; every answer is below 500, and every error answer is in the route's dialect
   (Anthropic's ``{"type": "error", ...}`` on ``/v1/messages``, ``{"error": ...}`` elsewhere). Generation is
   capped at 2 tokens (``n_predict`` and the dialect's own limit are forced onto every object body). The bodies
   tried and the statuses seen are printed per dialect.
3. Tool calls and histories (hypothesis, every dialect): a valid conversation with a tool call whose arguments are
   generated hostile (nested up to 5,000 levels inside the string, lone surrogate escapes, up to 2 MB, random
   text) and/or a generated history before it (hundreds of turns, or one earlier message of up to 4 MB, over
   ``--max-prompt-tokens``). Every answer is below 500. ``PFLASH_FUZZ_EXAMPLES`` (default 40 per dialect) sets how
   many are tried; the ones of the issue's four 500s are also tried on their own (item 1).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

pytestmark = pytest.mark.llama

CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"
EXAMPLES = 150  # per dialect
TOOL_EXAMPLES = int(os.environ.get("PFLASH_FUZZ_EXAMPLES", "40"))  # per dialect (item 3)
FUZZ_LOG = os.environ.get("PFLASH_FUZZ_LOG")  # item 3: a file to append one line per body to


@pytest.fixture(scope="module")
def proxy_url(llama_server, tmp_path_factory):
    """The proxy on a real port, its event loop in a thread of its own, so hypothesis's synchronous examples
    talk to it over HTTP like any client."""
    from aiohttp import web

    from pflash_proxy.llama.spawn import free_port

    tmp = tmp_path_factory.mktemp("hostile")
    app = create_app(make_settings(llama_server.url, tmp, slot_save_path=llama_server.slot_dir, threshold=1000,
                                   prefill_curve="1000:0.45 4000:0.35", query_pin=32, max_prompt_tokens=3000))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(app)
    port = free_port()

    async def start():
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(120)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def post(base: str, path: str, raw: bytes, timeout: float = 120) -> tuple[int, bytes]:
    req = urllib.request.Request(base + path, data=raw, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def assert_dialect_error(path: str, status: int, raw: bytes) -> dict:
    body = json.loads(raw)
    if path == MESSAGES:
        assert body["type"] == "error" and isinstance(body["error"]["message"], str), (status, body)
    else:
        assert isinstance(body["error"]["message"], str), (status, body)
    return body


# 1. The cases of the issue ------------------------------------------------------------------------------------
BAD_TEXT = [
    (MESSAGES, {"model": "g", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    (MESSAGES, {"model": "g", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": {"a": 1}}]}]}]}),
    (MESSAGES, {"model": "g", "max_tokens": 2, "system": [{"type": "text", "text": ["x"]}],
                "messages": [{"role": "user", "content": "hi"}]}),
    (RESPONSES, {"model": "g", "max_output_tokens": 2, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": 5}]}]}),
    (RESPONSES, {"model": "g", "max_output_tokens": 2, "input": [
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": None}]}]}),
]


@pytest.mark.parametrize("path, body", BAD_TEXT, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BAD_TEXT)])
def test_non_string_text_is_a_400_in_the_clients_dialect(proxy_url, path, body):
    status, raw = post(proxy_url, path, json.dumps(body).encode())
    assert status == 400, raw
    assert "must be a string" in assert_dialect_error(path, status, raw).__repr__()


DEEP = {CHAT: '{"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, '
              '{"type": "image_url", "deep": %s}]}]}',
        MESSAGES: '{"model": "g", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", '
                  '"text": "hi"}, {"type": "document", "deep": %s}]}]}',
        RESPONSES: '{"model": "g", "max_output_tokens": 2, "input": [{"role": "user", "content": "hi"}, '
                   '{"type": "reasoning", "deep": %s}]}'}


@pytest.mark.parametrize("depth", [490, 600, 5000])
@pytest.mark.parametrize("path", [CHAT, MESSAGES, RESPONSES])
def test_a_message_nested_hundreds_deep_is_a_400(proxy_url, path, depth):
    raw = (DEEP[path] % ("[" * depth + "0" + "]" * depth)).encode()
    status, answer = post(proxy_url, path, raw)
    assert status == 400, answer
    assert "nested" in assert_dialect_error(path, status, answer)["error"]["message"]


def test_a_chat_conversation_then_the_same_as_a_responses_request(proxy_url):
    """The Responses request continues the session the chat request started: it is answered, never a 5xx."""
    system, question = "Be brief.", "Name one colour."
    status, raw = post(proxy_url, CHAT, json.dumps({"max_tokens": 2, "temperature": 0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]}).encode())
    assert status == 200, raw
    reply = json.loads(raw)["choices"][0]["message"]["content"] or "ok"
    for body in ({"model": "g", "max_output_tokens": 2, "temperature": 0, "instructions": system,
                  "input": [{"role": "user", "content": question}]},
                 {"model": "g", "max_output_tokens": 2, "temperature": 0, "instructions": system,
                  "input": [{"role": "user", "content": [{"type": "input_text", "text": question}]},
                            {"type": "message", "role": "assistant",
                             "content": [{"type": "output_text", "text": reply}]},
                            {"role": "user", "content": "Another?"}]}):
        status, raw = post(proxy_url, RESPONSES, json.dumps(body).encode())
        assert status == 200, raw


def test_a_chat_tool_call_then_the_same_conversation_as_responses_items(proxy_url):
    """The chat client's tool call has ``content: []``, the Responses ``function_call`` none: one identity, so the
    Responses request is served the chat's history; its text is the same, nothing is written back (was a 500)."""
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    chat = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": [], "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "shell", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py b.py"}]
    status, raw = post(proxy_url, CHAT, json.dumps({"max_tokens": 2, "n_predict": 2, "messages": chat,
                                                    "tools": tools}).encode())
    assert status == 200, raw
    items = [{"role": "user", "content": "List the files."},
             {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "a.py b.py"}]
    status, raw = post(proxy_url, RESPONSES, json.dumps({
        "model": "g", "max_output_tokens": 2, "n_predict": 2, "instructions": "You run commands.", "input": items,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]}).encode())
    assert status == 200, raw


# 2. Property-based --------------------------------------------------------------------------------------------
KEYS = ["model", "messages", "role", "content", "type", "text", "system", "tools", "tool_choice", "input",
        "instructions", "output", "call_id", "name", "arguments", "function", "tool_calls", "tool_call_id",
        "tool_use_id", "input_schema", "parameters", "stream", "thinking", "budget_tokens", "output_config",
        "effort", "metadata", "user_id", "previous_response_id", "prompt_cache_key", "id_slot", "image_url",
        "url", "source", "data", "media_type", "cache_control", "stop_sequences", "stop", "temperature",
        "stream_options", "include_usage", "chat_template_kwargs", "context_management", "is_error", "id"]
WORDS = ["text", "input_text", "output_text", "tool_use", "tool_result", "image", "thinking", "function_call",
         "function_call_output", "message", "reasoning", "image_url", "function", "user", "assistant", "system",
         "tool", "developer", "enabled", "adaptive", "disabled", "auto", "any", "none", "high",
         "x-anthropic-billing-header: cch=1;", "é", ""]

leaves = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | st.sampled_from(WORDS))
json_values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5),
                           max_leaves=16)

VALID = {
    CHAT: [
        {"model": "g", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Read a.py"}]},
                      {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                          "name": "read", "arguments": "{\"p\": \"a.py\"}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "def f():\n    return 1\n"},
                      {"role": "user", "content": "What does f return?"}],
         "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]},
    ],
    MESSAGES: [
        {"model": "g", "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]},
        {"model": "g", "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=abc12;"},
                                  {"type": "text", "text": "You are a coding agent.",
                                   "cache_control": {"type": "ephemeral"}}],
         "metadata": {"user_id": "u1"}, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
         "tools": [{"name": "Read", "description": "read", "input_schema": {"type": "object"}}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "Read a.py"}]},
                      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                                                        {"type": "tool_use", "id": "t1", "name": "Read",
                                                         "input": {"p": "a.py"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                    "content": [{"type": "text", "text": "def f(): return 1"}]},
                                                   {"type": "text", "text": "What does f return?"}]}]},
    ],
    RESPONSES: [
        {"model": "g", "instructions": "Be brief.", "input": "hi"},
        {"model": "g", "prompt_cache_key": "k1", "instructions": "You are Codex.",
         "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
         "input": [{"role": "user", "content": [{"type": "input_text", "text": "cat a.py"}]},
                   {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "c1", "output": "def f(): return 1"},
                   {"type": "reasoning", "id": "r1", "summary": []},
                   {"role": "user", "content": "What does f return?"}]},
    ],
}
CAP = {CHAT: "max_tokens", MESSAGES: "max_tokens", RESPONSES: "max_output_tokens"}
DEEP_MARK = "\x00deep:"


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _set(value, path, new, delete=False):
    if not path:
        return new
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return value


@st.composite
def bodies(draw, path: str) -> bytes:
    """A body for ``path``: random JSON, or a valid request with a few mutations; raw bytes (deep nesting is
    spliced in as text: the encoder would recurse)."""
    kind = draw(st.sampled_from(["random", "mutated", "mutated", "mutated", "mutated", "mutated"]))
    if kind == "random":  # mostly objects over the dialects' keys, sometimes any JSON at all
        body = draw(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6) if draw(st.booleans())
                    else st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6) | json_values)
    else:
        body = json.loads(json.dumps(draw(st.sampled_from(VALID[path]))))
        for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
            where = draw(st.sampled_from(list(_paths(body))[1:] or [()]))  # the root only when nothing else
            op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "wrap", "deep", "stream"]))
            if op == "replace" or (op == "delete" and not where):
                body = _set(body, where, draw(json_values))
            elif op == "delete":
                body = _set(body, where, None, delete=True)
            elif op == "wrap":
                body = _set(body, where, [_get(body, where)])
            elif op == "deep":
                body = _set(body, where, DEEP_MARK + str(draw(st.sampled_from([50, 99, 101, 490, 600, 1200]))))
            elif isinstance(body, dict):
                body["stream"] = True
    if isinstance(body, dict):  # generation stays cheap: 2 tokens whatever the mutation did
        body["n_predict"] = 2
        body[CAP[path]] = 2
    raw = json.dumps(body)
    while '"\\u0000deep:' in raw:
        head, rest = raw.split('"\\u0000deep:', 1)
        n, tail = rest.split('"', 1)
        raw = head + "[" * int(n) + "0" + "]" * int(n) + tail
    return raw.encode()


def _get(value, path):
    for key in path:
        value = value[key]
    return value


SEEN: dict[str, collections.Counter] = {}


@pytest.mark.parametrize("path", [CHAT, MESSAGES, RESPONSES])
def test_generated_bodies_never_get_a_5xx(proxy_url, path):
    seen = SEEN.setdefault(path, collections.Counter())

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(raw=bodies(path))
    def check(raw: bytes) -> None:
        status, answer = post(proxy_url, path, raw)
        seen[status] += 1
        assert status < 500, (status, raw[:300], answer[:500])
        if status >= 400:
            assert_dialect_error(path, status, answer)
        else:  # a stream's error event would hide a 5xx behind the 200
            assert b"server_error" not in answer and b'"api_error"' not in answer, (raw[:300], answer[:500])

    check()
    print(f"\n{path}: {sum(seen.values())} bodies, statuses {dict(sorted(seen.items()))}")



# 1b. The tool-call arguments, each on its own ---------------------------------------------------------
ARGUMENTS = {"surrogate": '{"path": "\\ud800"}', "deep": "[" * 1000 + "]" * 1000}


def with_arguments(path: str, arguments: str) -> dict:
    if path == CHAT:
        return {"max_tokens": 2, "messages": [
            {"role": "user", "content": "Read a.py"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "read", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x = 1"}, {"role": "user", "content": "And?"}]}
    return {"model": "g", "max_output_tokens": 2, "input": [
        {"role": "user", "content": "Read a.py"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "x = 1"}, {"role": "user", "content": "And?"}]}


@pytest.mark.parametrize("kind", list(ARGUMENTS))
@pytest.mark.parametrize("path", [CHAT, RESPONSES])
def test_tool_call_arguments_that_failed_in_hashing_are_a_400(proxy_url, path, kind):
    status, raw = post(proxy_url, path, json.dumps(with_arguments(path, ARGUMENTS[kind])).encode())
    assert status == 400, raw[:300]
    assert "arguments" in assert_dialect_error(path, status, raw)["error"]["message"]


# 3. Tool calls and histories, generated -----------------------------------------------------------------------
hostile_arguments = st.one_of(
    st.sampled_from([1, 99, 100, 101, 500, 999, 1000, 1200, 5000]).map(lambda n: "[" * n + "]" * n),
    st.sampled_from([1, 101, 1500]).map(lambda n: '{"a": ' * n + "1" + "}" * n),
    st.lists(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\u0000", "é", "x", '\\"', "\\\\"]),
             min_size=1, max_size=8).map(lambda parts: '{"p": "%s"}' % "".join(parts)),
    st.sampled_from([1000, 100_000, 2_000_000]).map(lambda n: '{"text": "%s"}' % ("y" * n)),
    st.text(max_size=40),
    st.sampled_from(["{}", "", "null", "[", '{"a":', "\\ud800"]))


def hostile_input(arguments: str) -> object:
    """An Anthropic tool_use ``input`` (an object, not a string) from the generated arguments."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {"raw": arguments}
    return value if isinstance(value, dict) else {"v": value}


@st.composite
def tool_bodies(draw, path: str) -> bytes:
    arguments = draw(hostile_arguments)
    history_kind = draw(st.sampled_from(["none", "none", "turns", "one-long"]))
    history: list[dict] = []
    if history_kind == "turns":
        n = draw(st.sampled_from([10, 200, 2000]))
        size = draw(st.sampled_from([10, 200, 2000]))
        for i in range(n):
            history += [{"role": "user", "content": f"q{i} " + "w" * size}, {"role": "assistant", "content": f"a{i}"}]
    elif history_kind == "one-long":
        size = draw(st.sampled_from([20_000, 500_000, 4_000_000]))
        history = [{"role": "user", "content": "z " * (size // 2)}, {"role": "assistant", "content": "ok"}]
    if path == MESSAGES:
        deep = draw(st.sampled_from([0, 0, 50, 101, 1200]))
        tool_input = DEEP_MARK + str(deep) if deep else hostile_input(arguments)
        msgs = history + [{"role": "user", "content": "Read a.py"},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read",
                                                             "input": tool_input}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                        "content": arguments[:1000]},
                                                       {"type": "text", "text": "And?"}]}]
        body = {"model": "g", "max_tokens": 2, "messages": msgs,
                "tools": [{"name": "read", "input_schema": {"type": "object"}}]}
    else:
        body = with_arguments(path, arguments)
        key = "messages" if path == CHAT else "input"
        body[key] = history + body[key]
    body["n_predict"] = 2
    if draw(st.booleans()):
        body["stream"] = True
    raw = json.dumps(body)
    while '"\\u0000deep:' in raw:
        head, rest = raw.split('"\\u0000deep:', 1)
        n, tail = rest.split('"', 1)
        raw = head + "[" * int(n) + "0" + "]" * int(n) + tail
    return raw.encode()


@pytest.mark.timeout(max(300, 15 * TOOL_EXAMPLES))  # an answered body takes seconds on two shared cores
@pytest.mark.parametrize("path", [CHAT, MESSAGES, RESPONSES])
def test_generated_tool_calls_and_histories_never_get_a_5xx(proxy_url, path):
    seen: collections.Counter = collections.Counter()

    @settings(max_examples=TOOL_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(raw=tool_bodies(path))
    def check(raw: bytes) -> None:
        t0 = time.monotonic()
        status, answer = post(proxy_url, path, raw, timeout=300)
        seen[status] += 1
        if FUZZ_LOG:  # one line per body: status, size, seconds
            with open(FUZZ_LOG, "a") as log:
                log.write(f"{path} {status} {len(raw):>9} B {time.monotonic() - t0:6.2f} s {raw[:160]!r}\n")
        assert status < 500, (status, raw[:300], answer[:500])
        if status >= 400:
            assert_dialect_error(path, status, answer)
        else:
            assert b"server_error" not in answer and b'"api_error"' not in answer, (raw[:300], answer[:500])

    check()
    print(f"\n{path} tool calls and histories: {sum(seen.values())} bodies, statuses {dict(sorted(seen.items()))}")
