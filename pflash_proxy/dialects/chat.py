"""OpenAI chat completions: the internal conversation IS the ``messages`` list (identity translation).

Types are checked by ``models.ChatCompletionRequest`` before ``parse``; ``parse`` refuses (400) a body nested
deeper than ``MAX_DEPTH``, and the message fields llama-server's message parser reads as strings when they are
not (``tool_call_id``, ``name``, ``reasoning_content``, a tool call's ``id``/``function.name``, a part's
``type``), a tool call whose ``type`` is not ``function`` or without ``function.arguments``: llama-server
answers those with a 500; so are ``tools`` that are not ``{"type": "function", "function": {"name": ...}}``.
"""

from __future__ import annotations

from typing import Any

from pflash_proxy.dialects import Conversation, Dialect, JsonObject, changed_indices, check_depth, expect


class ChatDialect(Dialect):
    name = "chat"
    paths = ("/v1/chat/completions", "/chat/completions")  # the routes this dialect owns (dialects/registry.py)

    def parse(self, body: JsonObject) -> Conversation:
        check_depth(body)
        for i, m in enumerate(body["messages"]):
            if isinstance(m, dict):
                _check_message(m, f"messages.{i}")
        for j, tool in enumerate(body.get("tools") or ()):
            fn = tool.get("function") if isinstance(tool, dict) else None
            expect(isinstance(fn, dict) and tool.get("type") == "function" and isinstance(fn.get("name"), str)
                   and isinstance(fn.get("description", ""), str), f"tools.{j}",
                   "must be {\"type\": \"function\", \"function\": {\"name\": ..., \"description\": ...}}")
        messages = [m if isinstance(m, dict) else dict(m) for m in body["messages"]]
        return Conversation(messages, list(range(len(messages))))

    def write_back(self, body: JsonObject, conv: Conversation, messages: list[JsonObject]) -> JsonObject:
        changed_indices(conv.messages, messages)  # only content may change
        return {**body, "messages": list(messages)}

    def chat_body(self, body: JsonObject, messages: list[JsonObject]) -> JsonObject:
        return {**body, "messages": messages}


def _check_message(m: JsonObject, where: str) -> None:
    for key in ("tool_call_id", "name", "reasoning_content"):
        expect(key not in m or isinstance(m[key], str), f"{where}.{key}", "must be a string")
    content = m.get("content")
    for j, part in enumerate(content if isinstance(content, list) else ()):
        expect(isinstance(part, dict) and isinstance(part.get("type"), str), f"{where}.content.{j}",
               "a part must be an object with a string 'type'")
    for j, call in enumerate(m.get("tool_calls") or ()):
        fn: Any = call.get("function")
        expect(call.get("type") == "function" and isinstance(call.get("id", ""), str), f"{where}.tool_calls.{j}",
               "'type' must be \"function\" and 'id' a string")
        expect(isinstance(fn, dict) and isinstance(fn.get("name"), str) and "arguments" in fn,
               f"{where}.tool_calls.{j}.function", "must be an object with a string 'name' and 'arguments'")
