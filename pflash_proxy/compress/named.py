"""Definitions the request names: the unit that defines an identifier the question spells out is always kept.

An agent asking "what does array_split do?" about a file it just read must get ``array_split`` whatever a
scorer thinks of its words.  Sans-IO, on the text the cutter saw (behind any line-number gutter).

Algorithm (``named_units``):
1. Definition lines: a line that starts (after indentation and ``export``/``pub``/``async``) with ``def``,
   ``class``, ``function``, ``fn``, ``func`` (with or without a receiver), ``struct``, ``enum``, ``interface``,
   ``trait`` or ``type`` followed by a name; the name and the line index are kept.
2. Names of at least 3 characters that the request contains as whole words (``\\b``, case-sensitive) and that are
   defined at most ``MAX_DEFINITIONS`` times in the message (``__init__`` in ten classes names nothing).
3. More than ``MAX_NAMES`` such names: the request is a list, not a question about one definition: none.
4. A definition's block runs from its line to its last non-blank line before the next non-blank line indented no deeper
   (a closing ``}``/``)``/``]`` at its indentation still belongs to it); the units overlapping the block are
   returned, at most ``MAX_UNITS`` of them per definition (the first ones: signature and docstring).

``definition_blocks(tt, units, max_tokens)``: every definition (step 1's lines, any name) whose block (step 4)
spans more than one unit and at most ``max_tokens`` tokens, as the tuple of its units; the innermost first when
blocks nest. A definition longer than the cutter's largest unit is cut inside; the pipeline keeps the rest of such
a block with the part it chose, when the rest is small (``pipeline`` step 4).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from typing import Sequence

from .text import TokenizedText
from .units import Unit

__all__ = ["definition_blocks", "definitions", "named_units"]

MAX_DEFINITIONS = 2
MAX_NAMES = 3
MAX_UNITS = 4
_DEF = re.compile(
    r"^[ \t]*(?:export\s+)?(?:default\s+)?(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?"
    r"(?:def|class|function\*?|fn|func(?:\s*\([^)]*\))?|struct|enum|interface|trait|type)\s+([A-Za-z_$][\w$]*)",
    re.M)


def definitions(tt: TokenizedText) -> list[tuple[int, str]]:
    """Step 1: (line index, name) of every definition line; both functions below take it, so the lines are
    matched once per message."""
    return [(i, m.group(1)) for i, line in enumerate(tt.lines) if (m := _DEF.match(line))]


def named_units(tt: TokenizedText, units: Sequence[Unit], request: str,
                defs: list[tuple[int, str]] | None = None) -> set[int]:
    """Steps 1-4: indices of the units that define a name the request spells out."""
    if not request or not units:
        return set()
    where: dict[str, list[int]] = defaultdict(list)
    for i, name in definitions(tt) if defs is None else defs:
        if len(name) >= 3:
            where[name].append(i)
    if not where:
        return set()
    words = set(re.findall(r"[A-Za-z_$][\w$]*", request))
    names = [n for n in where if n in words and len(where[n]) <= MAX_DEFINITIONS]
    if not names or len(names) > MAX_NAMES:
        return set()
    starts = [u.start_line for u in units]
    out: set[int] = set()
    for n in names:
        for at in where[n]:
            end = _block_end(tt.lines, at)
            first, last = bisect_right(starts, at) - 1, bisect_right(starts, end - 1) - 1
            out.update(range(first, min(last, first + MAX_UNITS - 1) + 1))
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _block_end(lines: Sequence[str], start: int) -> int:
    """Step 4: the line after the definition starting at ``start``."""
    depth, last = _indent(lines[start]), start
    for k in range(start + 1, len(lines)):
        text = lines[k].strip()
        if text and _indent(lines[k]) <= depth and not text.startswith(("}", ")", "]")):
            break
        if text:
            last = k  # trailing blank lines belong to nothing
    return last + 1


def definition_blocks(tt: TokenizedText, units: Sequence[Unit], max_tokens: int,
                      defs: list[tuple[int, str]] | None = None) -> list[tuple[int, ...]]:
    """Multi-unit definition blocks of at most ``max_tokens`` tokens (module docstring), innermost first."""
    if len(units) < 2:
        return []
    starts = [u.start_line for u in units]
    out: list[tuple[int, int, tuple[int, ...]]] = []
    for i, _ in definitions(tt) if defs is None else defs:
        end = _block_end(tt.lines, i)
        first, last = bisect_right(starts, i) - 1, bisect_right(starts, end - 1) - 1
        if last > first and sum(units[k].tokens for k in range(first, last + 1)) <= max_tokens:
            out.append((end - i, first, tuple(range(first, last + 1))))
    return [b for _, _, b in sorted(out)]
