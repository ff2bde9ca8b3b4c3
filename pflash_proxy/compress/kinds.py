"""Content kinds and a cheap, deterministic kind detector.

The segmenter cuts differently per kind (see ``cuts.py``).  ``detect_kind`` looks at a
bounded sample of the text so it costs the same on 10K and 200K tokens.

Algorithm:
1. Sample at most three 8 KB windows (head, middle, tail), cut at line ends, and keep
   their non-blank lines.
2. Diff: at least one ``@@ -a,b +c,d @@`` hunk header, two file-header lines
   (``diff --git``/``--- ``/``+++ ``) and >= 80% of lines starting with a diff marker.
3. Chat: >= 4 turn lines ``Speaker: ...`` from >= 2 speakers that each speak twice,
   and the turn lines make up >= 5% of the sample.
4. Records: >= 60% JSON-looking lines, or >= 50% log lines (timestamp / level
   prefix), or >= 80% of >= 5 lines sharing the same non-zero comma (or tab) count.
5. Code: >= 45% of lines look like code (keyword starts, bracket/semicolon ends,
   indentation of 2+ spaces or a tab).
6. Prose when the lines are mostly words, else unknown (segmented like prose).
"""

from __future__ import annotations

import re
from collections import Counter
from enum import Enum

import numpy as np

__all__ = ["ContentKind", "detect_kind", "TURN_RE"]


class ContentKind(str, Enum):
    CODE = "code"
    PROSE = "prose"
    RECORDS = "records"
    CHAT = "chat"
    DIFF = "diff"
    UNKNOWN = "unknown"


_WINDOW = 8_192
TURN_RE = re.compile(
    r"^(?:\*\*|> |\[[^\]\n]{1,40}\] ?)?([A-Z][\w.'-]{0,20}(?: [A-Z][\w.'-]{0,20}){0,2})(?:\*\*)?:(?:[ \t]|$)",
    re.M)
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@", re.M)
_DIFF_HEAD = re.compile(r"^(?:diff --git |--- |\+\+\+ )", re.M)
_DIFF_LINE = re.compile(r"^(?:[ +\-@\\]|diff |index |new file|deleted file|similarity|rename |old mode|new mode)")
_JSON_LINE = re.compile(r"^\s*[\[{].*[\]}],?\s*$")
_JSON_OPEN = frozenset("[{")
_LOG_LINE = re.compile(
    r"^(?:\[?\d{4}-\d\d-\d\d|\[?\d\d:\d\d:\d\d|\[?(?:TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL|CRITICAL)\b"
    r"|[A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d|\d+\.\d+\s)")
_CODE_HEAD = (
    r"(?:\s*(?:def |class |async def |import |from \S+ import |#include|#define|function |const |let |var |"
    r"return\b|if ?\(|for ?\(|while ?\(|switch ?\(|}|@\w|//|/\*|\*/|public |private |protected |static |fn |"
    r"use |package |func |impl |struct |enum |type |interface |export |module )|(?:[ ]{2,}|\t)\S)")
_CODE_LINE = re.compile(r"^" + _CODE_HEAD + r"|[{};:,(\[]\s*$")
_CODE_START = re.compile(_CODE_HEAD).match  # anchored half of _CODE_LINE
_CODE_ENDS = frozenset("{};:,([")  # unanchored half: last non-whitespace character (``\s`` == ``str.isspace``)
_WORDY = re.compile(r"^\W*[A-Za-z]\w*(?:[ ,;:'’()\"-]+\w+){4,}")


def _log_first(c: str) -> bool:
    """Whether ``_LOG_LINE`` can match a line starting with ``c``: "[", an ``A-Z`` letter or a ``\\d`` digit."""
    return c == "[" or "A" <= c <= "Z" or c.isdecimal()


def _sample(text: str) -> list[str]:
    n = len(text)
    if n <= 3 * _WINDOW:
        chunks = [text]
    else:
        mid = n // 2
        chunks = [text[:_WINDOW], text[mid:mid + _WINDOW], text[n - _WINDOW:]]
        chunks = [chunks[0].rsplit("\n", 1)[0]] + [c.split("\n", 1)[-1].rsplit("\n", 1)[0] for c in chunks[1:2]] \
            + [chunks[2].split("\n", 1)[-1]]
    return [ln for c in chunks for ln in c.split("\n") if ln.strip()]


def detect_kind(text: str) -> ContentKind:
    """Guess the content kind of ``text`` (module docstring, steps 1-6)."""
    lines = _sample(text)
    n = len(lines)
    if n == 0:
        return ContentKind.UNKNOWN
    joined = "\n".join(lines)
    if ("@@ -" in joined and _HUNK.search(joined) and len(_DIFF_HEAD.findall(joined)) >= 2
            and sum(1 for ln in lines if _DIFF_LINE.match(ln)) >= 0.8 * n):
        return ContentKind.DIFF
    speakers = Counter(m.group(1) for m in TURN_RE.finditer(joined))
    repeat = {s: c for s, c in speakers.items() if c >= 2}
    turns = sum(repeat.values())
    if len(repeat) >= 2 and turns >= 4 and turns >= 0.05 * n:
        return ContentKind.CHAT
    if sum(1 for ln in lines if ln.lstrip()[:1] in _JSON_OPEN and _JSON_LINE.match(ln)) >= 0.6 * n:
        return ContentKind.RECORDS
    if sum(1 for ln in lines if _log_first(ln[0]) and _LOG_LINE.match(ln)) >= 0.5 * n:
        return ContentKind.RECORDS
    if n >= 5:
        # per-line separator counts from the bytes (lines hold no newline; UTF-8 continuation bytes are >= 128);
        # a count held by >= 80% of lines is the unique most common one, so ties cannot matter
        b = np.frombuffer(joined.encode("utf-8"), dtype=np.uint8)
        line = np.cumsum(b == 10)
        for sep in (44, 9):  # "," and tab
            vals, freq = np.unique(np.bincount(line[b == sep], minlength=n), return_counts=True)
            j = int(freq.argmax())
            if vals[j] > 0 and freq[j] >= 0.8 * n:
                return ContentKind.RECORDS
    # same count as ``_CODE_LINE.search`` per line: its ``[{};:,(\[]\s*$`` half is a test of the last
    # non-whitespace character, the rest is anchored
    if sum(1 for ln in lines if ln.rstrip()[-1:] in _CODE_ENDS or _CODE_START(ln)) >= 0.45 * n:
        return ContentKind.CODE
    if sum(1 for ln in lines if _WORDY.match(ln)) >= 0.5 * n:
        return ContentKind.PROSE
    return ContentKind.UNKNOWN
