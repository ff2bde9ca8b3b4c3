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
from typing import Literal, NamedTuple, Sequence

import numpy as np

from .text import TokenizedText
from .units import Unit

__all__ = ["MARKER_RE", "OmittedRange", "Rewriter", "Rewritten", "marker_line", "marker_tokens", "note_line", "omitted_ranges"]

Source = Literal["tool", "paste", "prompt"]
MARKER_RE = r"^\[… (\d+) lines? omitted: lines? (\d+)(?:–(\d+))? …\]$"


class OmittedRange(NamedTuple):
    """An omitted run of units (NamedTuple: cheap to build by the thousand)."""

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
    """Step 2: runs of consecutive omitted units (vectorised over the keep mask)."""
    n = len(units)
    keep = np.zeros(n + 2, dtype=bool)
    keep[[0, n + 1]] = True
    kept = np.asarray(list(kept_indices), dtype=np.int64)
    if len(kept) and (kept.min() < 0 or kept.max() >= n):
        raise IndexError("kept index out of range")
    keep[kept + 1] = True
    edges = np.flatnonzero(keep[1:] != keep[:-1])  # alternating run starts / ends (unit indices)
    return [OmittedRange(units[a].start_line, units[b - 1].end_line, tuple(range(a, b)))
            for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist())]


def marker_tokens(runs: Sequence[OmittedRange]) -> int:
    """Estimated tokens (``approx_tokens`` + 1 for the newline) of the marker lines, vectorised."""
    if not runs:
        return 0
    a = np.fromiter((r.start_line for r in runs), dtype=np.int64, count=len(runs))
    b = np.fromiter((r.end_line for r in runs), dtype=np.int64, count=len(runs))
    return int(marker_tokens_arrays(a, b).sum())


def marker_tokens_arrays(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    n = end - start

    def digits(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.floor(np.log10(np.maximum(x, 1))).astype(np.int64) + 1
        return out

    many = len("[…  lines omitted: lines – …]".encode()) + digits(n) + (digits(n) - 1) // 3 + digits(start + 1) \
        + digits(end)
    one = len("[… 1 line omitted: line  …]".encode()) + digits(start + 1)
    return (np.where(n == 1, one, many) + 3) // 4 + 1


@dataclass(frozen=True)
class Rewriter:
    def rewrite(self, tt: TokenizedText, units: Sequence[Unit], kept_indices: Sequence[int],
                source: Source, message_label: str = "") -> Rewritten:
        if source not in _NOUN:
            raise ValueError(f"unknown source {source!r}")
        omitted = omitted_ranges(units, kept_indices)
        total = len(tt.lines)
        shown = total - sum([b - a for a, b, _ in omitted])
        note = note_line(source, shown, total, message_label)
        parts = [note, "\n"]
        lines = tt.lines
        pos = 0
        ends_nl = tt.text.endswith("\n")
        for a, b, _ in omitted:  # step 3; marker text as ``marker_line``, written out for speed
            parts += lines[pos:a]
            k = b - a
            m = f"[… 1 line omitted: line {b} …]" if k == 1 else f"[… {k:,} lines omitted: lines {a + 1}–{b} …]"
            parts.append(m + "\n" if b < total or ends_nl else m)
            pos = b
        parts += lines[pos:]
        return Rewritten("".join(parts), shown, total, omitted, message_label, note)
