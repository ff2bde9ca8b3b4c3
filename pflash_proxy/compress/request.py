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
   user message, no pin.  Otherwise the question is found by its form (``question_span``): the user's own
   words at the end of the message (a paste followed by its question) or, when none, at its start (a question
   followed by its paste): a short run of prose lines (``prose_line``: words, not code, records or numbered
   file lines; the client's ``<system-reminder>`` blocks skipped) after or before a body that is not, or,
   after a prose body, its last paragraphs while they ask something (``asks``: a sentence ending in ``?``, or
   an imperative or question word first).  That question is the scorer's query (``source: question``) and
   its lines are always kept (``kept_lines``); the message tail stays pinned (``pinned_tail_tokens``) for
   recency but its words never dilute the query.  With no question by form, the request is the text after
   the bulk (``source: message-tail``, the old rule): the last paragraph
   (blank-line separated), plus earlier paragraphs while what is taken is under
   ``min_request_tokens`` (32) and all stays within ``query_pin`` tokens; if the last
   paragraph alone exceeds ``query_pin``, the trailing *lines* up to ``query_pin``
   tokens (at least the last non-blank line).  The pin is
   ``pinned_tail_tokens = query_pin``: the compressor always keeps the units holding
   the trailing lines that sum to at most ``query_pin`` tokens.
3. Long **tool** message (``role == "tool"`` or legacy ``"function"``): the user's words after it (a text
   the client sends with a tool result, as Claude Code's user turn does beside its ``tool_result``), the task
   (latest user message before it; when that message is itself long, a paste with its question, only the
   question by form, ``question_text``) plus the assistant turn that issued the call (the user's words alone are
   ``user_text``: an agent's narration, "Let me look at rrule.py to find where this is handled", asks nothing):
   its text and the matching ``tool_calls`` entry (by ``tool_call_id``; all calls of
   the nearest assistant turn when no id matches) as ``name(arguments)``.  No pin.
4. Any other long message (system, assistant): the latest user message anywhere
   else in the list; no pin.  With no user message at all, the message's own tail.
5. Plain ``/completion`` prompt: the question by its form (step 2) when it has one, else the trailing lines
   up to ``query_pin`` tokens are the request; the tail is pinned either way.
6. A follow-up user turn, recall's query (``follow_up_query``): the same question as step 2 would find, its
   text without the client's reminders (a long turn: its question by form).
Token counts come from the caller's ``TokenizedText`` when given, else from
``approx_line_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Literal

from .text import TokenizedText, approx_line_tokens, split_lines

__all__ = ["RequestFinder", "RequestSpec", "asks", "follow_up_query", "joined_text", "prose_line", "question_span", "question_text",
           "request_tail", "request_text", "tail_lines", "without_paths"]

RequestSource = Literal["question", "message-tail", "latest-user", "tool-call", "prompt-tail", "none"]
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
    kept_lines: tuple[int, int] | None = None  # step 2: the question's lines in the message (start, end), kept
    user_text: str | None = None  # step 3: the user's own words of ``text`` (not the agent's narration and call),
    # what asks for every match or for one thing; None: all of ``text``


def joined_text(msg: Mapping[str, object]) -> str:
    """Step 1: the text a chat message holds, as the compressor reads it: its content's text parts (plain strings,
    ``text`` and ``input_text`` parts) joined by line breaks; unlike ``models.message_text``, which takes a content
    and concatenates its ``text`` parts as they are."""
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
    text = joined_text(msg)
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


# Step 2: the form of a question. A line of prose: words, not code, records or numbered lines.
_GUTTER = re.compile(r"^\s*\d+(?:\t|→|: |\| )")
_INDENTED = re.compile(r"^(?: {4,}|\t)\S")
_COMMENT = re.compile(r"^\s*(?:#|//|/\*|\*|--|;|%|\"\"\"|\'\'\'|```)")
_KEYWORD = re.compile(r"^(?:def|class|if|elif|else|for|while|return|import|from|try|except|finally|with|async|await|"
                      r"var|let|const|function|fn|pub|use|func|package|public|private|static|end|do|done|fi)\b")
_LETTERS = re.compile(r"[^\W\d_]{2,}")
_SYMBOLS = re.compile(r"[{}\[\]()<>=;|\\$@#*`]|(?<=\w)[._](?=\w)|->|::")
_QUESTION_END = re.compile(r"(?<=[^\W_]|[)\"'”’*`])\?(?:[\s\"'”’)*_]|$)")
_FIELD = re.compile(r"(?:^|[\s|,;])[\w.-]+: \S")
_LABEL = re.compile(r"^[^\W\d_][\w ]{0,24}:$")
_ASKS_MARK = re.compile(r"\?(?:[\s\"'”’)\]*_]|$)")
_FIRST_WORD = re.compile(r"[^\W\d_]+")
_OPENING = frozenset("""
what which who whom whose when where why how is are was were do does did can could would should will shall may
might must has have had please explain describe summarize summarise list find tell show give write fix identify name
extract compare answer count check review refactor translate rewrite update add remove change make implement debug
help locate point quote cite walk suggest spot look read go determine outline enumerate state trace return print
tl summary overview recap gist
""".split())
USER_PARAGRAPHS, USER_TOKENS, USER_LINES = 3, 256, 2  # step 2: the most a user writes beside a paste, taken
# whole (beside the question, paragraphs of at most USER_LINES lines and USER_LINE_TOKENS tokens: a document's
# own paragraphs run longer, RULER's "Document 12:" and its one-line paragraph too)
USER_LINE_TOKENS = 64
_CONNECTIVE = re.compile(r"^(?:(?:then|and|also|so|now|next|finally|first|second|lastly|afterwards|please)\b[,\s]*)+",
                         re.I)
_IMPERATIVE = re.compile(r"([A-Za-z]+)\s+(?:the|all|every|each|this|these|those|my|our|a|an|it|them|me|us|any|"
                         r"some)\b")
_NOT_VERB_FIRST = frozenset("""
the a an this that these those it its they them he she we you i my our your their his her all every each any some
no not in on at for of to with by as from into onto over under about after before between through and or but so
if when while because although though since until unless is are was were be been being am has have had will would
shall should may might must can could there here then than also only even just very such both either neither one
""".split())
# a sentence whose last word is "please" ("Every call site of retry, please.", "The callers too please!")
_PLEASE_LAST = re.compile(r"\bplease\s*[.!]*[\s\"'”’)\]]*(?:\n|$)", re.I)
# a line that opens with "every", "each" or "all" (and "the"/"of the") and then the thing wanted, a noun phrase
# and no verb of its own after it: "Every call site of retry", "All the handlers that log errors" (a statement
# such as "All tests pass." or "Every worker restarts on failure" has its verb second)
_WANTED = re.compile(r"(?:every|each|all)(?:\s+of)?(?:\s+(?:the|these|those|its|my|our))?\s+[A-Za-z][\w-]*"
                     r"(?:\s+[A-Za-z][\w-]*)?\s+(?:of|in|to|that|which|where|who|for|from|with|using|calling)\b",
                     re.I)
QUESTION_LINES = 8  # step 2: the most lines a question after a prose body takes
_QUESTION_WORDS = frozenset("what which who whom whose when where why how is are was were do does did can could would "
                            "should will shall may might must has have had".split())
REQUEST_SHARE = 0.5  # step 2: the user's words are less than this share of the message's tokens


def prose_line(line: str) -> bool:
    """Step 2: a line of words (a sentence, a question, a short ``Label:``), not code, a record (fields between
    bars or tabs, two ``key: value`` pairs), a comment or a numbered file line. Indented lines are a pasted
    block's; a line with a sentence ending in ``?`` is prose whatever else it holds."""
    t = line.strip()
    if not t or _GUTTER.match(line) or _INDENTED.match(line) or _COMMENT.match(t):
        return False
    if _QUESTION_END.search(t) and len(_LETTERS.findall(t)) >= 3:
        return True  # a sentence that ends in "?" (not a ternary "a ? b : c"), whatever else the line holds
    if _KEYWORD.match(t) or t.count("|") >= 2 or "\t" in t or len(_FIELD.findall(t)) >= 2:
        return False  # code, or a record: fields between bars or tabs, ``key: value`` pairs
    if _LABEL.match(t):
        return True
    words = _LETTERS.findall(t)
    if len(words) < 2:
        return False
    letters = sum(len(w) for w in words)
    return letters >= 0.6 * len(t) and len(_SYMBOLS.findall(t)) <= max(2, len(t) // 40)


def asks(text: str) -> bool:
    """Step 2: the text asks something: a sentence ending in ``?``, or with "please" as its last word ("Every call
    site of retry, please."), or it opens (or one of its lines does) with a question or imperative word
    ("Explain ...", "List ...", "Why ...", "please ..."), with "every", "each" or "all" and the thing wanted ("Every
    call site of retry", "All the handlers that log"), or in the form of an imperative: a word that is no
    determiner, pronoun, preposition or auxiliary, then a determiner or pronoun ("Catalogue all the constants",
    "Convert every function ...", "Grep this for ...")."""
    if _ASKS_MARK.search(text) or _PLEASE_LAST.search(text):
        return True
    prev = "."
    for line in text.splitlines():
        t = line.strip().lstrip("-*>#0123456789.) ")
        starts = prev.rstrip().rstrip(")]\"'”’").endswith((".", "!", "?", ":", ";")) or not prev.strip()
        prev = line
        if not starts:
            continue  # a hard-wrapped line goes on with a sentence: its first word opens nothing
        for clause in [t] + [c.strip() for c in re.split(r"[,;:]\s+", t)[1:]]:  # "In X, list all the steps"
            clause = _CONNECTIVE.sub("", clause)  # "Then list every date"
            m = _FIRST_WORD.search(clause)
            if m and m.start() == 0 and m.group().lower() in _OPENING:
                return True
            if starts and clause is t and _WANTED.match(clause):
                return True  # "Every call site of retry", "All the places that call it": the thing wanted
            m = _IMPERATIVE.match(clause)
            if m and m.group(1).lower() not in _NOT_VERB_FIRST and not re.search(r"[^s]s$|ing$|ed$", m.group(1)):
                return True  # not "Returns the ...", "Removing every ...": a third person or a participle describes
    return False


def _reminder_mask(lines: list[str]) -> list[bool]:
    """Lines inside the client's ``<system-reminder>`` blocks (step 1): skipped when looking for the question."""
    out, inside = [], False
    for line in lines:
        opens = "<system-reminder>" in line
        out.append(inside or opens)
        if opens:
            inside = True
        if "</system-reminder>" in line:
            inside = False
    return out


def question_span(lines: list[str], line_tokens: list[int], limit: int) -> tuple[int, int] | None:
    """Step 2: the lines ``(start, end)`` of the user's question in a long message, found by its form, or None.

    1. Each line is blank (or a ``<system-reminder>`` line), prose (``prose_line``) or body.
    2. The end: the prose lines before the last non-blank line's end, walking back over prose and blank lines
       within ``limit`` tokens. Stopped by a body line, and short (at most ``USER_PARAGRAPHS`` paragraphs and
       ``USER_TOKENS`` tokens, all but the question at most ``USER_LINES`` lines and ``USER_LINE_TOKENS``
       tokens), they are the user's words
       after a paste: all of them when the last paragraph's last sentence asks something (``asks``). Otherwise (a prose body, or more than
       ``limit``): the trailing paragraphs that each ask (past the last one, only those of at most
       ``USER_LINES`` lines and ``USER_LINE_TOKENS`` tokens: a document's own paragraphs, rhetorical questions
       and all, run longer), from the
       first of their lines that asks (a question hard-wrapped into the document's last paragraph, from the line
       its sentence begins on), at most ``QUESTION_LINES`` lines whose last sentence asks.
    3. Else the start, the same way forward: before a body line and short, the paragraphs through the last
       that asks; otherwise its leading paragraphs that each ask, at least the first (a prose paste's own title
       or opening sentence that asks nothing is the paste's).
    The words taken must be under ``REQUEST_SHARE`` of the message's tokens: more is the document, not its
    question.
    """
    m = _Marked.of(lines, line_tokens)
    nonblank = [i for i in range(len(lines)) if m.kind[i] != "blank"]
    if not nonblank:
        return None
    end = nonblank[-1] + 1  # step 2: the end
    i, used = end, 0
    while i > 0 and m.kind[i - 1] != "body" and used + line_tokens[i - 1] <= limit:
        i -= 1
        used += line_tokens[i]
    found = m.pick(i, end, i > 0 and m.kind[i - 1] == "body", True, limit)
    if found is not None:
        return found
    start = nonblank[0]  # step 3: the start
    j, used = start, 0
    while j < len(lines) and m.kind[j] != "body" and used + line_tokens[j] <= limit:
        used += line_tokens[j]
        j += 1
    if j >= end:
        return None  # all prose within the limit: nothing after it to be a question about
    return m.pick(start, j, j < len(lines) and m.kind[j] == "body", False, limit)


@dataclass(frozen=True)
class _Marked:
    """A message's lines marked for ``question_span``: each blank, prose or body; reminders skipped."""

    lines: list[str]
    tokens: list[int]
    skip: list[bool]
    kind: list[str]

    @classmethod
    def of(cls, lines: list[str], tokens: list[int]) -> "_Marked":
        skip = _reminder_mask(lines)
        kind = ["blank" if skip[i] or not lines[i].strip() else "prose" if prose_line(lines[i]) else "body"
                for i in range(len(lines))]
        return cls(lines, tokens, skip, kind)

    def paragraphs(self, a: int, b: int) -> list[tuple[int, int]]:
        out, start = [], None
        for i in range(a, b):
            if self.kind[i] == "blank":
                if start is not None:
                    out.append((start, i))
                    start = None
            elif start is None:
                start = i
        if start is not None:
            out.append((start, b))
        return out

    def text(self, a: int, b: int) -> str:
        return "".join(self.lines[i] for i in range(a, b) if not self.skip[i])

    def small(self, span: tuple[int, int]) -> tuple[int, int] | None:
        return span if sum(self.tokens[span[0]:span[1]]) < REQUEST_SHARE * sum(self.tokens) else None

    def pick(self, a: int, b: int, by_body: bool, from_end: bool, limit: int) -> tuple[int, int] | None:
        """Steps 2-3 on the prose run ``[a, b)``: the user's short words beside a body, else the paragraphs that
        ask at its edge."""
        paras = self.paragraphs(a, b)
        if not paras:
            return None
        rest = paras[:-1] if from_end else paras[1:]  # beside the question: a user's short context lines
        if by_body and len(paras) <= USER_PARAGRAPHS and sum(self.tokens[a:b]) <= USER_TOKENS \
                and all(p[1] - p[0] <= USER_LINES and sum(self.tokens[p[0]:p[1]]) <= USER_LINE_TOKENS for p in rest):
            if from_end and paras[-1][1] - paras[-1][0] <= QUESTION_LINES and self._ends_asking(paras[-1]):
                return self.small((paras[0][0], paras[-1][1]))  # the user's words after a paste
            last = max((k for k, p in enumerate(paras) if asks(self.text(*p))), default=-1)
            if not from_end and last >= 0:  # before a paste: through the last paragraph that asks
                return self.small((paras[0][0], paras[last][1]))
        taken: list[tuple[int, int]] = []
        used = 0
        for p in (reversed(paras) if from_end else paras):
            size = sum(self.tokens[p[0]:p[1]])
            if not asks(self.text(*p)) or used + size > limit or (taken and (p[1] - p[0] > USER_LINES
                                                                             or size > USER_LINE_TOKENS)):
                break  # past the first, only short paragraphs: a document's own run longer
            taken.append(p)
            used += size
        if not taken:
            return None
        span = (min(p[0] for p in taken), max(p[1] for p in taken))
        if from_end:  # a prose body's last paragraph may run into the question: from its first line that asks
            first = next(i for i in range(span[0], span[1]) if self.kind[i] != "blank" and asks(self.lines[i]))
            ends = self.lines[first - 1].rstrip().rstrip(")]\"'”’") if first > span[0] else "."
            if not ends.endswith((".", "!", "?", ":", ";")):
                first -= 1  # the question's sentence began on the line before
            span = (first, span[1])
            if span[1] - span[0] > QUESTION_LINES or not self._ends_asking(span):
                return None  # a document's tail with a question word somewhere in it, not the user's question
        return self.small(span)

    def _ends_asking(self, span: tuple[int, int]) -> bool:
        """The span's last sentence asks (or it ends in a ``Label:``, as "Question: ... Answer:" does)."""
        last = next((i for i in range(span[1] - 1, span[0] - 1, -1) if self.kind[i] != "blank"), None)
        if last is None:
            return False
        line = self.lines[last].strip()
        if line.endswith(":") or _QUESTION_END.search(line):
            return True
        start = last  # back to the line the last sentence begins on
        while start > span[0] and not self.lines[start - 1].rstrip().rstrip(")]\"'”’").endswith((".", "!", "?")):
            start -= 1
        tail = re.split(r"(?<=[.!?])\s+", self.text(start, last + 1).strip())[-1]
        first = _FIRST_WORD.search(tail)  # a question word needs its "?" here: "Is a program, like a proof, ..."
        return asks(tail) and not (first is not None and first.start() == 0 and first.group().lower() in _QUESTION_WORDS
                                   and tail.rstrip().endswith("."))


def question_text(text: str, limit: int = 512) -> str:
    """The question by form (``question_span``) of a long message's text, or the text itself when it has none or
    is no longer than ``limit`` tokens (a short message is all question)."""
    lines = split_lines(text)
    counts = approx_line_tokens(lines)
    if sum(counts) <= limit:
        return text
    span = question_span(lines, counts, limit)
    if span is None:
        return text
    mask = _reminder_mask(lines)
    return "".join(lines[i] for i in range(*span) if not mask[i])


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
            later = next((joined_text(m) for m in reversed(messages[long_index + 1:])
                          if m.get("role") == "user" and joined_text(m).strip()), None)
            if later is not None:  # a paste followed by the question in a message of its own
                return RequestSpec(later, 0, "latest-user")
            return self._question(msg, long_tt) or self._tail(msg, long_tt, "message-tail", pin=True)
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
        span = question_span(tt.lines, tt.line_tokens, self.query_pin)
        if span is not None:
            return RequestSpec(_without_reminders(tt.lines, span), self.query_pin, "question", span)
        start = tail_lines(tt.lines, tt.line_tokens, self.query_pin, paragraphs=False)
        return RequestSpec("".join(tt.lines[start:]), self.query_pin if start < len(tt.lines) else 0, "prompt-tail")

    def _question(self, msg: Mapping[str, object], tt: TokenizedText | None) -> RequestSpec | None:
        """Step 2: the question found by its form, the scorer's query; the tail stays pinned."""
        if tt is None:
            lines = split_lines(joined_text(msg))
            counts = approx_line_tokens(lines)
        else:
            lines, counts = tt.lines, tt.line_tokens
        span = question_span(lines, counts, self.query_pin)
        if span is None:
            return None
        text = _without_reminders(lines, span)
        return RequestSpec(text, self.query_pin, "question", span) if text.strip() else None

    def _tail(self, msg: Mapping[str, object], tt: TokenizedText | None, source: RequestSource, pin: bool) -> RequestSpec:
        if tt is None:
            text = joined_text(msg)
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
        after = [t for m in messages[idx + 1:] if m.get("role") == "user"
                 for t in (request_text(m),) if t.strip()]  # the user's words sent with the tool result
        task = next((t for m in reversed(messages[:idx]) if m.get("role") == "user"
                     for t in (request_text(m),) if t.strip()), "")
        task = question_text(task, self.query_pin) if task else task  # a long task: a paste with its question
        parts = [question_text(t, self.query_pin) for t in after] + ([task] if task else [])
        n_user = len(parts)
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
        user = "\n".join(parts[:n_user])
        return RequestSpec(text, 0, "tool-call" if text else "none", None, user)


def follow_up_query(msg: Mapping[str, object], limit: int = 512) -> str:
    """Step 6: what a follow-up user turn asks, as recall's query (the same signal as step 2): its text without
    the client's ``<system-reminder>`` blocks, and of a long turn (a paste with its question) the question by its
    form (``question_text``)."""
    return question_text(request_text(msg), limit)


def _without_reminders(lines: list[str], span: tuple[int, int]) -> str:
    mask = _reminder_mask(lines)
    return "".join(lines[i] for i in range(*span) if not mask[i])


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
