"""The dialect translations without sockets: parse → write back, volatile lines, the Anthropic wire."""

from __future__ import annotations

import json

import pytest

from pflash_proxy.dialects import MAX_DEPTH, cap_turn
from pflash_proxy.dialects.anthropic import AnthropicDialect
from pflash_proxy.dialects.anthropic_wire import AnthropicTranslator, to_chat
from pflash_proxy.dialects.chat import ChatDialect
from pflash_proxy.dialects.responses import ResponsesDialect
from pflash_proxy.engine import CacheReport
from pflash_proxy.errors import BadRequest
from pflash_proxy.llama.engine import cache_report
from pflash_proxy.sessions.identity import message_hash

CLAUDE = {
    "model": "claude", "max_tokens": 64,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0.1; cc_entrypoint=cli; cch=a1b2c;"},
               {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "Read a.py"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                          {"type": "text", "text": "Reading."},
                                          {"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "a.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "LONG FILE"},
                                     {"type": "text", "text": "<reminder>", "cache_control": {"type": "ephemeral"}},
                                     {"type": "text", "text": "more"}]}]}


def test_anthropic_blocks_become_the_internal_conversation():
    d = AnthropicDialect()
    conv = d.parse(d.prepare(CLAUDE, True))
    roles = [m["role"] for m in conv.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert conv.messages[3] == {"role": "tool", "tool_call_id": "t1", "content": "LONG FILE"}
    assert conv.messages[2]["tool_calls"][0]["function"] == {"name": "Read", "arguments": '{"p": "a.py"}'}


def test_cache_control_markers_do_not_change_identity():
    d = AnthropicDialect()
    moved = json.loads(json.dumps(CLAUDE))
    del moved["messages"][2]["content"][1]["cache_control"]
    moved["messages"][0]["content"] = [{"type": "text", "text": "Read a.py", "cache_control": {"type": "ephemeral"}}]
    a = [message_hash(m) for m in d.parse(CLAUDE).messages]
    b = [message_hash(m) for m in d.parse(moved).messages]
    assert a == b


def test_write_back_changes_only_the_rewritten_text():
    d = AnthropicDialect()
    body = d.prepare(CLAUDE, True)
    conv = d.parse(body)
    new = [dict(m) for m in conv.messages]
    new[3]["content"] = "SHORT"
    new[4]["content"] = [{"type": "text", "text": "RECALL\n\n<reminder>more"}]
    out = d.write_back(body, conv, new)
    blocks = out["messages"][2]["content"]
    assert blocks[0] == {"type": "tool_result", "tool_use_id": "t1", "content": "SHORT"}
    # the group's first text block gets the text (its marker stays), the group's other text block goes
    assert blocks[1:] == [{"type": "text", "text": "RECALL\n\n<reminder>more", "cache_control": {"type": "ephemeral"}}]
    assert out["messages"][:2] == body["messages"][:2] and out["system"] == body["system"]
    assert body["messages"][2]["content"][0]["content"] == "LONG FILE"  # the client's body is not mutated
    with pytest.raises(ValueError):
        d.write_back(body, conv, new[:-1])


def test_only_the_billing_line_is_dropped():
    d = AnthropicDialect()
    out = d.prepare(CLAUDE, True)
    assert out["system"] == [CLAUDE["system"][1]]
    assert d.prepare(CLAUDE, False) is None
    text = {**CLAUDE, "system": "x-anthropic-billing-header: cch=00000;\nYou are Claude Code.\nx-other: kept"}
    assert d.prepare(text, True)["system"] == "You are Claude Code.\nx-other: kept"
    assert d.prepare({**CLAUDE, "system": "plain"}, True) is None


def test_bad_anthropic_bodies_are_400():
    with pytest.raises(BadRequest):
        AnthropicDialect().parse({"messages": "nope"})
    with pytest.raises(BadRequest):
        ResponsesDialect().parse({"input": 3})


def test_to_chat_is_what_llama_server_would_build():
    d = AnthropicDialect()
    body = {**d.prepare(CLAUDE, True), "stop_sequences": ["END"], "temperature": 0, "id_slot": 1,
            "tools": [{"name": "Read", "description": "r", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"}}
    chat = to_chat(body, d.parse(body).messages)
    assert chat["messages"][0] == {"role": "system", "content": "You are Claude Code."}
    assert chat["messages"][2]["reasoning_content"] == "hmm" and chat["messages"][2]["content"] == "Reading."
    assert chat["messages"][3] == {"role": "tool", "content": "LONG FILE", "tool_call_id": "t1"}
    assert chat["stop"] == ["END"] and chat["tool_choice"] == "required"
    assert "id_slot" not in chat  # the engine's pin travels as the stages set it (server/routes.py), not as a field
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert "metadata" not in chat and "system" not in chat


def _sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        name, data = block.split("\n", 1)
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_chat_stream_becomes_anthropic_events_with_tool_use():
    t = AnthropicTranslator(cache_report)
    chunks = _sse(
        {"id": "c1", "model": "m", "choices": [{"delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"delta": {"content": "Let me "}}]}, {"choices": [{"delta": {"content": "look."}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                                                "function": {"name": "Read", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"p\":"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"a\"}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "usage": {"completion_tokens": 7},
         "timings": {"cache_n": 90, "prompt_n": 10, "predicted_n": 7}})
    out = t.stream(chunks)
    ev = _events(out + t.end())
    names = [n for n, _ in ev]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert ev[5][1]["content_block"] == {"type": "tool_use", "id": "call_9", "name": "Read", "input": {}}
    assert "".join(d["delta"]["partial_json"] for n, d in ev if d.get("delta", {}).get("type") == "input_json_delta") \
        == '{"p":"a"}'
    assert ev[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert ev[-2][1]["usage"] == {"output_tokens": 7, "input_tokens": 10, "cache_read_input_tokens": 90}


def test_a_mid_stream_error_becomes_an_anthropic_error_event():
    t = AnthropicTranslator(cache_report)
    out = t.stream(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
                   b'data: {"error":{"code":500,"message":"boom","type":"server_error"}}\n\n')
    ev = _events(out + t.end())
    assert ev[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "boom"}})


def test_a_whole_chat_answer_becomes_an_anthropic_message():
    t = AnthropicTranslator(cache_report)
    chat = {"id": "c", "model": "m", "choices": [{"finish_reason": "length", "message": {
        "role": "assistant", "content": "Hi",
        "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 2}, "timings": {"cache_n": 80, "prompt_n": 20}}
    msg = json.loads(t.body(200, json.dumps(chat).encode()))
    assert msg["content"] == [{"type": "text", "text": "Hi"}, {"type": "tool_use", "id": "x", "name": "f", "input": {}}]
    assert msg["stop_reason"] == "max_tokens"
    assert msg["usage"] == {"cache_read_input_tokens": 80, "input_tokens": 20, "output_tokens": 2}
    err = json.loads(t.body(400, b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'))
    assert err == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}


def test_responses_items_and_write_back():
    d = ResponsesDialect()
    body = {"instructions": "be brief", "prompt_cache_key": "k", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "LONG"},
        {"type": "reasoning", "id": "r1", "summary": []}]}
    conv = d.parse(body)
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "tool", "item"]
    assert d.session_name(body) == "k"
    new = list(conv.messages)
    new[3] = {**new[3], "content": "SHORT"}
    out = d.write_back(body, conv, new)
    assert out["input"][2] == {"type": "function_call_output", "call_id": "c1", "output": "SHORT"}
    assert out["input"][:2] == body["input"][:2] and body["input"][2]["output"] == "LONG"
    chat = d.chat_body(body, conv.messages)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]


def test_the_cache_report_reads_every_dialect():
    assert cache_report({"timings": {"cache_n": 5, "prompt_n": 2, "predicted_n": 1}}) == CacheReport(5, 2, 1)
    assert cache_report({"usage": {"cache_read_input_tokens": 7, "input_tokens": 1, "output_tokens": 3}}) == \
        CacheReport(7, 1, 3)
    responses = {"usage": {"input_tokens": 10, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 9}}}
    assert cache_report(responses) == CacheReport(9, 1, 2)
    assert cache_report({"usage": {"prompt_tokens": 3}}) is None and cache_report(None) is None


def test_message_start_carries_the_prompt_counts_of_the_first_timed_event():
    """llama-server's role-only first event has no timings; with ``timings_per_token`` the next one has them:
    message_start waits for it and reports the same input/cache counts that message_delta ends with."""
    t = AnthropicTranslator(cache_report)
    timed = {"cache_n": 40, "prompt_n": 12, "predicted_n": 1}
    out = t.stream(b"data: " + json.dumps({"id": "c1", "model": "m", "choices": [
        {"delta": {"role": "assistant", "content": None}}]}).encode() + b"\n\n")
    assert out == b""  # held: no counts yet, nothing to show yet
    out += t.stream(_sse({"id": "c1", "choices": [{"delta": {"content": "Hi"}}], "timings": timed},
                         {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": 2},
                          "timings": {**timed, "predicted_n": 2}}))
    ev = _events(out)
    assert ev[0] == ("message_start", {"type": "message_start", "message": {
        "id": "c1", "type": "message", "role": "assistant", "content": [], "model": "m", "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 12, "cache_read_input_tokens": 40, "output_tokens": 0}}})
    assert ev[-2][1]["usage"] == {"output_tokens": 2, "input_tokens": 12, "cache_read_input_tokens": 40}
    # an upstream without per-token timings: message_start goes out with the first content, never held back
    t = AnthropicTranslator(cache_report)
    ev = _events(t.stream(b'data: {"id":"c2","choices":[{"delta":{"content":"a"}}]}\n\n'))
    assert [n for n, _ in ev] == ["message_start", "content_block_start", "content_block_delta"]
    assert ev[0][1]["message"]["usage"]["input_tokens"] == 0
    # a stream that ends right after the role-only event still opens and closes the message
    t = AnthropicTranslator(cache_report)
    t.stream(b'data: {"id":"c3","choices":[{"delta":{"role":"assistant"}}]}\n\n')
    assert [n for n, _ in _events(t.end())] == ["message_start", "message_delta", "message_stop"]


def test_streams_ask_for_timings_per_token():
    d = AnthropicDialect()
    body = {"model": "m", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    assert d.to_upstream(body, d.parse(body).messages)["timings_per_token"] is True
    assert "timings_per_token" not in d.chat_body(body, d.parse(body).messages)  # counting is unchanged
    plain = {**body, "stream": False}
    assert "timings_per_token" not in d.to_upstream(plain, d.parse(plain).messages)


@pytest.mark.parametrize("fields, expected", [
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}},
     {"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget_tokens": 2048}),
    ({"thinking": {"type": "adaptive"}}, {"chat_template_kwargs": {"enable_thinking": True}}),
    ({"thinking": {"type": "disabled"}}, {"chat_template_kwargs": {"enable_thinking": False}}),
    ({"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True, "x": 1}},
     {"chat_template_kwargs": {"enable_thinking": True, "x": 1}}),
    ({"thinking": {"type": "whatever"}}, {}),
    ({"output_config": {"effort": "low"}}, {"reasoning_effort": "low"}),
    ({"output_config": {"effort": "max"}}, {"reasoning_effort": "high"}),
    ({"output_config": {"effort": "extreme", "task_budget": 3}}, {}),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, {}),
], ids=["enabled", "adaptive", "disabled", "client-kwargs-win", "unknown-type", "effort", "effort-max",
        "effort-unknown", "format", "context-management"])
def test_reasoning_fields_map_to_what_llama_server_honours(fields, expected):
    d = AnthropicDialect()
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **fields}
    chat = to_chat(body, d.parse(body).messages)
    extra = {k: v for k, v in chat.items() if k not in ("messages", "max_tokens")}
    assert extra == expected
    for key in ("thinking", "output_config", "context_management"):
        assert key not in chat


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "text", "text": ["x"]}]}]}]},
    {"messages": [{"role": "user", "content": 7}]},
    {"messages": [{"role": "user", "content": [7]}]},
    {"messages": [{"role": "user", "content": [{"type": 3}]}]},
    {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": 1, "name": "f", "input": {}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "no tool_use_id"}]}]},
    {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]},
    {"system": [{"type": "text", "text": None}], "messages": []},
    {"system": 5, "messages": []},
    {"tools": 5, "messages": []},
    {"tools": [{"name": "f", "input_schema": "x"}], "messages": []},
    {"max_tokens": "2", "messages": []},
    {"stop_sequences": "END", "messages": []},
    {"thinking": {"type": "enabled", "budget_tokens": "lots"}, "messages": []},
    {"output_config": [], "messages": []},
], ids=lambda b: json.dumps(b)[:60])
def test_anthropic_fields_of_the_wrong_type_are_400(body):
    with pytest.raises(BadRequest):
        AnthropicDialect().parse(body)


@pytest.mark.parametrize("body", [
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
    {"input": [{"role": "user", "content": 5}]},
    {"input": [{"role": 5, "content": "hi"}]},
    {"input": [{"type": 5}]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": {}}]}]},
    {"input": [{"type": "function_call", "call_id": 3, "name": "f", "arguments": "{}"}]},
    {"input": "hi", "instructions": ["x"]},
    {"input": "hi", "tools": 5},
    {"input": "hi", "previous_response_id": {"id": "r"}},
], ids=lambda b: json.dumps(b)[:60])
def test_responses_fields_of_the_wrong_type_are_400(body):
    with pytest.raises(BadRequest):
        ResponsesDialect().parse(body)


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("dialect, template", [
    (ChatDialect(), '{"messages": [{"role": "user", "content": [{"type": "image_url", "x": %s}]}]}'),
    (AnthropicDialect(), '{"messages": [{"role": "user", "content": [{"type": "document", "x": %s}]}]}'),
    (ResponsesDialect(), '{"input": [{"type": "reasoning", "x": %s}]}'),
], ids=["chat", "anthropic", "responses"])
def test_bodies_nested_deeper_than_the_limit_are_400(dialect, template):
    ok = json.loads(template % _nested(MAX_DEPTH - 10))
    dialect.parse(ok)
    with pytest.raises(BadRequest, match="nested deeper"):
        dialect.parse(json.loads(template % _nested(MAX_DEPTH)))
    deep = json.loads(template % _nested(600))  # the depth at which the session index's pickle failed
    with pytest.raises(BadRequest, match="nested deeper"):
        dialect.parse(deep)


def test_a_history_served_from_another_dialect_in_another_shape_is_not_written_back():
    """A chat client's assistant tool call with ``content: []`` has the identity of a Responses function_call
    (``content: None``): replayed into the Responses body it is no change, not a ValueError (a 500)."""
    d = ResponsesDialect()
    body = {"input": [{"role": "user", "content": "cat a.py"},
                      {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "x"}]}
    conv = d.parse(body)
    served = [dict(m) for m in conv.messages]
    served[0]["content"] = [{"type": "text", "text": "cat a.py"}]
    served[1]["content"] = []
    assert message_hash(served[1]) == message_hash(conv.messages[1])
    assert d.write_back(body, conv, served) is body
    served[2]["content"] = "SHORT"
    assert d.write_back(body, conv, served)["input"][2]["output"] == "SHORT"
    a = AnthropicDialect()
    abody = {"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}
    aconv = a.parse(abody)
    aserved = [dict(m) for m in aconv.messages]
    aserved[1]["content"] = None  # as a chat client sent it
    assert a.write_back(abody, aconv, aserved) is abody  # no empty text block put before the tool_use


@pytest.mark.parametrize("message", [
    {"role": "tool", "tool_call_id": None, "content": "x"},
    {"role": "user", "name": 3, "content": "x"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": ["c"], "type": "function",
                                                           "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
    {"role": "user", "content": [{"text": "no type"}]},
], ids=lambda m: json.dumps(m)[:50])
def test_chat_fields_llama_server_would_answer_with_500_are_400(message):
    """llama-server's message parser turns these into 500 ("Failed to parse messages"); the proxy says 400."""
    with pytest.raises(BadRequest):
        ChatDialect().parse({"messages": [message]})


@pytest.mark.parametrize("tool", [{"function": {"name": "f"}}, {"type": "function", "function": {"name": 1}},
                                  {"type": "function", "function": {"name": "f", "description": []}}])
def test_chat_tools_llama_server_would_answer_with_500_are_400(tool):
    with pytest.raises(BadRequest):
        ChatDialect().parse({"messages": [], "tools": [tool]})


def test_a_spawned_base_models_cap_lowers_max_tokens_and_ends_the_turn_there():
    chat = {"messages": [], "max_tokens": 128000}
    assert cap_turn(chat, 256) and chat["max_tokens"] == 256
    for body, cap in (({"max_tokens": 100}, 256), ({"max_tokens": 256}, 256), ({"max_tokens": 128000}, 0)):
        kept = dict(body)
        assert not cap_turn(body, cap) and body == kept  # within the cap, or no cap (not a spawned base model)
    whole = json.dumps({"choices": [{"finish_reason": "length", "message": {"content": "Hi"}}]}).encode()
    assert json.loads(AnthropicTranslator(cache_report, turn_capped=True).body(200, whole))["stop_reason"] == "end_turn"
    assert json.loads(AnthropicTranslator(cache_report).body(200, whole))["stop_reason"] == "max_tokens"
    for capped, reason in ((True, "end_turn"), (False, "max_tokens")):
        t = AnthropicTranslator(cache_report, turn_capped=capped)
        ev = _events(t.stream(_sse({"id": "c", "choices": [{"delta": {"content": "Hi"}}]},
                                   {"choices": [{"delta": {}, "finish_reason": "length"}]})) + t.end())
        assert ev[-2][1]["delta"]["stop_reason"] == reason
