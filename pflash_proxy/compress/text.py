"""Tokenized message text: whole lines with exact per-line token counts.

Every compression stage works on whole lines, so a message is held as its lines plus
one token count per line (counted exactly by the caller with the upstream tokenizer).

Algorithm:
1. ``split_lines(text)`` cuts after every ``"\\n"``; each line keeps its newline, so
   ``"".join(lines) == text`` byte for byte (only the last line may lack one).
2. ``TokenizedText`` checks that the lines rebuild the text and that there is one
   non-negative count per line (with ``pieces``, the lines may be pieces of lines, cut inside long lines by
   ``longlines``: a piece holds no newline but at its end), and exposes ``total_tokens`` and the cumulative
   token offsets (``token_offsets[i]`` = tokens before line ``i``) as a numpy array
   so later stages can take range sums in O(1).
3. ``approx_line_tokens(lines)`` is the cheap, deterministic estimate used by tests,
   benchmarks and the upper-bound pre-check: ``ceil(utf8_bytes / 4)``, at least 1
   for a non-empty line, 0 for an empty one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["TokenizedText", "approx_line_tokens", "approx_tokens", "split_lines"]


def split_lines(text: str) -> list[str]:
    """Split ``text`` after every ``"\\n"``; each line keeps its newline."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def approx_tokens(s: str) -> int:
    """ceil(utf8 bytes / 4); 0 for the empty string, else at least 1."""
    n = len(s.encode("utf-8"))
    return (n + 3) // 4


def approx_line_tokens(lines: list[str]) -> list[int]:
    """Cheap deterministic per-line token estimate (see module docstring, step 3)."""
    return [(len(s.encode("utf-8")) + 3) // 4 for s in lines]


@dataclass(frozen=True, eq=False)
class TokenizedText:
    """A message as whole lines with one exact token count per line."""

    text: str
    lines: list[str]
    line_tokens: list[int]
    pieces: bool = False  # lines may be pieces of lines (``longlines.Pieces.apply``): only the last may end a line
    continued: tuple[bool, ...] = ()  # per line: a piece that continues the line above, cut inside a long line

    def __post_init__(self) -> None:
        if len(self.lines) != len(self.line_tokens):
            raise ValueError(
                f"TokenizedText: {len(self.lines)} lines but {len(self.line_tokens)} token counts")
        if "".join(self.lines) != self.text:
            raise ValueError("TokenizedText: lines do not rebuild the text")
        if self.pieces:
            if any("\n" in s[:-1] for s in self.lines):
                raise ValueError("TokenizedText: a piece holds a newline before its end")
        elif not all(s.endswith("\n") and s.count("\n") == 1 for s in self.lines[:-1]):
            raise ValueError("TokenizedText: every line but the last must end with one newline")
        if self.line_tokens and min(self.line_tokens) < 0:
            raise ValueError("TokenizedText: negative token count")

    @classmethod
    def from_text(cls, text: str, line_tokens: list[int] | None = None) -> "TokenizedText":
        """Build from text; without counts, use :func:`approx_line_tokens`."""
        lines = split_lines(text)
        counts = approx_line_tokens(lines) if line_tokens is None else list(line_tokens)
        return cls(text, lines, counts)

    @cached_property
    def tokens_array(self) -> np.ndarray:
        return np.asarray(self.line_tokens, dtype=np.int64)

    @cached_property
    def token_offsets(self) -> np.ndarray:
        """``offsets[i]`` = tokens before line i; length ``len(lines) + 1``."""
        out = np.zeros(len(self.lines) + 1, dtype=np.int64)
        np.cumsum(self.tokens_array, out=out[1:])
        return out

    @cached_property
    def total_tokens(self) -> int:
        return int(self.token_offsets[-1])

    def range_tokens(self, start: int, end: int) -> int:
        """Tokens of lines ``[start, end)``."""
        return int(self.token_offsets[end] - self.token_offsets[start])

    def range_text(self, start: int, end: int) -> str:
        return "".join(self.lines[start:end])
