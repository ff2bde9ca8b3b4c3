"""Whole-line structural units and the model-free segmenter.

A unit is a run of whole lines that is kept or left out as one piece.

Algorithm (``UnitSegmenter.segment``):
1. Pick the kind (given, or ``detect_kind``) and build the vectorised line table.
2. Refuse (``CannotSegment``) when a single line alone exceeds ``max_segment`` tokens:
   units are whole lines, so such a message cannot be cut cleanly.  (The pipeline first cuts such lines into
   pieces, ``longlines.cut_long_lines``, and hands the segmenter the pieces as lines, each under the limit.)
3. Take the kind's raw cut candidates (``cuts.raw_starts``: code statements and
   definitions with their leading comments/decorators, paragraphs, records, turns,
   diff files/hunks), and every piece of a cut line (``TokenizedText.continued``).
4. Merge forward: a unit under ``min_segment`` tokens absorbs the next one until it
   reaches ``min_segment``; a short final unit merges backward into the previous one.
5. Split every unit over ``max_segment`` at line starts: repeatedly cut at the line
   with the lowest ``split_priority`` (code: smallest indentation, definitions first,
   never inside brackets or literals when avoidable; prose: after blank lines, then
   after sentence ends) among the lines that keep the piece within ``max_segment``
   and, when possible, at least ``min_segment``; ties go to the latest line.
6. Refuse when fewer than two units remain.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Callable, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .cuts import LineTable, raw_starts, split_priority
from .kinds import ContentKind, detect_kind
from .text import TokenizedText

__all__ = ["CannotSegment", "ContentKind", "Segmenter", "Unit", "UnitSegmenter", "detect_kind"]


class CannotSegment(ValueError):
    """The message cannot be cut cleanly into at least two whole-line units."""


class Unit(NamedTuple):
    """Lines ``[start_line, end_line)`` (0-based, end exclusive) of a message.

    A NamedTuple: immutable, picklable and ~5x cheaper to build than a frozen dataclass,
    which matters with thousands of record units per message.
    """

    index: int  # type: ignore[assignment]  # the unit's position; shadows tuple.index (unused on units)
    start_line: int
    end_line: int
    tokens: int
    kind: ContentKind

    @property
    def n_lines(self) -> int:
        return self.end_line - self.start_line


@runtime_checkable
class Segmenter(Protocol):
    """Anything that cuts a tokenized message into whole-line units."""

    @property
    def max_segment(self) -> int:
        """The largest unit it makes, in tokens: the pipeline cuts a longer line into pieces first."""
        ...

    def segment(self, tt: TokenizedText, kind: ContentKind | None = None) -> list[Unit]: ...


@dataclass(frozen=True)
class UnitSegmenter:
    """Structure-aware, model-free segmenter (module docstring)."""

    min_segment: int = 32
    max_segment: int = 512

    def __post_init__(self) -> None:
        if not 0 < self.min_segment <= self.max_segment:
            raise ValueError(f"need 0 < min_segment <= max_segment, got {self.min_segment}, {self.max_segment}")

    def segment(self, tt: TokenizedText, kind: ContentKind | None = None) -> list[Unit]:
        n = len(tt.lines)
        if n == 0:
            raise CannotSegment("empty message")
        tokens = tt.tokens_array
        biggest = int(tokens.max())
        if biggest > self.max_segment:
            line = int(tokens.argmax())
            raise CannotSegment(f"line {line + 1} alone has {biggest} tokens > max_segment {self.max_segment}")
        kind = detect_kind(tt.text) if kind is None else ContentKind(kind)
        table = LineTable.build(tt.text)
        if len(table) != n:
            raise CannotSegment(f"line table has {len(table)} lines, message has {n}")
        off = tt.token_offsets
        starts = raw_starts(table, kind)
        if tt.continued:  # step 3: every piece of a line cut by ``longlines`` starts a unit too
            starts = np.union1d(starts, np.flatnonzero(np.asarray(tt.continued, dtype=bool)))
        bounds = self._merge(starts, off, n)
        bounds = self._split(bounds, off, lambda: split_priority(table, kind))
        if len(bounds) < 3:
            raise CannotSegment(f"only one unit ({tt.total_tokens} tokens, {n} lines)")
        toks = np.diff(off[bounds]).tolist()
        # tuple.__new__ on zipped fields: the same Units as ``Unit(i, a, b, t, kind)``, without per-call overhead
        return list(map(partial(tuple.__new__, Unit),
                        zip(range(len(toks)), bounds[:-1], bounds[1:], toks, repeat(kind))))

    def _merge(self, starts: np.ndarray, off: np.ndarray, n: int) -> list[int]:
        """Step 4: boundaries (start lines + ``n``) after merging short units forward."""
        sel = starts[(starts > 0) & (starts < n)]
        cuts = sel.tolist()
        cum = off[sel].tolist()
        out = [0]
        base = 0
        lo = self.min_segment
        for c, t in zip(cuts, cum):
            if t - base >= lo:
                out.append(c)
                base = t
        if len(out) > 1 and int(off[n]) - base < lo:
            out.pop()  # short final unit merges backward
        out.append(n)
        return out

    def _split(self, bounds: list[int], off: np.ndarray, priority_fn: Callable[[], np.ndarray]) -> list[int]:
        """Step 5: split units over ``max_segment`` at the cheapest line starts."""
        hi, lo = self.max_segment, self.min_segment
        sizes = np.diff(off[bounds])
        if not (sizes > hi).any():
            return bounds
        pri = priority_fn()
        offl = off.tolist()
        out = [bounds[0]]
        for a, b in zip(bounds[:-1], bounds[1:]):
            pos = a
            while offl[b] - offl[pos] > hi:
                # candidate cut lines c in (pos, b) with tokens(pos, c) <= hi, preferring >= lo
                last_ok = min(bisect_right(offl, offl[pos] + hi) - 1, b - 1)
                first_ok = max(pos + 1, bisect_left(offl, offl[pos] + lo))
                if first_ok > last_ok:
                    first_ok = pos + 1
                last_ok = max(last_ok, first_ok)
                window = pri[first_ok:last_ok + 1][::-1]
                best = last_ok - int(np.argmin(window))
                out.append(best)
                pos = best
            out.append(b)
        return out
