"""Line-number gutters: tool output that starts every line with its line number.

Agents' file tools number the lines they return: Claude Code's Read and ``cat -n`` give ``     1<TAB>line``
(older Claude Code ``     1→line``), opencode's read ``1: line`` (older versions ``00001| line``), ``grep -n``
``file:12:line`` or ``12:line`` (context lines with ``-`` for ``:``, groups split by ``--``).  With the numbers
in, the kind detector and the cutter read such a file as records or cut it into tiny pieces; behind them it is
code.  This module finds the gutter; the pipeline cuts and scores the text behind it and serves the numbered
lines.

Algorithm (``find_gutter(lines)``):
1. Forms, in order: ``N<TAB>``, ``N→``, ``N|``, ``N:`` (also ``N-``), ``file:N:`` (also ``file-N-``), each a
   regex anchored at the line start; the number may be right-aligned with spaces or zero-padded.
2. Sample the first ``SAMPLE`` non-blank lines; every form that matches at least half of them is tried, the
   one matching most first.  None: no gutter.
3. A form is a gutter when, matched on every line: at least ``MIN_LINES`` lines are numbered; at most ``EDGE``
   non-blank unnumbered lines come before the first numbered line and at most ``EDGE`` after the last (a
   wrapper such as opencode's ``<file>`` or "(End of file - total N lines)", a note the client appends); at
   most ``INSIDE`` of the numbered count lie between them (grep's ``--`` group separators are free); and the
   number rises from each numbered line to the next on at least ``RISING`` of the steps (``file:N:``: the steps
   within one file, and at least half the lines must follow a line of their own file: ``grep -rn`` hits across
   many files are a list of places, and their paths are what a question names, so they stay).
4. ``N|`` and ``N:``: the one space after the separator is part of the gutter when at least ``RISING`` of the
   numbered lines with text after the separator have it (opencode), else it is the line's own (grep -n of
   indented code); so is a tab after ``N→`` (``   12→<TAB>line``).
5. ``N<TAB>`` whose lines, behind the numbers, share one non-zero tab count on at least 80 % of them is a
   tab-separated table with a numeric first column, not a gutter.
6. The result, ``Gutter``, names the form and gives every line's prefix length in characters (0 on the
   unnumbered lines, and on a last line that is only a number, so that no line becomes empty).
   ``bare_text(tt, gutter)``: the ``TokenizedText`` behind the gutter, with the same lines, one for one, and the
   same per-line token counts (what is served is the numbered text, so the budget counts its tokens).  With
   ``content_tokens`` the counts are those of the text behind the numbers instead (``content_counts``): a
   numbered line's count less its number's tokens, at least 1.  A number's tokens are learned from the message:
   per count of digits, the median count of the numbered lines with nothing behind the number, less 1 for the
   newline (``     6<TAB>\n`` is 4 tokens in gemma's vocabulary: padding, digit, tab, newline); a digit count
   without such a line takes the nearest one's plus one token per digit more; with none at all, the number's
   ``approx_tokens``.  Behind ``N: `` and ``N| `` a line with text counts one token less for its number: the
   space joins the text's first token.  When ``tt`` was counted with ``approx_line_tokens`` (no tokenizer), the counts are the
   bare lines' ``approx_line_tokens``.  The segmenter sizes units by these, so a definition that is one unit in
   the file is one unit in its numbered form (the numbers' tokens would push it past ``max_segment``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .text import TokenizedText, approx_line_tokens, approx_tokens

__all__ = ["Gutter", "bare_text", "content_counts", "find_gutter"]

SAMPLE = 64  # step 2: non-blank lines sampled to pick the candidate forms
MIN_LINES = 8  # step 3: numbered lines a gutter needs
EDGE = 8  # step 3: non-blank unnumbered lines allowed before the first and after the last numbered line
INSIDE = 0.01  # step 3: unnumbered non-blank lines allowed between them, as a share of the numbered lines
RISING = 0.99  # steps 3-4: share of steps on which the number must rise; share of lines with the space

_FORMS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("N<TAB>", re.compile(r" *(\d+)\t")),
    ("N→", re.compile(r" *(\d+)→")),
    ("N|", re.compile(r" *(\d+)\|")),
    ("N:", re.compile(r" *(\d+)[:-]")),
    ("file:N:", re.compile(r"([^\s:][^\t\n:]*?)([:-])(\d+)\2")),
)
_PAD = {"N|": (" ", " "), "N:": (" ", " "), "N→": ("\t", "<TAB>")}  # step 4: the pad and its name
_GREP = frozenset(("N:", "file:N:"))  # forms whose output may hold "--" group separators


@dataclass(frozen=True)
class Gutter:
    """A line-number gutter: its form (``"N<TAB>"``, ``"N→"``, ``"N| "``, ``"N: "``, ``"N:"``, ...) and the
    number of leading characters it takes on every line."""

    form: str
    prefix: tuple[int, ...]

    @property
    def numbered(self) -> int:
        return sum(1 for p in self.prefix if p)


def find_gutter(lines: Sequence[str]) -> Gutter | None:
    """The message's line-number gutter, or None (module docstring, steps 1-6)."""
    sample = []
    for ln in lines:
        if ln.strip():
            sample.append(ln)
            if len(sample) >= SAMPLE:
                break
    if len(sample) < MIN_LINES:
        return None
    hits = [sum(1 for ln in sample if rx.match(ln)) for _, rx in _FORMS]
    for k in sorted(range(len(_FORMS)), key=lambda k: (-hits[k], k)):
        if hits[k] * 2 < len(sample):
            break
        g = _try(*_FORMS[k], lines)
        if g is not None:
            return g
    return None


def _try(form: str, rx: re.Pattern[str], lines: Sequence[str]) -> Gutter | None:
    """Step 3-5 for one form."""
    grep_file = form == "file:N:"
    num_group = 3 if grep_file else 1
    free_sep = form in _GREP
    n = len(lines)
    prefix = [0] * n
    numbered: list[int] = []
    others: list[int] = []
    rising = steps = 0
    prev_num: int | None = None
    prev_file: str | None = None
    for i, ln in enumerate(lines):
        m = rx.match(ln)
        if m is None:
            if ln.strip() and not (free_sep and ln.rstrip("\r\n") == "--"):
                others.append(i)
            continue
        num = int(m.group(num_group))
        file = m.group(1) if grep_file else None
        if prev_num is not None and file == prev_file:
            steps += 1
            rising += num > prev_num
        prev_num, prev_file = num, file
        prefix[i] = m.end()
        numbered.append(i)
    count = len(numbered)
    if count < MIN_LINES or rising < RISING * steps or (grep_file and steps * 2 < count):
        return None
    first, last = numbered[0], numbered[-1]
    head = sum(1 for i in others if i < first)
    tail = sum(1 for i in others if i > last)
    if head > EDGE or tail > EDGE or len(others) - head - tail > INSIDE * count:
        return None
    if form in _PAD:
        pad, name = _PAD[form]
        with_text = [i for i in numbered if lines[i][prefix[i]:].strip("\r\n")]
        padded = [i for i in with_text if lines[i][prefix[i]] == pad]
        if with_text and len(padded) >= RISING * len(with_text):
            for i in padded:
                prefix[i] += 1
            form += name
    elif form == "N<TAB>":
        tabs = Counter(lines[i][prefix[i]:].count("\t") for i in numbered if lines[i][prefix[i]:].strip())
        if tabs:
            k, c = tabs.most_common(1)[0]
            if k > 0 and c >= 0.8 * sum(tabs.values()):
                return None
    if prefix and prefix[-1] and prefix[-1] >= len(lines[-1]):
        prefix[-1] = 0  # a last line that is only its number stays whole: no line of the bare text is empty
    return Gutter(form, tuple(prefix))


def bare_text(tt: TokenizedText, gutter: Gutter, *, content_tokens: bool = False) -> TokenizedText:
    """Step 6: the text behind the gutter, line for line, with ``tt``'s per-line token counts (with
    ``content_tokens``: the estimated counts of the lines behind the numbers)."""
    if len(gutter.prefix) != len(tt.lines):
        raise ValueError(f"gutter has {len(gutter.prefix)} lines, the message {len(tt.lines)}")
    lines = [ln[p:] if p else ln for ln, p in zip(tt.lines, gutter.prefix)]
    counts = content_counts(tt, gutter, lines) if content_tokens else list(tt.line_tokens)
    return TokenizedText("".join(lines), lines, counts)


def content_counts(tt: TokenizedText, gutter: Gutter, bare: Sequence[str]) -> list[int]:
    """Step 6: estimated token counts of the ``bare`` lines behind ``gutter``."""
    counts = list(tt.line_tokens)
    if counts == approx_line_tokens(tt.lines):
        return approx_line_tokens(list(bare))
    digits = [sum(c.isdigit() for c in ln[:p]) for ln, p in zip(tt.lines, gutter.prefix)]
    seen: dict[int, list[int]] = {}
    for c, d, p, b in zip(counts, digits, gutter.prefix, bare):
        if p and not b.strip():
            seen.setdefault(d, []).append(c - (1 if b else 0))
    cost = {d: int(np.median(v)) for d, v in seen.items()}
    spaced = gutter.form.endswith(" ")
    out = []
    for c, d, p, ln, b in zip(counts, digits, gutter.prefix, tt.lines, bare):
        if not p:
            out.append(c)
            continue
        if d in cost:
            g = cost[d]
        elif cost:
            near = min(cost, key=lambda k: (abs(k - d), k))
            g = cost[near] + d - near
        else:
            g = approx_tokens(ln[:p])
        if spaced and b.strip():
            g -= 1  # the space after "N:" or "N|" joins the line's first token ("12: def" -> "12", ":", " def")
        out.append(max(c - g, 1 if b else 0))
    return out
