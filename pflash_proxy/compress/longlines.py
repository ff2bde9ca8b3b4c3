"""Cut inside long lines: a line over ``max_segment`` tokens becomes several pieces, each a whole part of it.

Units are runs of whole lines, so a line longer than a unit (a Wikipedia paragraph, a raw HTML page, a JSON API
answer or a minified script on one line) once made the whole message impossible to cut.  This module cuts such a
line at the finest whole pieces its kind has; every later stage then treats a piece like a line.

Algorithm (``cut_long_lines(tt, max_segment)``):
1. Only lines whose token count exceeds ``max_segment`` are cut; every other line is one piece.
2. A line's kind is sniffed from its first 4 KB (``sniff``): JSON (starts with ``{``/``[`` or is a member
   ``"key": [``/``"key": {`` of pretty-printed JSON), HTML (starts with
   ``<`` or holds many tags), a log record (a timestamp or level prefix), minified code (many ``;{}``) or prose.
3. Each kind has a chain of cutters, finest whole piece first; a piece still over the limit goes to the next
   cutter of the chain (each cutter is one linear scan of the span it cuts, so the chain is linear):
   - JSON and code (``tree``): one scan finds brackets and separators outside strings (code: also comments);
     a span is cut at the child boundaries of the container that owns it (JSON: array items and object members;
     code: statements, ``;``/``,`` and a ``}`` that ends a statement); a child still too big is cut at the
     children of its largest container, and so on down (a container with one child is passed through: deep
     nesting costs one step per level).
   - HTML (``html_blocks``): before every block element's opening tag and after its closing tag (``p``, ``div``,
     ``li``, ``tr``, ``h1``-``h6``, ``section``...; a ``script``/``style`` element is one piece whose content is
     cut as code); then before any tag (``html_tags``).
   - Log records (``fields``): before each ``key=value`` / ``key: value`` field.
   - Prose (``sentences``): after ``.!?`` (and closing quotes/brackets) followed by white space and a capital or
     digit, unless the word before is a known abbreviation or an initial; after ``。！？``.  Decimals
     (``3.14``) never match (no white space).
   - Last resort (``hard``): pieces of at most the limit's characters, cut after the last white space in the
     window's second half, else at the character boundary.  No piece exceeds the limit.
4. The limit in characters: ``(max_segment - 1) * chars / tokens`` of the line, so the piece's share of the
   line's tokens (``Pieces.apply``: split in proportion to characters, rounded on the running sums so the pieces
   add up to the line exactly) stays within ``max_segment``.
5. Every piece carries what it is in the reader's terms (``Label``): a noun (``sentence``, ``item``, ``member``,
   ``element``, ``statement``, ``field``, ``characters`` for a hard cut, ``line`` for a whole line), its
   1-based position among its container's children and their count (items and members), and the container's id,
   so an omission note can say ``items 14–212 of 400`` or ``6 sentences``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from .text import TokenizedText

__all__ = ["Label", "Pieces", "cut_line", "cut_long_lines", "describe", "sniff"]


class Label(NamedTuple):
    """What a piece of a line is: noun, 1-based position among its siblings and their count (0, 0: not
    counted), and its container's id within the line (-1: none)."""

    noun: str
    ordinal: int = 0
    total: int = 0
    group: int = -1


_LINE = Label("line")
_CHARS = Label("characters")
Piece = tuple[int, Label]  # (end offset in the line, label); a line's pieces are consecutive from 0

# --- sniffing ---------------------------------------------------------------------------------------------------
_SAMPLE = 4096
_LOG_HEAD = re.compile(
    r"\s*(?:\[?\d{4}-\d\d-\d\d|\[?\d\d:\d\d:\d\d|\[?(?:TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL|CRITICAL)\b"
    r"|[A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d)")
_MEMBER = re.compile(r'"[^"\\\n]{0,200}"\s*:\s*[\[{]')  # a pretty-printed JSON line holding one large member
_TAG = re.compile(r"<[A-Za-z/!][^<>]{0,200}>")


def sniff(s: str) -> str:
    """The kind of one long line: ``json``, ``html``, ``log``, ``code`` or ``prose`` (module docstring, step 2)."""
    head = s[:_SAMPLE]
    t = head.lstrip()
    if t[:1] in "[{" or _MEMBER.match(t):
        return "json"
    tags = len(_TAG.findall(head))
    if t[:1] == "<" and tags >= 2 or tags * 40 >= len(head):
        return "html"
    if _LOG_HEAD.match(head):
        return "log"
    marks = sum(head.count(c) for c in ";{}")
    stops = head.count(". ")
    if marks * 60 >= len(head) and marks > 2 * stops:
        return "code"
    return "prose"


# --- cutters ----------------------------------------------------------------------------------------------------
# A cutter cuts ``s[a:b]`` into whole pieces (ends and labels, the last end ``b``), cutting any piece still over
# ``limit`` characters with the ``rest`` of its chain, or returns None when it finds no cut.
Cutter = Callable[[str, int, int, int, tuple["Cutter", ...]], "list[Piece] | None"]


def _chain(s: str, a: int, b: int, limit: int, cutters: tuple[Cutter, ...]) -> list[Piece]:
    """``s[a:b]`` cut by the first cutter of ``cutters`` that finds a cut, else by ``hard``."""
    if b - a <= limit:
        return [(b, _CHARS)]
    for i, cut in enumerate(cutters):
        got = cut(s, a, b, limit, cutters[i + 1:])
        if got is not None and len(got) > 1:
            return got
    return hard(s, a, b, limit)


def _finish(s: str, a: int, ends: Sequence[tuple[int, Label, tuple[Cutter, ...] | None]], limit: int,
            rest: tuple[Cutter, ...]) -> list[Piece]:
    out: list[Piece] = []
    pos = a
    for end, label, sub in ends:
        if end <= pos:
            continue
        if end - pos > limit:
            out.extend(_chain(s, pos, end, limit, rest if sub is None else sub))
        else:
            out.append((end, label))
        pos = end
    return out


def hard(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...] = ()) -> list[Piece]:
    """Step 3, last resort: windows of at most ``limit`` characters, cut after white space where it can."""
    out: list[Piece] = []
    pos = a
    limit = max(1, limit)
    while b - pos > limit:
        end = pos + limit
        half = pos + limit // 2
        ws = max(s.rfind(" ", half, end), s.rfind("\t", half, end))
        cut = ws + 1 if ws >= 0 else end
        out.append((cut, _CHARS))
        pos = cut
    out.append((b, _CHARS))
    return out


_ABBREV = frozenset(
    "mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx no nos vol vols fig figs p pp ed eds inc ltd co "
    "corp dept univ gen col lt sgt capt cmdr rev hon jan feb mar apr jun jul aug sep sept oct nov dec est ca "
    "u.s u.k a.m p.m ph.d b.a m.a".split())
# a sentence end: a run of ``.!?`` that starts there (so a long run is scanned once), closing quotes or brackets,
# white space, then the next sentence's first letter or digit; or a CJK full stop
_SENT = re.compile(r"(?<![.!?])[.!?]++[\"'”’)\]]*+\s++(?=[\"'“‘(\[]?[A-Z0-9À-ÖØ-Þ])|[。！？]++\s*+")
_WORD_BEFORE = re.compile(r"\S{1,12}$")
_DOTTED = re.compile(r"(?:\w\.)+\w")


def sentences(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...]) -> list[Piece] | None:
    """Step 3, prose: after each sentence end in ``s[a:b]`` (not after an abbreviation or an initial)."""
    ends: list[tuple[int, Label, tuple[Cutter, ...] | None]] = []
    label = Label("sentence")
    for m in _SENT.finditer(s, a, b):
        e = m.end()
        if e >= b:
            break
        if s[m.start()] == ".":
            w = _WORD_BEFORE.search(s, max(a, m.start() - 12), m.start())
            word = w.group(0).lstrip("\"'“‘([").lower() if w else ""
            if word in _ABBREV or len(word) == 1 and word.isalpha() or _DOTTED.fullmatch(word):
                continue
        ends.append((e, label, None))
    if not ends:
        return None
    ends.append((b, label, None))
    return _finish(s, a, ends, limit, rest)


# a field starts after white space with ``key=value`` or ``key: value``; or after `` | ``; a match starts only at
# the start of a white-space run, so a long run is scanned once
_FIELD = re.compile(r"(?<!\s)\s++(?:(?=[\w.@/\[\]-]{1,64}[=:][^\s=:]|[\w.@/\[\]-]{1,64}: \S)|\|\s*+)")


def fields(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...]) -> list[Piece] | None:
    """Step 3, log records: before each ``key=value`` / ``key: value`` field (and after each ``|``)."""
    label = Label("field")
    ends: list[tuple[int, Label, tuple[Cutter, ...] | None]] = [
        (m.end(), label, None) for m in _FIELD.finditer(s, a, b) if a < m.end() < b]
    if not ends:
        return None
    ends.append((b, label, None))
    return _finish(s, a, ends, limit, rest)


_BLOCK_TAGS = frozenset(
    "p div li ul ol tr td th table thead tbody tfoot caption h1 h2 h3 h4 h5 h6 section article header footer nav "
    "main aside form blockquote pre figure figcaption dl dt dd br hr head body html title meta link script style "
    "noscript template details summary option select fieldset address iframe svg".split())
_OPEN_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]{0,15})(?![A-Za-z0-9])[^<>]{0,4000}+>")
_ANY_TAG = re.compile(r"<[A-Za-z/!][^<>]{0,4000}+>")


def html_blocks(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...]) -> list[Piece] | None:
    """Step 3, HTML: before each block element and after its end; a ``script`` or ``style`` element is one
    piece, cut further as code."""
    label = Label("element")
    ends: list[tuple[int, Label, tuple[Cutter, ...] | None]] = []
    last, skip = a, a
    lower: str | None = None
    for m in _OPEN_TAG.finditer(s, a, b):
        if m.start() < skip:
            continue  # inside a script or style element
        closing, name = m.group(1), m.group(2).lower()
        if name not in _BLOCK_TAGS:
            continue
        cut = m.end() if closing else m.start()
        if last < cut < b:
            ends.append((cut, label, None))
            last = cut
        if not closing and name in ("script", "style"):
            if lower is None:
                lower = s[a:b].lower()
            close = lower.find("</" + name, m.end() - a)
            end = b if close < 0 else (lower.find(">", close) + 1 + a if lower.find(">", close) >= 0 else b)
            if end > last:
                ends.append((end, label, (tree_code,)))
                last = end
            skip = end
    if not ends:
        return None
    if ends[-1][0] != b:
        ends.append((b, label, None))
    return _finish(s, a, ends, limit, rest)


def html_tags(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...]) -> list[Piece] | None:
    """Step 3, HTML fallback: before every tag."""
    label = Label("element")
    ends: list[tuple[int, Label, tuple[Cutter, ...] | None]] = [
        (m.start(), label, None) for m in _ANY_TAG.finditer(s, a, b) if m.start() > a]
    if not ends:
        return None
    ends.append((b, label, None))
    return _finish(s, a, ends, limit, rest)


# JSON / code structure: strings (code: also comments and templates), brackets and separators
_JSON_TOK = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{},]')
_CODE_TOK = re.compile(
    r'"(?:[^"\\\n]++|\\.)*+"?|\'(?:[^\'\\\n]++|\\.)*+\'?|`(?:[^`\\]++|\\.)*+`?|/\*(?:[^*]++|\*(?!/))*+(?:\*/)?'
    r"|[\[\]{}(),;]")
# after a ``}``, what continues the statement (so the ``}`` ends no statement)
_BRACE_GOES_ON = re.compile(r"\s*+(?:[;,)\]}.:?&|+\-*/=<>]|else\b|catch\b|finally\b|while\b|$)")


class _Tree:
    """The containers of one span (linked lists of ints, so deep nesting costs a few ints per level): for each,
    its opening offset, its end (after its closer, or the span's end), its bracket, its direct sub-containers and
    its child boundaries (the offsets right after its separators)."""

    def __init__(self, s: str, a: int, b: int, code: bool) -> None:
        self.open, self.end, self.bracket = [a], [b], [""]
        self.first_sub, self.last_sub, self.next_sib = [-1], [-1], [-1]
        self.first_sep, self.last_sep = [-1], [-1]
        self.sep_pos: list[int] = []
        self.sep_next: list[int] = []
        stack = [0]
        for m in (_CODE_TOK if code else _JSON_TOK).finditer(s, a, b):
            c = s[m.start()]
            if c in "[{(":
                k = len(self.open)
                self.open.append(m.start())
                self.end.append(b)
                self.bracket.append(c)
                self.first_sub.append(-1)
                self.last_sub.append(-1)
                self.next_sib.append(-1)
                self.first_sep.append(-1)
                self.last_sep.append(-1)
                p = stack[-1]
                if self.last_sub[p] < 0:
                    self.first_sub[p] = k
                else:
                    self.next_sib[self.last_sub[p]] = k
                self.last_sub[p] = k
                stack.append(k)
            elif c in "]})":
                if len(stack) > 1:
                    k = stack.pop()
                    self.end[k] = m.end()
                    if code and c == "}" and self.bracket[stack[-1]] in ("", "{") \
                            and not _BRACE_GOES_ON.match(s, m.end(), b):
                        self._sep(stack[-1], m.end())  # a block that ends a statement
            elif c in ",;":
                self._sep(stack[-1], m.end())

    def _sep(self, k: int, pos: int) -> None:
        i = len(self.sep_pos)
        self.sep_pos.append(pos)
        self.sep_next.append(-1)
        if self.last_sep[k] < 0:
            self.first_sep[k] = i
        else:
            self.sep_next[self.last_sep[k]] = i
        self.last_sep[k] = i

    def seps(self, k: int) -> list[int]:
        out = []
        i = self.first_sep[k]
        while i >= 0:
            out.append(self.sep_pos[i])
            i = self.sep_next[i]
        return out

    def owner(self, s: str, k: int, lo: int, hi: int) -> tuple[int, list[int]]:
        """The container that cuts ``[lo, hi)`` (owned by ``k``) and its child boundaries there: ``k``, or down
        through containers of one child to the first with several (its largest sub-container each step); -1
        when there is none."""
        while True:
            cuts = [p for p in self.seps(k) if lo < p < hi]
            if cuts and s[cuts[-1]:hi].isspace():
                cuts.pop()  # a trailing separator
            if cuts:
                return k, cuts
            subs = self.subs(k)
            if not subs:
                return -1, []
            k = max(subs, key=lambda j: self.end[j] - self.open[j])

    def subs(self, k: int) -> list[int]:
        out = []
        j = self.first_sub[k]
        while j >= 0:
            out.append(j)
            j = self.next_sib[j]
        return out


def _tree(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...], code: bool) -> list[Piece] | None:
    """Step 3, JSON and code: ``s[a:b]`` cut at the child boundaries of the container that owns it; a child
    still over ``limit`` is cut at the children of its largest container, and so on down (depth first, with an
    explicit stack so the pieces come in order); what has no structure left goes to ``rest``."""
    tree = _Tree(s, a, b, code)
    out: list[Piece] = []
    # work items in reverse order: (lo, hi, container) to cut, or (lo, hi, -1) for the rest of the chain
    todo: list[tuple[int, int, int, Label | None]] = [(a, b, 0, None)]
    while todo:
        lo, hi, k, done = todo.pop()
        if done is not None:
            out.append((hi, done))
            continue
        if k < 0:
            out.extend(_chain(s, lo, hi, limit, rest))
            continue
        k, cuts = tree.owner(s, k, lo, hi)
        if k < 0:
            todo.append((lo, hi, -1, None))
            continue
        bounds = [lo, *cuts, hi]
        total = len(bounds) - 1
        noun = ("item" if tree.bracket[k] in ("[", "") else "member") if not code else \
            {"[": "item", "(": "argument"}.get(tree.bracket[k], "statement")
        subs = tree.subs(k)
        si = 0
        items: list[tuple[int, int, int, Label | None]] = []
        for i in range(total):
            x, y = bounds[i], bounds[i + 1]
            if y - x <= limit:
                items.append((x, y, 0, Label(noun, i + 1, total, tree.open[k])))
                continue
            best, size = -1, 0
            while si < len(subs) and tree.open[subs[si]] < y:
                j = subs[si]
                if tree.open[j] >= x and tree.end[j] - tree.open[j] > size:
                    best, size = j, tree.end[j] - tree.open[j]
                si += 1
            items.append((x, y, best, None))
        todo.extend(reversed(items))
    return out if len(out) > 1 else None


def tree_json(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...]) -> list[Piece] | None:
    """Step 3, JSON: array items and object members."""
    return _tree(s, a, b, limit, rest, code=False)


def tree_code(s: str, a: int, b: int, limit: int, rest: tuple[Cutter, ...]) -> list[Piece] | None:
    """Step 3, minified code: statements (and the items of a large array or argument list)."""
    return _tree(s, a, b, limit, rest, code=True)


CHAINS: dict[str, tuple[Cutter, ...]] = {
    "json": (tree_json, sentences),
    "html": (html_blocks, html_tags, sentences),
    "log": (fields, tree_json, sentences),
    "code": (tree_code,),
    "prose": (sentences, fields),
}


def cut_line(s: str, tokens: int, max_segment: int, kind: str | None = None) -> list[Piece]:
    """A line's pieces (ends in ``s``, the last ``len(s)``) so that none is over ``max_segment`` of the line's
    ``tokens`` by its share of the characters (module docstring, steps 2-4)."""
    n = len(s)
    if tokens <= max_segment or n <= 1:
        return [(n, _LINE)]
    body = n - 1 if s.endswith("\n") else n
    limit = max(1, (max_segment - 1) * n // tokens)
    pieces = _chain(s, 0, body, limit, CHAINS[kind or sniff(s)])
    end, label = pieces[-1]
    pieces[-1] = (n, label)  # the newline goes with the last piece
    if len(pieces) > 1 and pieces[-1][0] - pieces[-2][0] > limit:  # the newline pushed the last one over
        pieces[-1:] = [(body, label), (n, label)]
    return pieces


# --- pieces of a message ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pieces:
    """A message's lines cut into pieces: per piece its line, its length in characters (of the text that was cut:
    behind a line-number gutter, without the number) and its ``Label``; per line the gutter's characters, which
    the served text's first piece of the line holds as well."""

    line: tuple[int, ...]
    length: tuple[int, ...]
    label: tuple[Label, ...]
    prefix: tuple[int, ...]
    n_lines: int

    def __len__(self) -> int:
        return len(self.line)

    def first(self) -> list[int]:
        """Per line, its first piece; then the number of pieces."""
        out = [0] * (self.n_lines + 1)
        seen = -1
        for i, ln in enumerate(self.line):
            if ln != seen:
                out[ln] = i
                seen = ln
        out[self.n_lines] = len(self.line)
        return out

    def whole(self, line: int, first: Sequence[int]) -> bool:
        return first[line + 1] - first[line] == 1

    def apply(self, tt: TokenizedText, *, numbered: bool = False, newlines: bool = False) -> TokenizedText:
        """``tt`` (the cut text, or with ``numbered`` the same lines with their gutter) as pieces, each with its
        share of its line's tokens (step 4); with ``newlines`` each piece ends with a newline (a text of whole
        lines, for the segmenter and the scorers), else the pieces rebuild ``tt`` exactly."""
        if len(tt.lines) != self.n_lines:
            raise ValueError(f"pieces of {self.n_lines} lines, the text has {len(tt.lines)}")
        first = self.first()
        lines: list[str] = []
        counts: list[int] = []
        cont = [False] * len(self.line)
        for ln in range(self.n_lines):
            a, b = first[ln], first[ln + 1]
            text, tok = tt.lines[ln], tt.line_tokens[ln]
            if b - a == 1:
                lines.append(text)
                counts.append(tok)
                continue
            cont[a + 1:b] = [True] * (b - a - 1)
            off = self.prefix[ln] if numbered and self.prefix else 0
            n = len(text)
            if sum(self.length[a:b]) + off != n:
                raise ValueError(f"line {ln + 1}: pieces of {sum(self.length[a:b]) + off} characters, the line "
                                 f"has {n}")
            pos, given = 0, 0
            for i in range(a, b):
                end = pos + self.length[i] + (off if i == a else 0)
                share = (2 * end * tok + n) // (2 * n)
                piece = text[pos:end]
                lines.append(piece + "\n" if newlines and not piece.endswith("\n") and i < b - 1 else piece)
                counts.append(share - given)
                pos, given = end, share
        if newlines:
            return TokenizedText("".join(lines), lines, counts, continued=tuple(cont))
        return TokenizedText(tt.text, lines, counts, pieces=True, continued=tuple(cont))

    def to_plain(self) -> tuple[object, ...]:
        """Plain tuples of ints and strings (a session record stores them; ``from_plain`` reads them back)."""
        labels = tuple((x.noun, x.ordinal, x.total, x.group) for x in self.label)
        return self.line, self.length, labels, self.prefix, self.n_lines

    @classmethod
    def from_plain(cls, plain: Sequence[object]) -> "Pieces":
        line, length, labels, prefix, n = plain
        assert isinstance(line, tuple) and isinstance(length, tuple) and isinstance(labels, tuple) \
            and isinstance(prefix, tuple) and isinstance(n, int), "pieces: not the plain form of to_plain"
        return cls(line, length, tuple(Label(*x) for x in labels), prefix, n)


def cut_long_lines(tt: TokenizedText, max_segment: int, prefix: Sequence[int] | None = None) -> Pieces | None:
    """The pieces of ``tt``'s lines: every line over ``max_segment`` tokens cut (``cut_line``), the others whole;
    None when no line is over.  ``prefix``: per line, the characters of the gutter the served lines carry in
    front of ``tt``'s (``gutter.Gutter.prefix``)."""
    counts = tt.line_tokens
    if not counts or max(counts) <= max_segment:
        return None
    line: list[int] = []
    length: list[int] = []
    label: list[Label] = []
    for i, (text, tok) in enumerate(zip(tt.lines, counts)):
        if tok <= max_segment:
            line.append(i)
            length.append(len(text))
            label.append(_LINE)
            continue
        pos = 0
        for end, lab in cut_line(text, tok, max_segment):
            if end > pos:
                line.append(i)
                length.append(end - pos)
                label.append(lab)
                pos = end
    return Pieces(tuple(line), tuple(length), tuple(label), tuple(prefix) if prefix else (), len(tt.lines))


def _plural(noun: str, k: int) -> str:
    if noun == "characters":
        return "character" if k == 1 else "characters"
    return noun if k == 1 else noun + "s"


def describe(labels: Sequence[Label], lengths: Sequence[int]) -> str:
    """What a run of pieces inside one line is, in the reader's terms: ``items 14–212 of 400`` (the items or members
    of one container), ``6 sentences`` (the pieces of one noun in a row, whatever their container), ``1,204
    characters``; runs of several kinds joined with commas (at most three, then ``…``)."""
    parts: list[str] = []
    i = 0
    n = len(labels)
    while i < n:
        lab = labels[i]
        j = i + 1
        counted = bool(lab.total) and lab.noun in ("item", "member")
        while j < n and labels[j].noun == lab.noun and (labels[j].group == lab.group or not counted):
            j += 1
        if lab.noun == "characters":
            k = sum(lengths[i:j])
            parts.append(f"{k:,} {_plural(lab.noun, k)}")
        elif counted:
            a, b = lab.ordinal, labels[j - 1].ordinal
            parts.append(f"{lab.noun} {a} of {lab.total}" if a == b else f"{lab.noun}s {a}–{b} of {lab.total}")
        else:
            parts.append(f"{j - i:,} {_plural(lab.noun, j - i)}")
        i = j
    if len(parts) > 3:
        parts = parts[:3] + ["…"]
    return ", ".join(parts)
