"""Rewrite a message from its kept units: note, kept lines verbatim, omission markers.

Algorithm (``Rewriter.rewrite``):
1. Mark kept lines from the kept units; omitted lines are the rest.
2. Group consecutive omitted units into runs; each run becomes one ``OmittedRange``
   (0-based ``[start_line, end_line)`` plus the unit indices it covers).
3. Output, in order: the note line, then the kept lines byte for byte, with each
   omitted run replaced by ONE marker line
   ``[… 37 lines omitted: lines 120–156 …]`` (1-based, inclusive line numbers of the
   original message; ``1 line omitted: line 7`` for a single line).  A marker that
   ends the message carries a newline only if the original ended with one.
4. The note names what was shortened and how to get omitted parts back:
   a tool output is fetched again by calling the tool for the range; a paste is
   brought back by asking about it; a plain prompt only states the omission.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from .text import TokenizedText
from .units import Unit

__all__ = ["MARKER_RE", "OmittedRange", "Rewriter", "Rewritten", "marker_line", "note_line", "omitted_ranges"]

Source = Literal["tool", "paste", "prompt"]
MARKER_RE = r"^\[… (\d+) lines? omitted: lines? (\d+)(?:–(\d+))? …\]$"


@dataclass(frozen=True)
class OmittedRange:
    start_line: int  # 0-based, inclusive
    end_line: int  # 0-based, exclusive
    unit_indices: tuple[int, ...]

    @property
    def n_lines(self) -> int:
        return self.end_line - self.start_line

    @property
    def first(self) -> int:
        """1-based first line."""
        return self.start_line + 1

    @property
    def last(self) -> int:
        """1-based last line (inclusive)."""
        return self.end_line


@dataclass(frozen=True)
class Rewritten:
    text: str
    shown_lines: int
    total_lines: int
    omitted: list[OmittedRange]
    label: str
    note: str


def marker_line(r: OmittedRange) -> str:
    if r.n_lines == 1:
        return f"[… 1 line omitted: line {r.first} …]"
    return f"[… {r.n_lines:,} lines omitted: lines {r.first}–{r.last} …]"


_NOUN = {"tool": "this tool output", "paste": "this message", "prompt": "this prompt"}
_HOW = {
    "tool": " To see an omitted part, call the tool again for that range.",
    "paste": " To see an omitted part, ask about it and it will be brought back.",
    "prompt": "",
}


def note_line(source: Source, shown: int, total: int, label: str = "") -> str:
    noun = _NOUN[source] + (f" (message {label})" if label else "")
    return (f"[pflash: showing {shown:,} of {total:,} lines of {noun}; parts marked "
            f"\"[… N lines omitted: lines A–B …]\" were left out.{_HOW[source]}]")


def omitted_ranges(units: Sequence[Unit], kept_indices: Sequence[int]) -> list[OmittedRange]:
    """Step 2: runs of consecutive omitted units."""
    kept_set = set(kept_indices)
    if any(not 0 <= k < len(units) for k in kept_set):
        raise IndexError("kept index out of range")
    omitted: list[OmittedRange] = []
    run: list[int] = []
    for i, u in enumerate(units):
        if i in kept_set:
            if run:
                omitted.append(OmittedRange(units[run[0]].start_line, units[run[-1]].end_line, tuple(run)))
                run = []
        else:
            run.append(i)
    if run:
        omitted.append(OmittedRange(units[run[0]].start_line, units[run[-1]].end_line, tuple(run)))
    return omitted


@dataclass(frozen=True)
class Rewriter:
    def rewrite(self, tt: TokenizedText, units: Sequence[Unit], kept_indices: Sequence[int],
                source: Source, message_label: str = "") -> Rewritten:
        if source not in _NOUN:
            raise ValueError(f"unknown source {source!r}")
        omitted = omitted_ranges(units, kept_indices)
        total = len(tt.lines)
        shown = total - sum(r.n_lines for r in omitted)
        note = note_line(source, shown, total, message_label)
        parts = [note, "\n"]
        lines = tt.lines
        pos = 0
        ends_nl = tt.text.endswith("\n")
        for r in omitted:  # step 3
            parts.extend(lines[pos:r.start_line])
            parts.append(marker_line(r))
            if r.end_line < total or ends_nl:
                parts.append("\n")
            pos = r.end_line
        parts.extend(lines[pos:])
        return Rewritten("".join(parts), shown, total, omitted, message_label, note)
