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
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from aiohttp import web

from pflash_proxy.dialects import (AnthropicStream, Conversation, Dialect, anthropic_error, changed_indices,
                                   replace_text)
from pflash_proxy.dialects.anthropic_wire import AnthropicTranslator, to_chat
from pflash_proxy.errors import BadRequest, error_body
from pflash_proxy.models import message_text

VOLATILE_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*\n?", re.IGNORECASE | re.MULTILINE)


def _part(block: Any) -> dict:
    """A content block as an internal part (text → ``{"type": "text", "text"}``; others without markers)."""
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if not isinstance(block, dict):
        return {"type": "other", "value": block}
    if block.get("type", "text") == "text":
        return {"type": "text", "text": block.get("text", "")}
    return {k: v for k, v in block.items() if k != "cache_control"}


def _text_indices(blocks: list, idx: list[int]) -> list[int]:
    return [j for j in idx if isinstance(blocks[j], str) or
            (isinstance(blocks[j], dict) and blocks[j].get("type", "text") == "text")]


class AnthropicDialect(Dialect):
    name = "anthropic"
    stream_style = AnthropicStream()
    upstream_path = "/v1/chat/completions"  # llama-server's /v1/messages drops id_slot: see anthropic_wire

    # Parsing ---------------------------------------------------------------------------------------------
    def parse(self, body: dict) -> Conversation:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            raise BadRequest("invalid request: 'messages' must be a list of objects with a 'role'",
                             code="invalid_request")
        out: list[dict] = []
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
    def _assistant(content: list) -> dict:
        parts = [_part(b) for b in content if not _is(b, "tool_use")]
        calls = [{"id": b.get("id"), "type": "function",
                  "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}), ensure_ascii=False,
                                                                             sort_keys=True)}}
                 for b in content if _is(b, "tool_use")]
        msg: dict[str, Any] = {"role": "assistant", "content": parts}
        if calls:
            msg["tool_calls"] = calls
        return msg

    @staticmethod
    def _tool(block: dict) -> dict:
        inner = block.get("content")
        content = [_part(b) for b in inner] if isinstance(inner, list) else inner
        msg = {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": content}
        if block.get("is_error"):
            msg["is_error"] = True
        return msg

    # Writing back ----------------------------------------------------------------------------------------
    def write_back(self, body: dict, conv: Conversation, messages: list[dict]) -> dict:
        changed = changed_indices(conv.messages, messages)
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
    def chat_body(self, body: dict, messages: list[dict]) -> dict:
        chat = to_chat(body, messages)
        chat.pop("stream", None)
        chat.pop("id_slot", None)
        return chat

    def to_upstream(self, body: dict, messages: list[dict]) -> dict:
        return to_chat(body, messages)

    def translator(self) -> AnthropicTranslator:
        return AnthropicTranslator()

    def session_name(self, body: dict) -> str | None:
        meta = body.get("metadata")
        user = meta.get("user_id") if isinstance(meta, dict) else None
        return user if isinstance(user, str) and user else None

    def prepare(self, body: dict, drop_volatile: bool) -> dict | None:
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
                       headers: dict | None = None, type_: str | None = None) -> web.Response:
        return web.json_response(anthropic_error(error_body(status, message, code, type_)), status=status,
                                 headers=headers)


def _is(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind
