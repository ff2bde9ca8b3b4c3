"""Anthropic Messages (``POST /v1/messages``, Claude Code) ⇄ the internal conversation.

1. ``system`` (a string or text blocks) is a system message.
2. An assistant message is one internal message: its text blocks are text parts, ``tool_use`` blocks become
   ``tool_calls`` (``input`` as JSON ``arguments``), other blocks (``thinking``…) stay parts for identity.
3. A user message is split at its ``tool_result`` blocks: each is a ``tool`` message (``tool_call_id`` =
   ``tool_use_id``) and each run of other blocks a ``user`` message, in order. So a long tool result followed
   by a short reminder is still "the newest long message" for compression.
4. ``cache_control`` markers move between turns in Claude Code's requests; they are not part of identity.
5. ``write_back`` replaces only the text of what changed: the first text block of the group (or the
   ``tool_result``'s content) gets the new text, the group's other text blocks go; every other block, key and
   marker stays the client's.
6. On the wire it travels as a chat completion (``anthropic_wire``): llama-server's own /v1/messages cannot be
   pinned to a slot.
7. Volatile lines: Claude Code starts its system prompt with a per-request billing line
   (``x-anthropic-billing-header: …; cch=…;``) that defeats every prefix cache (llama.cpp #19494). With
   ``drop_volatile`` (the default) such lines are removed before identity and forwarding; nothing else of the
   system prompt is touched.
8. Bad bodies get a 400 in Anthropic's shape before anything else runs: nesting deeper than ``MAX_DEPTH``, and a
   wrong type in any field the proxy reads or translates itself (``system``, content blocks — a ``text`` that
   is not a string, a ``tool_result``'s content —, ``tools``, ``tool_choice``, ``stop_sequences``,
   ``max_tokens``, sampling numbers, ``stream``, ``thinking``, ``output_config``).
9. ``thinking``, ``output_config`` and ``context_management`` map to what llama-server honours per request (the
   table in ``anthropic_wire``); the rest is dropped and logged at debug.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from pflash_proxy.dialects import (AnthropicStream, Conversation, Dialect, JsonObject, ReportReader, anthropic_error,
                                   check_depth, expect, is_int, is_num, replace_text, text_changed)
from pflash_proxy.dialects.anthropic_wire import AnthropicTranslator, to_chat
from pflash_proxy.errors import BadRequest, error_body
from pflash_proxy.models import message_text

VOLATILE_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*\n?", re.IGNORECASE | re.MULTILINE)


def _part(block: object) -> JsonObject:
    """A content block as an internal part (text → ``{"type": "text", "text"}``; others without markers)."""
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if not isinstance(block, dict):
        return {"type": "other", "value": block}
    if block.get("type", "text") == "text":
        return {"type": "text", "text": block.get("text", "")}
    return {k: v for k, v in block.items() if k != "cache_control"}


def _text_indices(blocks: list[Any], idx: list[int]) -> list[int]:
    return [j for j in idx if isinstance(blocks[j], str) or
            (isinstance(blocks[j], dict) and blocks[j].get("type", "text") == "text")]


class AnthropicDialect(Dialect):
    name = "anthropic"
    paths = ("/v1/messages",)  # the routes this dialect owns (dialects/registry.py)
    stream_style = AnthropicStream()
    upstream_path = "/v1/chat/completions"  # llama-server's /v1/messages drops the slot pin: see anthropic_wire

    # Parsing ---------------------------------------------------------------------------------------------
    def parse(self, body: JsonObject) -> Conversation:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            raise BadRequest("invalid request: 'messages' must be a list of objects with a 'role'",
                             code="invalid_request")
        check_depth(body)
        _validate(body)
        out: list[JsonObject] = []
        origins: list[Any] = []
        system = body.get("system")
        if isinstance(system, str):
            out.append({"role": "system", "content": system})
            origins.append(("system", None))
        elif isinstance(system, list):
            out.append({"role": "system", "content": [_part(b) for b in system]})
            origins.append(("system", _text_indices(system, list(range(len(system))))))
        for i, msg in enumerate(msgs):
            content = msg.get("content")
            if not isinstance(content, list):
                out.append({"role": msg["role"], "content": content})
                origins.append(("msg", i, None))
                continue
            if msg["role"] == "assistant":
                out.append(self._assistant(content))
                origins.append(("msg", i, _text_indices(content, [j for j, b in enumerate(content)
                                                                  if not _is(b, "tool_use")])))
                continue
            group: list[int] = []
            for j, block in enumerate(content):
                if _is(block, "tool_result"):
                    if group:
                        out.append({"role": msg["role"], "content": [_part(content[k]) for k in group]})
                        origins.append(("msg", i, _text_indices(content, group)))
                        group = []
                    out.append(self._tool(block))
                    origins.append(("tool", i, j))
                else:
                    group.append(j)
            if group or not content:
                out.append({"role": msg["role"], "content": [_part(content[k]) for k in group]})
                origins.append(("msg", i, _text_indices(content, group)))
        return Conversation(out, origins)

    @staticmethod
    def _assistant(content: list[Any]) -> JsonObject:
        parts = [_part(b) for b in content if not _is(b, "tool_use")]
        calls = [{"id": b.get("id"), "type": "function",
                  "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}), ensure_ascii=False,
                                                                             sort_keys=True)}}
                 for b in content if _is(b, "tool_use")]
        msg: dict[str, object] = {"role": "assistant", "content": parts}
        if calls:
            msg["tool_calls"] = calls
        return msg

    @staticmethod
    def _tool(block: JsonObject) -> JsonObject:
        inner = block.get("content")
        content = [_part(b) for b in inner] if isinstance(inner, list) else inner
        msg = {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": content}
        if block.get("is_error"):
            msg["is_error"] = True
        return msg

    # Writing back ----------------------------------------------------------------------------------------
    def write_back(self, body: JsonObject, conv: Conversation, messages: list[JsonObject]) -> JsonObject:
        changed = text_changed(conv.messages, messages)
        if not changed:
            return body
        new = dict(body)
        new["messages"] = list(body["messages"])
        for k in reversed(changed):  # later blocks first: dropping a text block never shifts one still to do
            text = message_text(messages[k].get("content"))
            origin = conv.origins[k]
            if origin[0] == "system":
                new["system"] = replace_text(body.get("system"), origin[1], text)
            elif origin[0] == "tool":
                _, i, j = origin
                msg = new["messages"][i] = copy.copy(new["messages"][i])
                blocks = msg["content"] = list(msg["content"])
                block = blocks[j] = dict(blocks[j])
                inner = block.get("content")
                block["content"] = replace_text(inner, _text_indices(inner, list(range(len(inner))))
                                                 if isinstance(inner, list) else None, text)
            else:
                _, i, idx = origin
                msg = new["messages"][i] = dict(new["messages"][i])
                msg["content"] = replace_text(msg.get("content"), idx, text)
        return new

    # Counting, names, volatile lines, errors ------------------------------------------------------------
    def chat_body(self, body: JsonObject, messages: list[JsonObject]) -> JsonObject:
        chat = to_chat(body, messages)
        chat.pop("stream", None)
        return chat

    def to_upstream(self, body: JsonObject, messages: list[JsonObject]) -> JsonObject:
        chat = to_chat(body, messages)
        if chat.get("stream"):  # every event carries timings: message_start gets the prompt's counts
            chat["timings_per_token"] = True
        return chat

    def translator(self, report: ReportReader, turn_capped: bool = False) -> AnthropicTranslator:
        return AnthropicTranslator(report, turn_capped)

    def session_name(self, body: JsonObject) -> str | None:
        meta = body.get("metadata")
        user = meta.get("user_id") if isinstance(meta, dict) else None
        return user if isinstance(user, str) and user else None

    def prepare(self, body: JsonObject, drop_volatile: bool) -> JsonObject | None:
        system = body.get("system")
        if not drop_volatile or system is None:
            return None
        if isinstance(system, str):
            cleaned: Any = VOLATILE_LINE.sub("", system)
        elif isinstance(system, list):
            cleaned = []
            for block in system:
                if isinstance(block, dict) and block.get("type", "text") == "text" \
                        and isinstance(block.get("text"), str):
                    text = VOLATILE_LINE.sub("", block["text"])
                    if text != block["text"]:
                        if not text.strip():
                            continue  # the block held only the volatile line
                        block = {**block, "text": text}
                cleaned.append(block)
        else:
            return None
        return None if cleaned == system else {**body, "system": cleaned}

    def error_response(self, status: int, message: str, code: str | None = None,
                       headers: Mapping[str, str] | None = None, type_: str | None = None) -> web.Response:
        return web.json_response(anthropic_error(error_body(status, message, code, type_)), status=status,
                                 headers=headers)


def _validate(body: JsonObject) -> None:
    """400 for a wrong type in any field the proxy reads or translates to chat itself (step 8)."""
    system = body.get("system")
    expect(system is None or isinstance(system, (str, list)), "system", "must be a string or a list of text blocks")
    for j, block in enumerate(system if isinstance(system, list) else ()):
        _check_block(block, f"system.{j}")
    for i, msg in enumerate(body["messages"]):
        content = msg.get("content")
        expect(content is None or isinstance(content, (str, list)), f"messages.{i}.content",
               "must be a string or a list of content blocks")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            _check_block(block, f"messages.{i}.content.{j}")
    tools = body.get("tools")
    expect(tools is None or isinstance(tools, list), "tools", "must be a list of tools")
    for k, tool in enumerate(tools or ()):
        expect(isinstance(tool, dict), f"tools.{k}", "must be an object")
        expect(isinstance(tool.get("name", ""), str), f"tools.{k}.name", "must be a string")
        expect(isinstance(tool.get("description", ""), str), f"tools.{k}.description", "must be a string")
        expect(isinstance(tool.get("input_schema", {}), dict), f"tools.{k}.input_schema", "must be an object")
    choice = body.get("tool_choice")
    expect(choice is None or isinstance(choice, dict) and isinstance(choice.get("type", ""), str), "tool_choice",
           "must be an object with a string 'type'")
    stops = body.get("stop_sequences")
    expect(stops is None or isinstance(stops, list) and all(isinstance(x, str) for x in stops), "stop_sequences",
           "must be a list of strings")
    expect(body.get("max_tokens") is None or is_int(body["max_tokens"]), "max_tokens", "must be an integer")
    for key in ("temperature", "top_p"):
        expect(body.get(key) is None or is_num(body[key]), key, "must be a number")
    expect(body.get("top_k") is None or is_int(body["top_k"]), "top_k", "must be an integer")
    expect(body.get("stream") is None or isinstance(body["stream"], bool), "stream", "must be a boolean")
    thinking = body.get("thinking")
    expect(thinking is None or isinstance(thinking, dict) and isinstance(thinking.get("type", ""), str)
           and (thinking.get("budget_tokens") is None or is_int(thinking["budget_tokens"])), "thinking",
           "must be an object with a string 'type' (and an integer 'budget_tokens')")
    config = body.get("output_config")
    expect(config is None or isinstance(config, dict) and isinstance(config.get("effort", ""), str)
           and (config.get("format") is None or isinstance(config["format"], dict)), "output_config",
           "must be an object ('effort' a string, 'format' an object)")
    for key in ("chat_template_kwargs", "metadata"):
        expect(body.get(key) is None or isinstance(body[key], dict), key, "must be an object")


_BLOCK_STRINGS = {"text": ("text",), "thinking": ("thinking", "signature"), "redacted_thinking": ("data",),
                  "tool_use": ("id", "name"), "tool_result": ("tool_use_id",)}
_BLOCK_REQUIRED = {"tool_use": ("id", "name"), "tool_result": ("tool_use_id",)}


def _check_block(block: Any, where: str, inner: bool = False) -> None:
    if isinstance(block, str):
        return
    expect(isinstance(block, dict), where, "a content block must be an object")
    kind = block.get("type", "text")
    expect(isinstance(kind, str), f"{where}.type", "must be a string")
    for key in _BLOCK_STRINGS.get(kind, ()):
        expect(isinstance(block.get(key, ""), str), f"{where}.{key}", "must be a string")
    for key in _BLOCK_REQUIRED.get(kind, ()):  # llama-server answers a tool call or result without them with 500
        expect(isinstance(block.get(key), str), f"{where}.{key}", "must be a string")
    if kind == "text":
        expect(isinstance(block.get("text"), str), f"{where}.text", "must be a string")
    elif kind == "image":
        src = block.get("source")
        expect(isinstance(src, dict) and all(isinstance(src.get(k, ""), str) for k in ("type", "url", "data",
                                                                                       "media_type")),
               f"{where}.source", "must be an object of strings ('type', 'url' or 'media_type' and 'data')")
    elif kind == "tool_result" and not inner:
        content = block.get("content")
        expect(content is None or isinstance(content, (str, list)), f"{where}.content",
               "must be a string or a list of content blocks")
        for j, b in enumerate(content if isinstance(content, list) else ()):
            _check_block(b, f"{where}.content.{j}", inner=True)


def _is(block: object, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind
