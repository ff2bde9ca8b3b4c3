"""Anthropic Messages on the wire to llama-server: sent as chat completions, answered as Anthropic messages.

Why: llama-server's ``/v1/messages`` converts the body to a chat request keeping only a few sampling fields, so
the slot pin is dropped and the request lands on whatever slot the server picks (measured on b11434: every
request alternated between the two slots whatever the pin said). A session could then never be pinned. So the
proxy does the same conversion itself and sends ``/v1/chat/completions``, with the engine's pin fields the stages
added (``Slots.pin_fields``) carried over by the server (``server/routes.py``):

1. ``to_chat(body)``: the (possibly rewritten) Anthropic body as a chat body, the way llama-server converts it
   (system text blocks joined; images as ``image_url``; ``tool_use`` → ``tool_calls``; each ``tool_result`` a
   ``tool`` message, in block order; ``thinking`` blocks → ``reasoning_content``; tools, ``tool_choice``,
   ``stop_sequences``, ``max_tokens`` (4096 when absent), ``temperature``/``top_p``/``top_k``,
   ``chat_template_kwargs``, and the reasoning fields below). A stream is asked for ``timings_per_token``.
   ``cache_prompt`` is passed on as it is: cache isolation sets it false on a request whose slot it could not
   erase (``sessions/isolation.py``), and that must reach the server whatever the dialect.
2. ``AnthropicTranslator.body``: a chat completion (or a chat error) as an Anthropic ``message`` (or error), with
   ``usage`` = ``cache_read_input_tokens`` / ``input_tokens`` (uncached) / ``output_tokens`` from the answer's
   cache report (``Engine.cache_report``, given to the translator: llama-server's ``timings``).
3. ``AnthropicTranslator.stream``: chat chunks as Anthropic events — ``message_start``, one content block per
   kind as it appears (``thinking``, ``text``, each ``tool_use`` with ``input_json_delta``), ``message_delta``
   with the stop reason and usage, ``message_stop``. A mid-stream ``{"error": …}`` becomes an ``error`` event.
   ``message_start`` waits for the first event that carries ``timings`` (llama-server's first token event, with
   ``timings_per_token``; its role-only event before it carries none), so its ``usage`` holds the prompt's real
   ``input_tokens`` (uncached) and ``cache_read_input_tokens``, the same numbers ``message_delta`` ends with. An
   upstream that sends no timings before content gets zeros there, as before (the stream is never held back).
4. ``dialects.cap_turn``: for a base model the proxy spawned (``Upstream.turn_cap``, ``llama/spawn.py`` step 3) a
   ``max_tokens`` above its cap is lowered to it, and ``AnthropicTranslator(turn_capped=True)`` reports a stop
   there (``finish_reason: length``) as ``end_turn``; the response header ``X-PFlash-Turn-Cap`` says so.

Request fields with no chat twin, per request, as llama-server b11434 honours them:

===============================================  ==========================================================
Anthropic                                        chat request to llama-server
===============================================  ==========================================================
``thinking: {type: "enabled", budget_tokens}``   ``chat_template_kwargs.enable_thinking: true`` and
                                                 ``thinking_budget_tokens`` (the reasoning budget; applied
                                                 only by templates with thinking tags)
``thinking: {type: "adaptive"}``                 ``chat_template_kwargs.enable_thinking: true`` (budget:
                                                 the server's ``--reasoning-budget``)
``thinking: {type: "disabled"}``                 ``chat_template_kwargs.enable_thinking: false``
``chat_template_kwargs`` (llama-server's own)    passed on; its ``enable_thinking`` wins over ``thinking``
``output_config.effort`` low / medium / high     ``reasoning_effort`` low / medium / high (a template kwarg:
/ max                                            only templates that read it, e.g. gpt-oss); max → high
``output_config.format`` ``json_schema``         ``response_format: {type: json_schema, json_schema:
                                                 {schema}}`` (grammar-constrained output)
other ``thinking`` types, other ``effort``       dropped, logged at debug
values, other ``output_config`` keys
``context_management`` (server-side context      dropped, logged at debug: llama-server edits no context
editing)
===============================================  ==========================================================
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pflash_proxy.dialects import JsonObject, ReportReader, anthropic_error, is_int
from pflash_proxy.engine import CacheReport
from pflash_proxy.models import message_text

log = logging.getLogger("pflash_proxy.dialects")

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_CAPPED_STOP = {**_STOP, "length": "end_turn"}  # AnthropicTranslator(turn_capped=True): step 4
_PASSED_ON = ("temperature", "top_p", "top_k", "stream", "cache_prompt")  # the same name and meaning in both


def to_chat(body: JsonObject, messages: list[JsonObject]) -> JsonObject:
    """The chat-completions body llama-server would build from this Anthropic body (``messages``: the internal
    conversation, already holding the proxy's rewrites)."""
    chat: list[JsonObject] = []
    for m in messages:
        role = m["role"]
        if role == "system":
            chat.append({"role": "system", "content": message_text(m.get("content"))})
            continue
        content = m.get("content")
        out: dict[str, object] = {"role": role}
        if isinstance(content, list):
            parts: list[JsonObject] = []
            thinking = ""
            for p in content:
                kind = p.get("type") if isinstance(p, dict) else None
                if kind == "text":
                    parts.append({"type": "text", "text": p.get("text", "")})
                elif kind == "image" and isinstance(p.get("source"), dict):
                    src = p["source"]
                    url = src.get("url") if src.get("type") == "url" else \
                        f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
                    parts.append({"type": "image_url", "image_url": {"url": url}})
                elif kind == "thinking":
                    thinking += str(p.get("thinking", ""))
            if all(p["type"] == "text" for p in parts):
                out["content"] = "".join(p["text"] for p in parts)
            else:
                out["content"] = parts
            if thinking and role == "assistant":
                out["reasoning_content"] = thinking
        else:
            out["content"] = content if content is not None else ""
        if m.get("tool_calls"):
            out["tool_calls"] = m["tool_calls"]
        if role == "tool":
            out["tool_call_id"] = m.get("tool_call_id")
        chat.append(out)
    result: dict[str, object] = {"messages": chat}
    tools = [{"type": "function", "function": {"name": t.get("name", ""), "description": t.get("description", ""),
                                               "parameters": t.get("input_schema", {})}}
             for t in body.get("tools") or [] if isinstance(t, dict)]
    if tools:
        result["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "auto":
            result["tool_choice"] = "auto"
        elif kind in ("any", "tool"):
            result["tool_choice"] = "required"
        elif kind == "none":
            result["tool_choice"] = "none"
    if "stop_sequences" in body:
        result["stop"] = body["stop_sequences"]
    result["max_tokens"] = body.get("max_tokens", 4096)
    for key in _PASSED_ON:
        if key in body:
            result[key] = body[key]
    _reasoning(body, result)
    return result


_EFFORT = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


def _reasoning(body: JsonObject, result: JsonObject) -> None:
    """``thinking`` / ``output_config`` / ``context_management`` as far as llama-server honours them (the table in
    the module docstring); what it cannot honour is dropped and logged at debug."""
    kwargs = dict(body["chat_template_kwargs"]) if isinstance(body.get("chat_template_kwargs"), dict) else {}
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind in ("enabled", "adaptive", "disabled"):
        kwargs.setdefault("enable_thinking", kind != "disabled")  # the client's own kwargs win
        if kind == "enabled" and isinstance(thinking, dict):  # a kind is read from a dict only
            result["thinking_budget_tokens"] = thinking.get("budget_tokens", 10000)
    elif thinking is not None:
        log.debug("anthropic: thinking %r has no llama-server equivalent; dropped", kind)
    if kwargs:
        result["chat_template_kwargs"] = kwargs
    config = body.get("output_config")
    if isinstance(config, dict):
        effort = config.get("effort")
        if effort in _EFFORT:
            result["reasoning_effort"] = _EFFORT[effort]
        elif effort is not None:
            log.debug("anthropic: output_config.effort %r has no llama-server equivalent; dropped", effort)
        fmt = config.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            result["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema") or {}}}
        elif fmt is not None:
            log.debug("anthropic: output_config.format %r dropped", fmt.get("type") if isinstance(fmt, dict) else fmt)
        dropped = sorted(set(config) - {"effort", "format"})
        if dropped:
            log.debug("anthropic: output_config keys %s have no llama-server equivalent; dropped", dropped)
    if body.get("context_management") is not None:
        log.debug("anthropic: context_management (server-side context editing) dropped: llama-server has none")


def _usage(final: dict[str, object], report: CacheReport | None) -> dict[str, int]:
    """Anthropic's ``usage`` from the engine's cache report of a chat answer (or event); the output tokens from
    the chat ``usage`` when it has them. No report: the chat ``usage`` alone, nothing counted as cached."""
    raw_usage = final.get("usage")
    usage = raw_usage if isinstance(raw_usage, dict) else {}
    completion = usage.get("completion_tokens")
    if report is not None:
        output: int = completion if is_int(completion) else report.generated_tokens
        return {"cache_read_input_tokens": report.cached_tokens, "input_tokens": report.new_tokens,
                "output_tokens": output}
    prompt = usage.get("prompt_tokens")
    return {"cache_read_input_tokens": 0, "input_tokens": prompt if is_int(prompt) else 0,
            "output_tokens": completion if is_int(completion) else 0}


def _tool_input(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def _event(name: str, data: JsonObject) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


class AnthropicTranslator:
    """Translates one chat-completions answer (whole or streamed) into the Anthropic Messages dialect."""

    def __init__(self, report: ReportReader, turn_capped: bool = False) -> None:
        self._report = report  # the engine's reader of an answer's cache report (``Engine.cache_report``)
        # the request's max_tokens was lowered to a spawned base model's cap: stopping there ends the turn
        self._stops = _CAPPED_STOP if turn_capped else _STOP
        self._buf = b""
        self._started = False
        self._stopped = False
        self._block: tuple[str, object] | None = None  # the open content block: (kind, tool-call index)
        self._index = -1
        self._stop_reason: str | None = None
        self._usage: dict[str, int] = {}
        self._first: JsonObject | None = None  # the first chunk (its id and model), held until message_start goes out

    # Whole answers ----------------------------------------------------------------------------------------
    def body(self, status: int, raw: bytes) -> bytes:
        try:
            data = json.loads(raw)
        except ValueError:
            return raw
        if not isinstance(data, dict):
            return raw
        if status >= 400 or "error" in data:
            return json.dumps(anthropic_error(data)).encode()
        choice = (data.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        content: list[JsonObject] = []
        if msg.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
        if msg.get("content"):
            content.append({"type": "text", "text": msg["content"]})
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            content.append({"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""),
                            "input": _tool_input(fn.get("arguments"))})
        out = {"id": data.get("id", ""), "type": "message", "role": "assistant", "content": content,
               "model": data.get("model", ""), "stop_reason": self._stops.get(choice.get("finish_reason"), "end_turn"),
               "stop_sequence": None, "usage": _usage(data, self._report(data))}
        return json.dumps(out, ensure_ascii=False).encode()

    # Streams ----------------------------------------------------------------------------------------------
    def stream(self, chunk: bytes) -> bytes:
        """Complete SSE events of the chat stream in, Anthropic events out."""
        out = []
        for event in chunk.replace(b"\r\n", b"\n").split(b"\n\n"):
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    out.append(self.end())
                    continue
                try:
                    data = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(data, dict):
                    out.append(self._chunk(data))
        return b"".join(out)

    def end(self) -> bytes:
        """Close the message (at ``[DONE]``, or when the upstream stream ended without one)."""
        if self._stopped or (not self._started and self._first is None):
            return b""
        out = self._start(self._first or {}) if not self._started else b""
        self._stopped = True
        usage = {"output_tokens": self._usage.get("output_tokens", 0),
                 "input_tokens": self._usage.get("input_tokens", 0),
                 "cache_read_input_tokens": self._usage.get("cache_read_input_tokens", 0)}
        return (out + self._close_block() + _event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": self._stop_reason or "end_turn", "stop_sequence": None},
            "usage": usage}) + _event("message_stop", {"type": "message_stop"}))

    def _chunk(self, data: JsonObject) -> bytes:
        if "error" in data:
            self._stopped = True
            return _event("error", anthropic_error(data))
        report = self._report(data)
        if report is not None or isinstance(data.get("usage"), dict):
            self._usage = _usage(data, report)
        out = b""
        if not self._started:
            if self._first is None:
                self._first = data
            choices = data.get("choices") or []
            if not self._usage and not any((c.get("delta") or {}).get(k) for c in choices if isinstance(c, dict)
                                           for k in ("content", "reasoning_content", "tool_calls")):
                return b""  # llama-server's role-only first event: its counts ride on the next event
            out += self._start(self._first)
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._open("thinking", None, {"type": "thinking", "thinking": ""})
                out += self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]})
            if delta.get("content"):
                out += self._open("text", None, {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                out += self._open("tool_use", call.get("index", 0), {
                    "type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""), "input": {}})
                if fn.get("arguments"):
                    out += self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]})
            if choice.get("finish_reason"):
                self._stop_reason = self._stops.get(choice["finish_reason"], "end_turn")
        return out

    def _start(self, first: JsonObject) -> bytes:
        """``message_start`` with the prompt's counts when the upstream gave them by now (``timings_per_token``),
        as llama-server's own /v1/messages does: ``input_tokens`` uncached, ``cache_read_input_tokens`` cached."""
        self._started = True
        usage = {"input_tokens": self._usage.get("input_tokens", 0),
                 "cache_read_input_tokens": self._usage.get("cache_read_input_tokens", 0), "output_tokens": 0}
        return _event("message_start", {"type": "message_start", "message": {
            "id": first.get("id", ""), "type": "message", "role": "assistant", "content": [],
            "model": first.get("model", ""), "stop_reason": None, "stop_sequence": None, "usage": usage}})

    def _open(self, kind: str, key: object, block: JsonObject) -> bytes:
        if self._block == (kind, key):
            return b""
        out = self._close_block()
        self._index += 1
        self._block = (kind, key)
        return out + _event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                    "content_block": block})

    def _delta(self, delta: JsonObject) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _close_block(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self._index})
