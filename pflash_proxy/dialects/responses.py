"""OpenAI Responses (``POST /v1/responses``, Codex) ⇄ the internal conversation.

1. ``instructions`` is a system message; ``input`` as a string is one user message.
2. ``input`` items: a message item (``role`` + ``content``, ``input_text``/``output_text`` parts as text parts)
   is a message of that role; a ``function_call`` is an assistant message with one tool call (``call_id``);
   a ``function_call_output`` is a ``tool`` message; any other item (``reasoning``…) is kept whole, under
   role ``item``, for identity only.
3. ``write_back`` replaces only the text of what changed (the item's first text part, or its ``output``).
4. ``prompt_cache_key`` names the conversation (Codex sends one per session). ``previous_response_id`` is not
   served by llama-server (400) and is forwarded unchanged, so the client sees that answer.
5. Bad bodies get a 400 in the OpenAI shape before anything else runs: nesting deeper than ``MAX_DEPTH``, and a
   wrong type in any field the proxy reads itself (``instructions``, an item's ``type``/``role``/``call_id``,
   a text part's ``text``, an ``output``, ``tools``, ``previous_response_id``, ``prompt_cache_key``, ``stream``).
"""

from __future__ import annotations

import json
from typing import Any

from pflash_proxy.dialects import (Conversation, Dialect, JsonObject, ResponsesStream, check_depth, expect, replace_text,
                                   text_changed)
from pflash_proxy.errors import BadRequest
from pflash_proxy.models import message_text

_TEXT_PARTS = ("input_text", "output_text", "text")


def _part(p: object) -> JsonObject:
    if isinstance(p, str):
        return {"type": "text", "text": p}
    if isinstance(p, dict) and p.get("type", "input_text") in _TEXT_PARTS:
        return {"type": "text", "text": p.get("text", "")}
    return p if isinstance(p, dict) else {"type": "other", "value": p}


def _content(c: object) -> object:
    return [_part(p) for p in c] if isinstance(c, list) else c


def _text_idx(c: object) -> list[int] | None:
    if not isinstance(c, list):
        return None
    return [j for j, p in enumerate(c) if isinstance(p, str) or
            (isinstance(p, dict) and p.get("type", "input_text") in _TEXT_PARTS)]


def _validate(body: JsonObject) -> None:
    """400 for a wrong type in any field the proxy reads or translates itself (step 5)."""
    expect(body.get("instructions") is None or isinstance(body["instructions"], str), "instructions",
           "must be a string")
    items = body.get("input")
    for k, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, dict):
            continue  # parse refuses it
        kind = item.get("type", "message")
        expect(isinstance(kind, str), f"input.{k}.type", "must be a string")
        if kind == "message":
            expect(isinstance(item.get("role"), str), f"input.{k}.role", "must be a string")
            _check_parts(item.get("content"), f"input.{k}.content")
        elif kind in ("function_call", "function_call_output"):
            for key in ("call_id", "name"):
                expect(isinstance(item.get(key, ""), str), f"input.{k}.{key}", "must be a string")
            if kind == "function_call":
                expect(isinstance(item.get("arguments", ""), (str, dict)), f"input.{k}.arguments",
                       "must be a string")
            else:
                _check_parts(item.get("output"), f"input.{k}.output")
    tools = body.get("tools")
    expect(tools is None or isinstance(tools, list) and all(isinstance(t, dict) for t in tools), "tools",
           "must be a list of objects")
    for j, tool in enumerate(tools or ()):
        for key in ("type", "name", "description"):
            expect(isinstance(tool.get(key, ""), str), f"tools.{j}.{key}", "must be a string")
        expect(isinstance(tool.get("parameters", {}), dict), f"tools.{j}.parameters", "must be an object")
    for key in ("previous_response_id", "prompt_cache_key"):
        expect(body.get(key) is None or isinstance(body[key], str), key, "must be a string")
    expect(body.get("stream") is None or isinstance(body["stream"], bool), "stream", "must be a boolean")


def _check_parts(content: object, where: str) -> None:
    expect(content is None or isinstance(content, (str, list)), where, "must be a string or a list of parts")
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if isinstance(part, str):
            continue
        expect(isinstance(part, dict), f"{where}.{j}", "a part must be an object")
        kind = part.get("type", "input_text")
        expect(isinstance(kind, str), f"{where}.{j}.type", "must be a string")
        if kind in _TEXT_PARTS:
            expect(isinstance(part.get("text"), str), f"{where}.{j}.text", "must be a string")


class ResponsesDialect(Dialect):
    name = "responses"
    paths = ("/v1/responses", "/responses")  # the routes this dialect owns (dialects/registry.py)
    stream_style = ResponsesStream()

    def parse(self, body: JsonObject) -> Conversation:
        check_depth(body)
        _validate(body)
        out: list[JsonObject] = []
        origins: list[Any] = []
        if isinstance(body.get("instructions"), str):
            out.append({"role": "system", "content": body["instructions"]})
            origins.append(("instructions",))
        items = body.get("input")
        if isinstance(items, str):
            out.append({"role": "user", "content": items})
            origins.append(("input",))
            return Conversation(out, origins)
        if not isinstance(items, list) or not all(isinstance(it, dict) for it in items):
            raise BadRequest("invalid request: 'input' must be a string or a list of items", code="invalid_request")
        for k, item in enumerate(items):
            kind = item.get("type", "message")
            if kind == "message" and isinstance(item.get("role"), str):
                out.append({"role": item["role"], "content": _content(item.get("content"))})
                origins.append(("item", k, "content", _text_idx(item.get("content"))))
            elif kind == "function_call":
                args = item.get("arguments")
                out.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"),
                                 "arguments": args if isinstance(args, str) else json.dumps(args)}}]})
                origins.append(("item", k, None, None))
            elif kind == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                            "content": _content(item.get("output"))})
                origins.append(("item", k, "output", _text_idx(item.get("output"))))
            else:
                out.append({"role": "item", "content": [{k2: v for k2, v in item.items()}]})
                origins.append(("item", k, None, None))
        return Conversation(out, origins)

    def write_back(self, body: JsonObject, conv: Conversation, messages: list[JsonObject]) -> JsonObject:
        changed = text_changed(conv.messages, messages)
        if not changed:
            return body
        new = dict(body)
        if isinstance(body.get("input"), list):
            new["input"] = list(body["input"])
        for k in changed:
            text = message_text(messages[k].get("content"))
            origin = conv.origins[k]
            if origin[0] == "instructions":
                new["instructions"] = text
            elif origin[0] == "input":
                new["input"] = text
            elif origin[2] is None:
                raise ValueError(f"message {k} ({messages[k].get('role')}) has no text to replace")
            else:
                _, i, fld, idx = origin
                item = new["input"][i] = dict(new["input"][i])
                item[fld] = replace_text(item.get(fld), idx, text, "input_text")
        return new

    def chat_body(self, body: JsonObject, messages: list[JsonObject]) -> JsonObject:
        chat: list[JsonObject] = []
        for m in messages:
            role = m["role"]
            if role == "item":
                continue
            out: dict[str, object] = {"role": "system" if role == "developer" else role,
                                   "content": message_text(m.get("content")) if m.get("content") is not None else None}
            if m.get("tool_calls"):
                out["tool_calls"] = m["tool_calls"]
            if role == "tool":
                out["tool_call_id"] = m.get("tool_call_id")
            chat.append(out)
        tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                   "parameters": t.get("parameters", {})}}
                 for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
        out_body: dict[str, object] = {"messages": chat}
        if tools:
            out_body["tools"] = tools
        return out_body

    def session_name(self, body: JsonObject) -> str | None:
        key = body.get("prompt_cache_key")
        return key if isinstance(key, str) and key else None
