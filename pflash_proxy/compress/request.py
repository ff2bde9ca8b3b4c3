"""Find the request (what is being asked) for a long message.

Algorithm (``RequestFinder``):
1. Flatten each message's content: a string, or the ``text`` of its
   ``{"type": "text"}`` parts joined by newlines (other parts are ignored).  Taken as
   a request (steps 3-4), a message's text leaves out the ``<system-reminder>…
   </system-reminder>`` blocks a client adds to user turns (Claude Code: environment,
   date, token count): they are the harness's, not the question, and their words
   would rank whatever else mentions files, tokens or dates; a user message that is
   only reminders is no request.
2. Long **user** message followed by a user message of its own (a paste, then the question): the latest such
   user message, no pin.  Otherwise the request is the text after the bulk: the last paragraph
   (blank-line separated), plus earlier paragraphs while what is taken is under
   ``min_request_tokens`` (32) and all stays within ``query_pin`` tokens; if the last
   paragraph alone exceeds ``query_pin``, the trailing *lines* up to ``query_pin``
   tokens (at least the last non-blank line).  The pin is
   ``pinned_tail_tokens = query_pin``: the compressor always keeps the units holding
   the trailing lines that sum to at most ``query_pin`` tokens.
3. Long **tool** message (``role == "tool"`` or legacy ``"function"``): the task
   (latest user message before it) plus the assistant turn that issued the call:
   its text and the matching ``tool_calls`` entry (by ``tool_call_id``; all calls of
   the nearest assistant turn when no id matches) as ``name(arguments)``.  No pin.
4. Any other long message (system, assistant): the latest user message anywhere
   else in the list; no pin.  With no user message at all, the message's own tail.
5. Plain ``/completion`` prompt: the trailing lines up to ``query_pin`` tokens are the
   request and are pinned.
Token counts come from the caller's ``TokenizedText`` when given, else from
``approx_line_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Literal

from .text import TokenizedText, approx_line_tokens, split_lines

__all__ = ["RequestFinder", "RequestSpec", "message_text", "request_tail", "request_text", "tail_lines",
           "without_paths"]

RequestSource = Literal["message-tail", "latest-user", "tool-call", "prompt-tail", "none"]
_PATH = re.compile(r"[^\s\"'`()\[\]{},;]*/[^\s\"'`()\[\]{},;]*")
_EXT = re.compile(r"\.[A-Za-z0-9]{1,8}$")
_TOKEN = re.compile(r"[^\s\"'`()\[\]{},;]+")
_CALL = re.compile(r"^[A-Za-z_][\w.-]*\((?=[{\[])", re.M)
_KEY = re.compile(r"\"[A-Za-z_][\w-]*\"\s*:")
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>[ \t]*\n?", re.S)


@dataclass(frozen=True)
class RequestSpec:
    text: str
    pinned_tail_tokens: int
    source: RequestSource


def message_text(msg: Mapping[str, object]) -> str:
    """Step 1: the text of a chat message's content."""
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type") in ("text", "input_text") and isinstance(p.get("text"), str):
                parts.append(p["text"])
        return "\n".join(parts)
    return str(content)


def request_text(msg: Mapping[str, object]) -> str:
    """Step 1: a message's text as a request, without the client's ``<system-reminder>`` blocks."""
    text = message_text(msg)
    return _REMINDER.sub("", text).strip() if "<system-reminder>" in text else text


def tail_lines(lines: list[str], line_tokens: list[int], limit: int, *, paragraphs: bool) -> int:
    """Index of the first line of the request tail (steps 2 and 5).

    With ``paragraphs``, whole trailing paragraphs within ``limit`` tokens; if none fits,
    falls back to trailing lines within ``limit``.  Always includes the last non-blank
    line.  Returns ``len(lines)`` for an all-blank text.
    """
    n = len(lines)
    end = n
    while end > 0 and not lines[end - 1].strip():
        end -= 1
    if end == 0:
        return n
    first = end - 1
    total = line_tokens[first]
    i = first
    while i > 0 and total + line_tokens[i - 1] <= limit:
        i -= 1
        total += line_tokens[i]
    if not paragraphs:
        return i
    # back up to a paragraph start: the first line in [i, end) that follows a blank line
    for j in range(i, end):
        if j == 0 or not lines[j - 1].strip():
            return j if j < end else i
    return i


def request_tail(lines: list[str], line_tokens: list[int], limit: int, min_tokens: int) -> int:
    """Index of the first line of the request paragraph(s) at the end of a message (step 2)."""
    pin_start = tail_lines(lines, line_tokens, limit, paragraphs=False)
    end = len(lines)
    while end > 0 and not lines[end - 1].strip():
        end -= 1
    start = None
    for j in range(end - 1, pin_start - 1, -1):
        if lines[j].strip() and (j == 0 or not lines[j - 1].strip()):
            start = j
            if sum(line_tokens[start:end]) >= min_tokens:
                break
    return pin_start if start is None else start


@dataclass(frozen=True)
class RequestFinder:
    query_pin: int = 512
    min_request_tokens: int = 32

    def find(self, messages: list[dict[str, Any]], long_index: int,
             long_tt: TokenizedText | None = None) -> RequestSpec:
        """The request for ``messages[long_index]`` (steps 2-4)."""
        if not 0 <= long_index < len(messages):
            raise IndexError(f"long_index {long_index} outside {len(messages)} messages")
        msg = messages[long_index]
        role = msg.get("role")
        if role == "user":
            later = next((message_text(m) for m in reversed(messages[long_index + 1:])
                          if m.get("role") == "user" and message_text(m).strip()), None)
            if later is not None:  # a paste followed by the question in a message of its own
                return RequestSpec(later, 0, "latest-user")
            return self._tail(msg, long_tt, "message-tail", pin=True)
        if role in ("tool", "function"):
            return self._tool(messages, long_index)
        latest = next((t for m in reversed(messages) if m is not msg and m.get("role") == "user"
                       for t in (request_text(m),) if t.strip()), None)
        if latest is not None:
            return RequestSpec(latest, 0, "latest-user")
        return self._tail(msg, long_tt, "message-tail", pin=False)

    def find_in_prompt(self, prompt: str | TokenizedText) -> RequestSpec:
        """Step 5: the tail of a plain completion prompt, pinned."""
        tt = prompt if isinstance(prompt, TokenizedText) else TokenizedText.from_text(prompt)
        start = tail_lines(tt.lines, tt.line_tokens, self.query_pin, paragraphs=False)
        return RequestSpec("".join(tt.lines[start:]), self.query_pin if start < len(tt.lines) else 0, "prompt-tail")

    def _tail(self, msg: Mapping[str, object], tt: TokenizedText | None, source: RequestSource, pin: bool) -> RequestSpec:
        if tt is None:
            text = message_text(msg)
            lines = split_lines(text)
            counts = approx_line_tokens(lines)
        else:
            lines, counts = tt.lines, tt.line_tokens
        start = request_tail(lines, counts, self.query_pin, self.min_request_tokens)
        if start >= len(lines) or not "".join(lines[start:]).strip():
            return RequestSpec("", 0, "none")
        return RequestSpec("".join(lines[start:]), self.query_pin if pin else 0, source)

    def _tool(self, messages: list[dict[str, Any]], idx: int) -> RequestSpec:
        tool_msg = messages[idx]
        call_id = tool_msg.get("tool_call_id")
        task = next((t for m in reversed(messages[:idx]) if m.get("role") == "user"
                     for t in (request_text(m),) if t.strip()), "")
        parts = [task] if task else []
        caller = None
        for m in reversed(messages[:idx]):
            calls = m.get("tool_calls") or []
            if m.get("role") != "assistant":
                continue
            if call_id is not None and any(isinstance(c, dict) and c.get("id") == call_id for c in calls):
                caller = (m, [c for c in calls if isinstance(c, dict) and c.get("id") == call_id])
                break
            if caller is None and (calls or m.get("function_call")):
                caller = (m, [c for c in calls if isinstance(c, dict)])
                if call_id is None:
                    break
        if caller is not None:
            m, calls = caller
            if request_text(m).strip():
                parts.append(request_text(m))
            if m.get("function_call"):
                calls = calls + [{"function": m["function_call"]}]
            for c in calls:
                fn = c.get("function") or {}
                args = fn.get("arguments", "")
                if not isinstance(args, str):
                    args = str(args)
                parts.append(f"{fn.get('name', '')}({args})")
        elif tool_msg.get("name"):
            parts.append(str(tool_msg["name"]))
        text = "\n".join(parts)
        return RequestSpec(text, 0, "tool-call" if text else "none")


def without_paths(text: str) -> str:
    """The request as a scorer ranks the lines of a file read by (``pipeline`` step 3, code): what names the file
    or the tool call rather than a part of the file left out.
    1. File paths: a token with a ``/`` and a file extension, or with two ``/`` (``/work/pkg/mod.py``,
       ``pkg/mod.py``), and any token that is the tail of one of them after a ``/`` (``mod.py``): the path names the
       whole file; its words match the file's header and imports, not the part asked about.
    2. A tool call's own vocabulary, as ``RequestFinder`` writes a call (``name({"key": ...})`` on its own line):
       its name and the keys of its arguments (``Read``, ``file_path``, ``command``); the values stay.
    """
    paths = {p for p in _PATH.findall(text) if p.count("/") >= 2 or _EXT.search(p)}
    drop = paths | {"/".join(p.split("/")[k:]) for p in paths for k in range(1, p.count("/") + 1)}
    text = _CALL.sub("(", text)
    text = _KEY.sub(" ", text)
    return _TOKEN.sub(lambda m: " " if m.group().strip(".,:;!?") in drop else m.group(), text)
