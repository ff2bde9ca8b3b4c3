"""API dialects at the edge: OpenAI chat completions, Anthropic Messages, OpenAI Responses.

Every stage (identity, served history, slot pinning, snapshots, compression, recall) works on ONE internal
conversation: a list of OpenAI-chat-shaped messages (``role``, ``content`` as a string or parts,
``tool_calls``, ``tool_call_id``, ``name``). A dialect translates at the edge, both ways:

1. ``parse(body)`` → ``Conversation``: the internal messages, and for each the place in the client's body it
   came from (an Anthropic ``tool_result`` block is a ``tool`` message; a Responses ``function_call_output``
   item is one too; ``system``/``instructions`` are a system message).
2. The stages replace message *content* only (served versions, a compressed tool output, a recall block).
3. ``write_back(body, conversation, messages)`` puts the changed texts back into the client's own structure;
   everything the proxy did not change stays as the client sent it, so the upstream sees the same tokens
   turn after turn. A message whose text is the same in another shape (a served history recorded from another
   dialect: ``[]`` for ``None``, one text part for a string) is not written back (``text_changed``).
4. ``chat_body`` is the conversation as a chat body: the engine counts a prompt from a chat body
   (``Engine.count_prompt``; llama-server converts every dialect to chat internally), so it counts it exactly.
   What the prefix cache served is read from an answer by the engine too (``Engine.cache_report``).
5. Errors: a non-streamed error in the dialect's own shape; ``error_event`` ends a stream that already started.
6. Hostile bodies: ``parse`` refuses (400, ``BadRequest``) a body nested deeper than ``MAX_DEPTH`` containers
   (the session index stores messages: a recursion limit is a crash, not an answer) and, per dialect, every
   field the proxy reads or translates itself whose type is wrong (a text part's ``text`` that is not a string…),
   so nothing the client sent reaches a stage, or llama-server, in a shape that fails there.
   ``check_tool_arguments`` applies the same rules to the JSON inside a tool call's ``arguments`` string, which
   the session identity parses: nested deeper than ``MAX_DEPTH``, or holding a lone surrogate escape → 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeGuard

from aiohttp import web

from pflash_proxy.engine import CacheReport
from pflash_proxy.errors import BadRequest, error_response
from pflash_proxy.models import message_text

JsonObject = dict[str, Any]  # a JSON object as ``json.loads`` gives it (a body, a message, a part)
ReportReader = Callable[[Mapping[str, object] | None], CacheReport | None]  # ``Engine.cache_report``


class Translator(Protocol):
    """An answer of the upstream route in a dialect's own shape: a whole body, or a stream's events."""

    def body(self, status: int, raw: bytes) -> bytes: ...
    def stream(self, chunk: bytes) -> bytes: ...
    def end(self) -> bytes: ...

__all__ = ["Conversation", "Dialect", "JsonObject", "ReportReader", "Translator", "MAX_DEPTH", "StreamStyle", "check_depth",
           "check_tool_arguments", "replace_text"]

MAX_DEPTH = 100  # containers nested in a request body; agents' deepest (tool JSON schemas) stay near 15


def check_depth(body: object, limit: int = MAX_DEPTH) -> None:
    """400 when ``body`` nests more than ``limit`` lists/objects. Iterative: the check itself never recurses."""
    stack = [(body, 1)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, (dict, list)):
            if depth > limit:
                raise BadRequest(f"invalid request: JSON nested deeper than {limit} levels", code="invalid_request")
            stack.extend((v, depth + 1) for v in (x.values() if isinstance(x, dict) else x))


def check_tool_arguments(messages: list[JsonObject]) -> None:
    """400 when a tool call's ``arguments`` string holds JSON nested deeper than ``MAX_DEPTH`` (parsing it would
    recurse past Python's limit) or a string with a lone UTF-16 surrogate escape (``"\\ud800"``: no UTF-8 text can
    hold one). Only strings that could be either (brackets beyond the limit, a ``\\u`` escape) are parsed."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if not isinstance(args, str) or ("\\u" not in args and
                                             args.count("[") + args.count("{") <= MAX_DEPTH):
                continue
            where = f"messages.{i}.tool_calls.{j}.function.arguments"
            try:
                value = json.loads(args)
            except RecursionError:
                raise BadRequest(f"invalid request: {where}: JSON nested deeper than {MAX_DEPTH} levels",
                                 code="invalid_request") from None
            except ValueError:
                continue  # not JSON: passed on as text
            try:
                check_depth(value)
            except BadRequest:
                raise BadRequest(f"invalid request: {where}: JSON nested deeper than {MAX_DEPTH} levels",
                                 code="invalid_request") from None
            if holds_surrogate(value):
                raise BadRequest(f"invalid request: {where}: a string holds a lone UTF-16 surrogate escape "
                                 "(e.g. \\ud800)", code="invalid_request")


def holds_surrogate(value: object) -> bool:
    """Whether a string anywhere in the parsed JSON ``value`` (keys included) holds a lone UTF-16 surrogate, which
    no UTF-8 text can carry. Iterative: depth is not a risk."""
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


def expect(ok: bool, where: str, what: str) -> None:
    """400 ``invalid request: {where}: {what}`` unless ``ok``."""
    if not ok:
        raise BadRequest(f"invalid request: {where}: {what}", code="invalid_request")


def is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class Conversation:
    messages: list[JsonObject]  # internal, OpenAI-chat-shaped
    origins: list[Any] = field(default_factory=list)  # per message: where it lives in the client's body


class StreamStyle:
    """How a stream that already started ends with an error (OpenAI routes end every stream with [DONE])."""

    done = False

    def error_event(self, err: JsonObject) -> bytes:
        return b"data: " + json.dumps(err).encode() + b"\n\n" + (b"data: [DONE]\n\n" if self.done else b"")


class OpenAIStream(StreamStyle):
    done = True


_ANTHROPIC_TYPES = {"invalid_request_error": "invalid_request_error", "authentication_error": "authentication_error",
                    "permission_error": "permission_error", "not_found_error": "not_found_error",
                    "rate_limit_error": "rate_limit_error", "unavailable_error": "overloaded_error"}


def anthropic_error(err: JsonObject) -> JsonObject:
    """An OpenAI-shaped error body in Anthropic's shape."""
    raw = err.get("error")
    inner = raw if isinstance(raw, dict) else {}
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(str(inner.get("type")), "api_error"),
                                       "message": str(inner.get("message", "error"))}}


class AnthropicStream(StreamStyle):
    def error_event(self, err: JsonObject) -> bytes:
        return b"event: error\ndata: " + json.dumps(anthropic_error(err)).encode() + b"\n\n"


class ResponsesStream(StreamStyle):
    def error_event(self, err: JsonObject) -> bytes:
        raw = err.get("error")
        inner = raw if isinstance(raw, dict) else {}
        event = {"type": "error", "code": str(inner.get("code", "error")), "message": str(inner.get("message", "")),
                 "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"


def cap_turn(chat: JsonObject, cap: int) -> bool:
    """Lower the chat body's ``max_tokens`` to ``cap`` (a spawned base model's, ``llama/spawn.py`` step 3);
    True when it was higher (the answer's stop at the cap is then the end of its turn)."""
    if cap <= 0 or not isinstance(chat.get("max_tokens"), int) or chat["max_tokens"] <= cap:
        return False
    chat["max_tokens"] = cap
    return True


class Dialect:
    """Base: the OpenAI chat-completions dialect is the identity translation (see ``chat.ChatDialect``)."""

    name = "chat"
    paths: tuple[str, ...] = ()  # the routes whose bodies this dialect parses (``registry.DIALECTS``)
    stream_style: StreamStyle = OpenAIStream()
    upstream_path: str | None = None  # set when the body travels to another llama-server route (translated)

    def parse(self, body: JsonObject) -> Conversation:
        raise NotImplementedError

    def write_back(self, body: JsonObject, conv: Conversation, messages: list[JsonObject]) -> JsonObject:
        raise NotImplementedError

    def chat_body(self, body: JsonObject, messages: list[JsonObject]) -> JsonObject:
        return {**body, "messages": messages}

    def to_upstream(self, body: JsonObject, messages: list[JsonObject]) -> JsonObject:
        """The body for ``upstream_path`` (only dialects that set it)."""
        raise NotImplementedError

    def translator(self, report: ReportReader, turn_capped: bool = False) -> Translator | None:
        """Translates the answer of ``upstream_path`` back into this dialect (``body``, ``stream``, ``end``);
        ``report`` reads the cache report of an answer or event (``Engine.cache_report``); ``turn_capped``: the
        request's ``max_tokens`` was lowered to a spawned base model's cap, so stopping there is the end of its
        turn (``llama/spawn.py``, step 3)."""
        return None

    def session_name(self, body: JsonObject) -> str | None:
        """A conversation name the client sends on its own in the body (none for chat)."""
        return None

    def prepare(self, body: JsonObject, drop_volatile: bool) -> JsonObject | None:
        """A body with volatile parts removed before identity and forwarding, or None when nothing changes."""
        return None

    def error_response(self, status: int, message: str, code: str | None = None,
                       headers: Mapping[str, str] | None = None, type_: str | None = None) -> web.Response:
        """An error in this dialect's shape (OpenAI's: ``errors.error_response``)."""
        return error_response(status, message, code, type_, headers)


def changed_indices(old: list[JsonObject], new: list[JsonObject]) -> list[int]:
    if len(old) != len(new):
        raise ValueError(f"a stage changed the number of messages ({len(old)} → {len(new)}); only content may change")
    return [i for i, (a, b) in enumerate(zip(old, new)) if a.get("content") != b.get("content")]


def text_changed(old: list[JsonObject], new: list[JsonObject]) -> list[int]:
    """The messages whose *text* a stage changed. A served history recorded from another dialect may hold the
    same text in another shape (``[]`` for ``None``, a string for one text part): nothing to write back there,
    and a message with no text place (a Responses ``function_call``) must not fail the request for it."""
    return [i for i in changed_indices(old, new)
            if message_text(old[i].get("content")) != message_text(new[i].get("content"))]


def replace_text(content: object, text_idx: list[int] | None, text: str, part_type: str = "text") -> object:
    """``content`` (a string or parts) with its text (the parts at ``text_idx``) replaced by ``text``: the first
    of them keeps its other keys and gets the text, the others go; every other part stays. A new part (of
    ``part_type``, the dialect's text part) leads when the content had no text part."""
    if not isinstance(content, list) or text_idx is None:
        return text
    if not text_idx:
        return [{"type": part_type, "text": text}, *content]
    first, drop = text_idx[0], set(text_idx[1:])
    out = []
    for j, part in enumerate(content):
        if j == first:
            out.append({**part, "text": text} if isinstance(part, dict) else {"type": part_type, "text": text})
        elif j not in drop:
            out.append(part)
    return out


