"""Per-kind cut candidates: the line starts where a new structural unit may begin.

All features are computed once per message over its UTF-8 bytes with numpy, so the
cost is linear and mostly vectorised; Python loops only touch candidate lines.

Algorithm:
1. ``LineTable``: line start/end byte offsets, indentation, blank flags, first and
   last non-newline byte of every line (vectorised over the byte array).
2. Code (``code_features``): blank out string literals and comments with one linear
   pass (Python: triple/single quoted strings and ``#``; C-like/JS: ``/* */``, ``//``,
   quotes and backtick templates; none opens on a markdown fence line; an opener whose
   literal cannot close is not tried again, see ``_literal_spans``), marking every line
   that *starts* inside a literal.
   Bracket depth at each line start is the running sum of ``([{`` minus ``)]}``,
   clamped at zero (clamped sum = sum - min(0, running minimum)), restarted at lines that
   are at depth 0 in any well-formed file (markdown fences; column-0 definitions; in
   C-like code the line after a column-0 ``}``), so one stray bracket cannot swallow the
   rest of the message.
3. Code starts: indentation 0, depth 0, not inside a literal, not a leader (blank,
   comment, decorator), not a continuation (``else``/``elif``/``except``/``finally``/
   ``catch``/``{``/closers, or the previous code line ends with an operator or ``\\``).
   Each start then moves back over the contiguous top-level leaders above it, so
   comments, decorators and blank lines go with the definition that follows.
4. Prose/unknown: a non-blank line after a blank line, or a markdown heading; inside
   a ``````` fence only an indentation-0 line after a blank line that is not a
   continuation; an indented line after an indented block is not a start.
5. Records: each non-blank, non-indented line whose first-byte class (digit, ``{``,
   ``[``, letter, other) is the dominant one (>= 60% of lines); otherwise every
   non-indented line.  Indented lines (stack traces) join the record above.
6. Chat: turn lines ``Speaker: ...`` of speakers that appear at least twice.
7. Diff: ``diff `` file headers, ``--- `` headers not preceded by header lines, and
   ``@@`` hunks not directly after a ``+++ `` line.
8. ``split_priority``: a per-line cost for cutting an oversize unit (lower is better):
   for code ``2*indent`` (+1 unless a definition/decorator/comment; +1000 inside
   brackets or a literal; +2 right under a decorator or comment line of the same
   indentation, so a split cuts above the decorators, not between them and their
   ``def``); otherwise 0 after a blank line, 1 after a sentence end.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence, cast

import numpy as np

from .kinds import TURN_RE, ContentKind

__all__ = ["LineTable", "raw_starts", "split_priority"]

# unrolled loops: no per-character backtracking inside literals. DOTALL: an escape (a backslash and any byte)
# may be a backslash-newline, which opens many a docstring; without it such a literal was missed and its quotes
# paired wrongly with later ones, leaving the rest of the file "inside a string". One pattern per alternative, in
# the order a single alternation (``|``) would try them; ``_LITERALS`` says which open at which byte.
_DQ3 = rb'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'
_SQ3 = rb"'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
_DQ = rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*'  # + '"': a body that stops at a newline (or the end) never closes
_SQ = rb"'[^'\\\n]*(?:\\.[^'\\\n]*)*"
_BLOCK = rb"/\*[^*]*\*+(?:[^/*][^*]*\*+)*/"
_TEMPLATE = rb"`[^`\\]*(?:\\.[^`\\]*)*`"
_MULTI, _LINE, _SHORT = 0, 1, 2  # a failed attempt scans to the end / to its body's stop / a few bytes


def _alt(opener: bytes, pattern: bytes, scan: int) -> tuple[bytes, re.Pattern[bytes], re.Pattern[bytes] | None, int]:
    body = re.compile(pattern, re.S) if scan == _LINE else None
    return opener, re.compile(pattern + (opener[:1] if scan == _LINE else b""), re.S), body, scan


_LITERALS = {  # python -> first byte -> alternatives (opener, pattern, body pattern, scan) in alternation order
    True: {ord('"'): (_alt(b'"""', _DQ3, _MULTI), _alt(b'"', _DQ, _LINE)),
           ord("'"): (_alt(b"'''", _SQ3, _MULTI), _alt(b"'", _SQ, _LINE)),
           ord("#"): (_alt(b"#", rb"#[^\n]*", _SHORT),)},
    False: {ord("/"): (_alt(b"/*", _BLOCK, _MULTI), _alt(b"//", rb"//[^\n]*", _SHORT)),
            ord('"'): (_alt(b'"', _DQ, _LINE),),
            ord("'"): (_alt(b"'", rb"'(?:\\.|[^'\\\n]){0,4}'", _SHORT),),
            ord("`"): (_alt(b"`", _TEMPLATE, _MULTI),)},
}

_PY_HINT = re.compile(rb"^(?:def |class |import |from \S+ import |async def |@\w)|:\s*(?:#.*)?$", re.M)
_C_HINT = re.compile(rb"[;{}]\s*$", re.M)
_CONT = (b"else:", b"else ", b"else{", b"elif ", b"except", b"finally", b"catch", b"{", b")", b"]", b"}", b".", b"&&",
         b"||", b"?")
_DEFS = (b"def ", b"class ", b"async de", b"function", b"@", b"#", b"//", b"/*", b"export ", b"const ", b"let ",
         b"fn ", b"pub ", b"func ", b"impl ", b"struct ")
_LEADERS = (b"@", b"#", b"//")  # step 8: decorator and comment lines, cut above with the line they lead
_HEADINGS = (b"# ", b"## ", b"### ", b"#### ", b"##### ", b"###### ")
_DIFF_HDR = (b"diff ", b"index ", b"new file", b"deleted file", b"similarity", b"rename ", b"old mode", b"new mode")
_TURN_B = re.compile(TURN_RE.pattern.encode(), re.M)
# step 2: lines that are at bracket depth 0 in any well-formed file, whatever came before: a markdown fence, a
# definition at column 0 (Python; JS/TS, Go, Rust, C) and, in C-like code, the line after a column-0 closing
# brace. Depth restarts there, so one stray bracket (a prose preamble whose ``#`` was taken for a comment, a JS
# regex literal the literal pass cannot tell from a division) cannot leave the rest of the message "inside
# brackets" with no cut candidates at all. In indented code these are no-ops (the depth there is 0 anyway);
# statements that may sit at column 0 inside a body of unindented code (``const``, ``let``) are left out.
_FENCE = (b"```", b"~~~")
_RESYNC_PY = (*_FENCE, b"def ", b"class ", b"async def ")
_RESYNC_C = (*_FENCE, b"function", b"async fu", b"export ", b"import ", b"class ", b"interfac", b"fn ",
             b"pub fn ", b"pub stru", b"pub enum", b"pub trai", b"impl ", b"impl<", b"func ", b"package ",
             b"struct ", b"enum ", b"#include", b"#define ")
_OPERATOR_END = np.frombuffer(b"=,+-*/%&|^<\\", dtype=np.uint8)


@dataclass(kw_only=True)
class LineTable:
    """Vectorised per-line features of a text (see step 1)."""

    data: bytes
    arr: np.ndarray
    starts: np.ndarray
    ends: np.ndarray  # exclusive, newline excluded
    indent: np.ndarray
    blank: np.ndarray
    first: np.ndarray  # first byte of the line (10 for an empty line)
    last: np.ndarray  # last non-whitespace byte (0 for a blank line)
    last_pos: np.ndarray  # byte offset of the last non-whitespace byte (start for a blank line)
    code: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # cached code_features
    heads: np.ndarray | None = None  # cached packed line heads

    @classmethod
    def build(cls, text: str) -> "LineTable":
        data = text.encode("utf-8")
        arr = np.frombuffer(data, dtype=np.uint8)
        n = len(arr)
        nl = np.flatnonzero(arr == 10)
        starts = np.concatenate(([0], nl + 1)).astype(np.int64)
        ends = np.concatenate((nl, [n])).astype(np.int64)
        if n == 0 or arr[-1] == 10:
            starts, ends = starts[:-1], ends[:-1]
        pos = np.flatnonzero((arr > 32) | ((arr < 9) | ((arr > 13) & (arr < 32))))  # non-whitespace bytes
        padded = np.concatenate((arr, [10]))
        if len(pos) == 0:
            z = np.zeros(len(starts), dtype=np.int64)
            return cls(data=data, arr=arr, starts=starts, ends=ends, indent=z, blank=np.ones(len(starts), bool),
                       first=padded[starts], last=z.astype(np.uint8), last_pos=starts.copy())
        k = np.minimum(np.searchsorted(pos, starts), len(pos) - 1)
        first_nonws = pos[k]
        blank = (first_nonws >= ends) | (first_nonws < starts)
        indent = np.where(blank, 0, first_nonws - starts)
        kl = np.maximum(np.searchsorted(pos, ends) - 1, 0)
        last_pos = np.where(blank, starts, pos[kl])
        last = np.where(blank, 0, padded[last_pos]).astype(np.uint8)
        return cls(data=data, arr=arr, starts=starts, ends=ends, indent=indent, blank=blank, first=padded[starts],
                   last=last, last_pos=last_pos)

    def packed(self) -> np.ndarray:
        """First 8 bytes after each line's indentation as one little-endian uint64 (0-padded)."""
        if self.heads is None:
            first = self.starts + self.indent
            idx = first[:, None] + np.arange(8)[None, :]
            padded = np.concatenate((self.arr, np.zeros(8, np.uint8)))
            m = padded[idx]
            m[idx >= self.ends[:, None]] = 0
            self.heads = np.ascontiguousarray(m).view("<u8").ravel()
        return self.heads

    def startswith(self, prefixes: tuple[bytes, ...]) -> np.ndarray:
        """Lines whose text after indentation starts with one of ``prefixes`` (<= 8 bytes each)."""
        h = self.packed()
        out = np.zeros(len(self), dtype=bool)
        for p in prefixes:
            val = int.from_bytes(p[:8].ljust(8, b"\0"), "little")
            mask = (1 << (8 * min(len(p), 8))) - 1
            out |= (h & np.uint64(mask)) == np.uint64(val)
        return out

    def __len__(self) -> int:
        return len(self.starts)



def _literal_spans(data: bytes, arr: np.ndarray, python: bool, fences: Sequence[tuple[int, int]] = (),
                   work: list[int] | None = None) -> list[int]:
    """Flattened spans of the literals and comments of step 2, leftmost first, none overlapping.

    1. Every literal opens with one of a few bytes, so a match is tried only at those bytes (in order,
       skipping any inside the previous match), alternative by alternative as ``_LITERALS`` orders them.
    2. No literal opens on a markdown fence line (byte ranges ``fences``): its backticks would open a JS
       template literal that ran to the closing fence, leaving a whole fenced JS/C file "inside a string",
       with no cut points.
    3. Linear on any input: an attempt that fails is remembered. A multi-line literal (a triple-quoted
       string, a ``/*`` comment, a template) that does not close from ``p`` does not close from any later
       opener either (a later opener that the first scan did not take for a closer is escaped in it, so both
       scans read the same tokens from there on), so that alternative is never tried again. A quoted string
       that stops unclosed at ``f`` (a newline, the end) fails likewise from every opener before ``f``.
       Without this, an unclosed ``/*`` made every later ``/*`` rescan to the end: quadratic time.

    ``work``, when given, gets the bytes each attempt scanned added to ``work[0]`` (a failed multi-line
    attempt: to the end), a measure of the regex work that tests bound.
    """
    table = _LITERALS[python]
    cand = np.zeros(len(arr), dtype=bool)
    for c in table:
        cand |= arr == c
    for a, b in fences:
        cand[a:b] = False
    n = len(data)
    dead: dict[bytes, int] = {}  # opener -> attempts from before this offset fail
    flat: list[int] = []
    end = scanned = 0
    for p in np.flatnonzero(cand).tolist():
        if p < end:
            continue
        for opener, pat, body, scan in table[data[p]]:
            if not data.startswith(opener, p) or p < dead.get(opener, -1):
                continue
            m = pat.match(data, p)
            if m is not None:
                end = m.end()
                scanned += end - p
                flat.append(p)
                flat.append(end)
                break
            stop = n if scan == _MULTI else _body_end(body, data, p) if scan == _LINE else min(n, p + 6)
            scanned += stop - p
            if scan != _SHORT:
                dead[opener] = n + 1 if scan == _MULTI else stop
    if work is not None:
        work[0] += scanned
    return flat


def _body_end(body: re.Pattern[bytes] | None, data: bytes, p: int) -> int:
    """Where a ``_LINE`` alternative's body (``_alt`` compiles one for every such alternative) stops."""
    return cast(re.Match[bytes], cast(re.Pattern[bytes], body).match(data, p)).end()


def _clamped_depth(run: np.ndarray, at_line: np.ndarray, resets: np.ndarray) -> np.ndarray:
    """Bracket depth at each line start: the running sum clamped at zero, restarted at every reset (step 2).

    Segmented running minimum without a loop: segment ``s`` is shifted down by ``s * big``, so the cumulative
    minimum never carries an earlier segment's value past a reset (each segment starts at 0 below them all).
    """
    bounds = np.unique(np.concatenate(([0], resets)))
    seg = np.searchsorted(bounds, np.arange(len(run)), side="right") - 1
    v = run - run[bounds][seg]
    big = 3 * (len(run) + 1)
    seg_min = np.minimum.accumulate(v - seg * big) + seg * big
    depth: np.ndarray = (v - np.minimum(seg_min, 0))[at_line]
    return depth


def code_features(t: LineTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(depth at line start, starts-inside-literal, has code after stripping) per line (step 2).

    Works on the sparse positions only: literal spans from one regex pass, bracket bytes
    outside them, and line starts looked up with ``searchsorted``.
    """
    if t.code is not None:
        return t.code
    head = t.data[:16384]
    python = len(_PY_HINT.findall(head)) >= len(_C_HINT.findall(head))
    fence = _fence_lines(t)
    flat = _literal_spans(t.data, t.arr, python, list(zip(t.starts[fence].tolist(), t.ends[fence].tolist())))
    sp = np.array(flat, dtype=np.int64).reshape(-1, 2)
    ss, se = sp[:, 0], sp[:, 1]

    def inside(p: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ss, p, side="right") - 1
        return (k >= 0) & (p < se[np.maximum(k, 0)]) if len(ss) else np.zeros(len(p), bool)

    arr = t.arr
    bpos = np.flatnonzero((arr == 40) | (arr == 41) | (arr == 91) | (arr == 93) | (arr == 123) | (arr == 125))
    bpos = bpos[~inside(bpos)]
    ab = arr[bpos]
    delta = np.where((ab == 40) | (ab == 91) | (ab == 123), 1, -1).astype(np.int64)
    run = np.concatenate(([0], np.cumsum(delta)))
    at_line = np.searchsorted(bpos, t.starts, side="left")  # brackets before each line start
    in_lit = inside(t.starts - 1) & (t.starts > 0)
    col0 = ~in_lit & (t.indent == 0)
    resync = col0 & t.startswith(_RESYNC_PY if python else _RESYNC_C)
    if not python:  # `}`, `};`, `});` at column 0 close a top-level block (not `} else {`)
        resync[1:] |= (col0 & (t.first == 125) & (t.last != 123))[:-1]
    depth = _clamped_depth(run, at_line, at_line[resync])
    first = t.starts + t.indent
    k = np.searchsorted(ss, first, side="right") - 1
    all_lit = (k >= 0) & (first < se[np.maximum(k, 0)] if len(se) else False) \
        & (t.last_pos < (se[np.maximum(k, 0)] if len(se) else 0))
    has_code = ~t.blank & ~all_lit
    t.code = (depth, in_lit, has_code)
    return t.code


def _code_starts(t: LineTable) -> np.ndarray:
    depth, in_lit, has_code = code_features(t)
    n = len(t)
    top = (depth == 0) & ~in_lit
    leader = t.blank | (top & (t.indent == 0) & (~has_code | (t.first == 64)))  # 64 = '@'
    cand = top & (t.indent == 0) & ~leader
    cand &= ~t.startswith(_CONT)
    idx = np.arange(n)
    last_code = np.maximum.accumulate(np.where(has_code, idx, -1))
    prev_code = np.concatenate(([-1], last_code[:-1]))
    prev_last = np.where(prev_code >= 0, t.last[np.maximum(prev_code, 0)], 0)
    cand &= ~np.isin(prev_last, _OPERATOR_END)
    # step 3: move each start back over the contiguous top-level leaders above it
    leaderish = leader & ((t.indent == 0) | t.blank) & ~in_lit
    last_non = np.maximum.accumulate(np.where(~leaderish, idx, -1))
    c = np.flatnonzero(cand)
    moved = np.where(c > 0, last_non[np.maximum(c - 1, 0)] + 1, 0)
    return np.unique(np.concatenate(([0], moved))).astype(np.int64)


def _fence_lines(t: LineTable) -> np.ndarray:
    """Indices of markdown fence lines (```` ``` ```` or ``~~~``, indented at most 3)."""
    return np.flatnonzero(t.startswith(_FENCE) & (t.indent <= 3))


def _fences(t: LineTable) -> np.ndarray:
    inside = np.zeros(len(t), dtype=bool)
    lines = _fence_lines(t)
    for a, b in zip(lines[0::2].tolist(), lines[1::2].tolist()):
        inside[a + 1:b] = True
    if len(lines) % 2:
        inside[lines[-1] + 1:] = True
    return inside


def _prose_starts(t: LineTable) -> np.ndarray:
    n = len(t)
    prev_blank = np.concatenate(([True], t.blank[:-1]))
    idx = np.arange(n)
    last_nb = np.maximum.accumulate(np.where(~t.blank, idx, -1))
    prev_nb = np.concatenate(([-1], last_nb[:-1]))
    prev_indented = np.where(prev_nb >= 0, t.indent[np.maximum(prev_nb, 0)] > 0, False)
    cand = ~t.blank & prev_blank & ~((t.indent > 0) & prev_indented)
    cand |= t.startswith(_HEADINGS) & (t.indent == 0)
    fence = _fences(t)
    ok_in_fence = (t.indent == 0) & ~np.isin(t.first, np.frombuffer(b")]}.", dtype=np.uint8))
    cand &= ~fence | ok_in_fence
    cand &= ~(fence & t.startswith(_CONT))
    cand[0] = True
    return np.flatnonzero(cand)


def _record_starts(t: LineTable) -> np.ndarray:
    f = t.first
    cls = np.select([(f >= 48) & (f <= 57), f == 123, f == 91, ((f | 32) >= 97) & ((f | 32) <= 122)], [1, 2, 3, 4], 5)
    head = ~t.blank & (t.indent == 0)
    counts = np.bincount(cls[head], minlength=6)
    dom = int(counts.argmax())
    cand = head & (cls == dom) if counts[dom] >= 0.6 * max(int(head.sum()), 1) else head
    cand[0] = True
    return np.flatnonzero(cand)


def _chat_starts(t: LineTable) -> np.ndarray:
    hits = [(m.start(), m.group(1)) for m in _TURN_B.finditer(t.data)]
    speakers = Counter(sp for _, sp in hits)
    pos = [p for p, sp in hits if speakers[sp] >= 2]
    lines = np.searchsorted(t.starts, pos, side="right") - 1
    return np.unique(np.concatenate(([0], lines))).astype(np.int64)


def _diff_starts(t: LineTable) -> np.ndarray:
    at0 = t.indent == 0
    hdr = t.startswith(_DIFF_HDR) & at0
    minus = t.startswith((b"--- ",)) & at0
    plus = t.startswith((b"+++ ",)) & at0
    hunk = t.startswith((b"@@ ",)) & at0

    def prev(m: np.ndarray) -> np.ndarray:
        return np.concatenate(([False], m[:-1]))

    def nxt(m: np.ndarray) -> np.ndarray:
        return np.concatenate((m[1:], [False]))

    cand = t.startswith((b"diff ",)) & at0
    cand |= minus & nxt(plus) & ~prev(hdr)
    cand |= hunk & ~prev(plus)
    cand[0] = True
    return np.flatnonzero(cand)


def raw_starts(t: LineTable, kind: ContentKind) -> np.ndarray:
    """Sorted unit-start line indices (always containing 0) for ``kind``."""
    if len(t) == 0:
        return np.zeros(0, dtype=np.int64)
    fn = {ContentKind.CODE: _code_starts, ContentKind.RECORDS: _record_starts,
          ContentKind.CHAT: _chat_starts, ContentKind.DIFF: _diff_starts}.get(kind, _prose_starts)
    return fn(t)


def split_priority(t: LineTable, kind: ContentKind) -> np.ndarray:
    """Per-line cost of starting a piece at that line when splitting an oversize unit."""
    n = len(t)
    prev_last = np.concatenate(([0], t.last[:-1]))
    prev_blank = np.concatenate(([True], t.blank[:-1]))
    if kind is ContentKind.CODE:
        depth, in_lit, _ = code_features(t)
        pri = 2 * t.indent.astype(np.int64) + 1 + 1000 * ((depth > 0) | in_lit)
        pri[t.startswith(_DEFS) & (t.indent <= 8)] -= 1
        # a line right under a decorator or comment of its indentation belongs with it: cut above the leaders
        lead = t.startswith(_LEADERS) & ~t.blank
        led = np.zeros(n, dtype=bool)
        led[1:] = lead[:-1] & (t.indent[:-1] == t.indent[1:])
        pri[led] += 2
    else:
        sentence_end = np.isin(prev_last, np.frombuffer(b".!?:;\"')]", dtype=np.uint8))
        pri = np.where(prev_blank, 0, np.where(sentence_end, 1, 2)).astype(np.int64)
    pri[t.blank] += 5000
    out: np.ndarray = pri[:n]
    return out
