"""Rewrite a message from its kept units: note, kept lines verbatim, omission markers.

Algorithm (``Rewriter.rewrite``):
1. Mark kept lines from the kept units; omitted lines are the rest.
2. Group consecutive omitted units into runs; each run becomes one ``OmittedRange``
   (0-based ``[start_line, end_line)`` plus the unit indices it covers).
3. Output, in order: the note line, then the kept lines byte for byte, with each
   omitted run replaced by ONE marker line
   ``[… lines 120–156 omitted …]`` (1-based, inclusive line numbers of the
   original message; ``[… line 7 omitted …]`` for a single line).  A marker that
   ends the message carries a newline only if the original ended with one.  In code
   (an ``outline`` from ``named.outline``) a marker also names the definitions whose
   first line it hides (``names_in``), so an agent re-reads that range instead of the
   file: ``[… lines 1176–1358 omitted — class Store: __setitem__, pop …]``;
   methods whose class line is shown are under the class's bare name (``Store: pop``),
   at most ``MAX_NOTE_NAMES`` names per marker (file-level ones first when there are more),
   then ``… +N more``; all the names of a
   message within ``names_room`` tokens (the pipeline gives them ``NAMES_SHARE`` of the
   budget), the longest omissions first (``marker_names``).
4. Cut inside long lines (``pieces``: a ``longlines.Pieces``; ``tt`` and the units are then over its pieces):
   an omitted run is told in the reader's terms, one marker per thing it hides, in order: the hidden pieces at
   the end of a line, in place on that line (``… [… 6 sentences omitted …]``; ``longlines.describe``), the
   whole lines as above (their own marker line, with the names), the hidden pieces at the start of a line in
   place (after the line's gutter number, which stays). A marker in place keeps the white space or newline that
   followed what it hides.
5. The note names what was shortened and how to get omitted parts back:
   a tool output is fetched again by calling the tool for the range; a paste is
   brought back by asking about it; a plain prompt only states the omission.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Literal, NamedTuple, Sequence

import numpy as np

from .longlines import Pieces, describe
from .text import TokenizedText, approx_tokens
from .units import Unit

__all__ = ["MARKER_RE", "MAX_NOTE_NAMES", "PART_MARKER_RE", "OmittedRange", "Rewriter", "Rewritten", "marker_line", "marker_tokens",
           "marker_names", "names_in", "names_tokens", "note_line", "omitted_ranges"]

Source = Literal["tool", "paste", "prompt"]
Outline = Sequence[tuple[int, str, str | None]]  # (line, name, owner) per definition: ``named.outline``
MARKER_RE = r"^\[… lines? (\d+)(?:–(\d+))? omitted(?: — (.+?))? …\]$"  # groups: first, last, names
PART_MARKER_RE = r"\[… ((?:[\d,]+ \w+|\w+ \d+(?:–\d+)? of \d+)(?:, (?:[\d,]+ \w+|\w+ \d+(?:–\d+)? of \d+|…))*) omitted …\]"
MAX_NOTE_NAMES = 8


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


@dataclass(frozen=True, kw_only=True)
class Rewritten:
    text: str
    shown_lines: int
    total_lines: int
    omitted: list[OmittedRange]
    label: str
    note: str
    names: tuple[str, ...] = ()  # per omitted range, the definitions its marker names ("" for none)


def marker_line(r: OmittedRange, names: str = "") -> str:
    tail = f" — {names}" if names else ""
    if r.n_lines == 1:
        return f"[… line {r.first} omitted{tail} …]"
    return f"[… lines {r.first}–{r.last} omitted{tail} …]"


def names_in(outline: Outline, starts: Sequence[int], start: int, end: int, limit: int = MAX_NOTE_NAMES) -> str:
    """The definitions of ``outline`` whose line is in ``[start, end)``, grouped by owner, at most ``limit`` names
    (``starts``: the outline's lines, sorted, for the bisection); "" for none."""
    lo, hi = bisect_left(starts, start), bisect_left(starts, end)
    if lo == hi:
        return ""
    found = outline[lo:hi]
    if len(found) > limit:  # too many: the file-level ones (classes, functions) first, then methods, in order
        top = [k for k, d in enumerate(found) if d[2] is None]
        rest = [k for k, d in enumerate(found) if d[2] is not None]
        found = [found[k] for k in sorted((top + rest)[:limit])]
    groups: list[tuple[str | None, list[str]]] = []  # (header, names); header None: file-level functions
    for _, name, owner in found:
        if owner is None and " " in name:  # a class-like definition: its methods follow under it
            groups.append((name, []))
        elif owner is None:
            if groups and groups[-1][0] is None:
                groups[-1][1].append(name)
            else:
                groups.append((None, [name]))
        elif groups and groups[-1][0] is not None and groups[-1][0].split(" ", 1)[-1] == owner:
            groups[-1][1].append(name)
        else:
            groups.append((owner, [name]))
    total, shown = hi - lo, len(found)
    parts = [", ".join(ns) if head is None else f"{head}: {', '.join(ns)}" if ns else head for head, ns in groups]
    parts = [p for p in parts if p]
    text = "; ".join(parts)
    return text + (f", … +{total - shown} more" if total > shown else "")


_NOUN = {"tool": "this tool output", "paste": "this message", "prompt": "this prompt"}
_HOW = {
    "tool": " To see an omitted part, call the tool again for that range.",
    "paste": " To see an omitted part, ask about it and it will be brought back.",
    "prompt": "",
}


def note_line(source: Source, shown: int, total: int, label: str = "", part: str = "") -> str:
    """The note; ``part``: a marker in place that the message holds (the note names it as an example)."""
    noun = _NOUN[source] + (f" (message {label})" if label else "")
    also = f" or \"{part}\"" if part else ""
    return (f"[pflash: showing {shown:,} of {total:,} lines of {noun}; parts marked "
            f"\"[… lines A–B omitted …]\"{also} were left out.{_HOW[source]}]")


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


# A marker's words as ``approx_tokens`` counts them, plus its newline and the space before its first number; its
# digits one token each. Gemma's and Qwen's tokenizers give every digit, and a space before one, a token of its own
# (a bytes/4 estimate counted a digit as a quarter of a token).
_MANY_WORDS = approx_tokens("[… lines – omitted …]") + 2
_ONE_WORDS = approx_tokens("[… line  omitted …]") + 2


def marker_tokens_arrays(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Estimated tokens of the markers of the omitted ranges ``[start, end)`` (0-based lines), newline included."""
    n = end - start

    def digits(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.floor(np.log10(np.maximum(x, 1))).astype(np.int64) + 1
        return out

    many = _MANY_WORDS + digits(start + 1) + digits(end)
    one = _ONE_WORDS + digits(start + 1)
    return np.where(n == 1, one, many)


@dataclass(frozen=True)
class Rewriter:
    def rewrite(self, tt: TokenizedText, units: Sequence[Unit], kept_indices: Sequence[int],
                source: Source, message_label: str = "", outline: Outline = (),
                names_room: int = 1 << 30, pieces: Pieces | None = None) -> Rewritten:
        """``outline``: the definitions markers may name (``named.outline``), within ``names_room`` tokens;
        ``pieces``: the long lines were cut (step 4)."""
        if source not in _NOUN:
            raise ValueError(f"unknown source {source!r}")
        if pieces is not None:
            return self._rewrite_pieces(tt, units, kept_indices, source, message_label, outline, names_room, pieces)
        omitted = omitted_ranges(units, kept_indices)
        total = len(tt.lines)
        shown = total - sum([b - a for a, b, _ in omitted])
        note = note_line(source, shown, total, message_label)
        parts = [note, "\n"]
        lines = tt.lines
        pos = 0
        ends_nl = tt.text.endswith("\n")
        names = marker_names(outline, [(a, b) for a, b, _ in omitted], names_room)
        for (a, b, _), found in zip(omitted, names):  # step 3; marker text as ``marker_line``, written out for speed
            parts += lines[pos:a]
            k = b - a
            tail = f" — {found}" if found else ""
            m = f"[… line {b} omitted{tail} …]" if k == 1 else f"[… lines {a + 1}–{b} omitted{tail} …]"
            parts.append(m + "\n" if b < total or ends_nl else m)
            pos = b
        parts += lines[pos:]
        return Rewritten(text="".join(parts), shown_lines=shown, total_lines=total, omitted=omitted,
                         label=message_label, note=note, names=tuple(names))


    def _rewrite_pieces(self, tt: TokenizedText, units: Sequence[Unit], kept_indices: Sequence[int], source: Source,
                        message_label: str, outline: Outline, names_room: int, pieces: Pieces) -> Rewritten:
        """Step 4: ``tt``'s lines are ``pieces``' pieces; markers say what they hide in lines or in pieces."""
        omitted = omitted_ranges(units, kept_indices)
        first = pieces.first()
        line_of, lines = pieces.line, tt.lines
        total = pieces.n_lines
        ends_nl = tt.text.endswith("\n")
        names = marker_names(outline, [(a, b) for a, b, _ in omitted], names_room)

        def in_place(ln: int, x: int, y: int) -> str:
            """Pieces ``[x, y)`` of line ``ln`` hidden in place."""
            pre = lines[x][:pieces.prefix[ln]] if pieces.prefix and x == first[ln] else ""
            hidden_last = lines[y - 1]
            stripped = hidden_last.rstrip()
            trail = hidden_last[len(stripped):]
            if y < first[ln + 1]:
                trail = trail.replace("\n", "")
            elif not trail.endswith("\n") and (ln + 1 < total or ends_nl):
                trail += "\n"
            what = describe(pieces.label[x:y], pieces.length[x:y])
            return f"{pre}[… {what} omitted …]{trail}"

        parts: list[str] = []
        hidden_lines = 0
        part_example = ""
        pos = 0
        for (a, b, _), found in zip(omitted, names):
            parts += lines[pos:a]
            pos = b
            la, lb = line_of[a], line_of[b - 1]
            full_from, full_to = la, lb + 1
            head = tail = ""
            if first[la] != a:  # the run starts inside line la
                head = in_place(la, a, min(b, first[la + 1]))
                full_from = la + 1
            if first[lb + 1] != b and (lb > la or first[la] == a):  # it ends inside line lb
                tail = in_place(lb, first[lb], b)
                full_to = lb
            part_example = part_example or (head or tail).strip()
            parts.append(head)
            if full_to > full_from:
                hidden_lines += full_to - full_from
                tail_names = f" — {found}" if found else ""
                m = (f"[… line {full_to} omitted{tail_names} …]" if full_to - full_from == 1
                     else f"[… lines {full_from + 1}–{full_to} omitted{tail_names} …]")
                parts.append(m + "\n" if full_to < total or ends_nl else m)
            parts.append(tail)
        parts += lines[pos:]
        if part_example and pieces.prefix:
            part_example = part_example[part_example.find("[…"):]
        note = note_line(source, total - hidden_lines, total, message_label, part_example)
        return Rewritten(text=note + "\n" + "".join(parts), shown_lines=total - hidden_lines, total_lines=total,
                         omitted=omitted, label=message_label, note=note, names=tuple(names))


def marker_names(outline: Outline, ranges: Sequence[tuple[int, int]], room: int) -> list[str]:
    """Step 3: the names each omitted range ``[a, b)`` shows, within ``room`` tokens in all: the longest ranges
    first, each with up to ``MAX_NOTE_NAMES`` names, or 3, or 1 when that is what still fits."""
    out = [""] * len(ranges)
    starts = [d[0] for d in outline]
    if not starts:
        return out
    for i in sorted(range(len(ranges)), key=lambda i: (ranges[i][0] - ranges[i][1], i)):
        a, b = ranges[i]
        for limit in (MAX_NOTE_NAMES, 3, 1):
            text = names_in(outline, starts, a, b, limit)
            if not text:
                break
            cost = approx_tokens(f" — {text}")
            if cost <= room:
                out[i], room = text, room - cost
                break
    return out


def names_tokens(names: Sequence[str]) -> int:
    """Estimated tokens the names add to their markers (`` — `` and the names)."""
    return sum(approx_tokens(f" — {n}") for n in names if n)
