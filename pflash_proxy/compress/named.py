"""Definitions the request names: the unit that defines an identifier the question spells out is always kept.

An agent asking "what does array_split do?" about a file it just read must get ``array_split`` whatever a
scorer thinks of its words, and one asking about ``Store.__setitem__`` must get that class's method, not the
``__setitem__`` of another class.  Sans-IO, on the text the cutter saw (behind any line-number gutter).

Algorithm (``named_definitions``):
1. Definition lines: a line that starts (after indentation and ``export``/``pub``/``async``) with ``def``,
   ``class``, ``function``, ``fn``, ``func`` (with or without a receiver), ``struct``, ``enum``, ``interface``,
   ``trait`` or ``type`` followed by a name; the name and the line index are kept.
2. Owners, from indentation alone (any language): a definition's owner is the nearest definition line above it
   whose block (step 6) holds it, or an ``impl [Trait for] Name`` line (Rust); a Go method's owner is its
   receiver's type (``func (s *Store) Pop()``).
3. Qualified names in the request: ``Owner.name``, ``Owner::name``, ``Owner#name`` (every adjacent pair of a
   dotted chain), "the ``name`` method of ``Owner``" (also function/property/attribute/member, of/in/on/from,
   an optional ``class``/``struct``/``type`` before the owner), "``name`` of class ``Owner``" and "Owner's
   name".  A pair whose name is defined in that owner keeps exactly those definitions.
4. Bare names: names of at least 3 characters that the request contains as whole words (``\\b``,
   case-sensitive) and that no pair of step 3 resolved; a name that is also an ordinary word (``release``,
   ``Lock``: letters only, at most a leading capital) only where the request uses it as a name (``_AS_NAME``:
   quoted in backticks, called ``name(``, "does/in/explain/call ``name`` work/do/returns/,/?", "what ``name``
   does", "the ``name`` function"), not in a user's sentence ("the next release raises").  Defined once: that definition.  Defined several times:
   each definition is rated by the request's other words: 3 when its owner's name is one of them, plus one per
   request term (``lexicon`` parts, lowercased, stopwords and the name's own parts left out) in the owner's name
   and a half per such term in the rest of its definition line.  When the ratings differ, the best-rated
   definitions are the named ones; when they are all equal, the request does not say which, and every
   definition is *optional*: the pipeline keeps them while they fit its named share of the budget
   (``pipeline`` step 4).
5. More than ``MAX_NAMES`` distinct names: the request is a list, not a question about one definition: none.
6. A definition's block runs from its line to its last non-blank line before the next non-blank line indented no
   deeper (a closing ``}``/``)``/``]`` at its indentation still belongs to it; a comment line, at any indentation,
   decides nothing: it is inside when code after it is), with the decorators right above
   its line; the units overlapping the block are its units, at most ``MAX_UNITS`` of them (the first ones:
   decorators, signature and docstring).

``named_units``: the units of steps 1-6, named and optional together.

``outline``: the definitions an omission marker names (class-like ones, and the functions and methods at file or
class level, with their owners; step 2).

``definition_atoms(tt, units, max_tokens)``: the units of every function and method (not nested in a function),
those sharing a unit merged; what ``coderank`` ranks and keeps as one piece.

``definition_blocks(tt, units, max_tokens)``: every definition (step 1's lines, any name) whose block (step 6)
spans more than one unit and at most ``max_tokens`` tokens, as the tuple of its units; the innermost first when
blocks nest. A definition longer than the cutter's largest unit is cut inside; the pipeline keeps the rest of such
a block with the part it chose, when the rest is small (``pipeline`` step 4).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from typing import NamedTuple, Sequence

from .lexicon import text_terms
from .scores import STOPWORDS
from .text import TokenizedText
from .units import Unit

__all__ = ["NamedDefinitions", "definition_atoms", "definition_blocks", "definitions", "named_definitions",
           "named_units", "outline", "owners"]

MAX_NAMES = 3
MAX_UNITS = 4
_DEF = re.compile(
    r"^[ \t]*(?:export\s+)?(?:default\s+)?(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?"
    r"(?P<kind>def|class|function\*?|fn|func(?:\s*\([^)]*\))?|struct|enum|interface|trait|type)\s+"
    r"(?P<name>[A-Za-z_$][\w$]*)", re.M)
_CONTAINERS = ("class", "struct", "enum", "interface", "trait", "type")
_IMPL = re.compile(r"^[ \t]*(?:unsafe\s+)?impl\b(?:\s*<[^>]*>)?\s+(?:[\w:]+(?:<[^>]*>)?\s+for\s+)?&?([A-Za-z_]\w*)")
_RECEIVER = re.compile(r"^[ \t]*func\s*\(\s*\w*\s*\*?\s*([A-Za-z_]\w*)")
_ID = r"[A-Za-z_$][\w$]*"
_CHAIN = re.compile(rf"{_ID}(?:\s*(?:\.|::|#)\s*{_ID})+")
_KIND = r"(?:method|function|property|attribute|member|constructor|operator|field|hook)"
_OWNER_KIND = r"(?:(?:the\s+)?(?:class|struct|type|trait|interface|enum|object)\s+)?"
_PHRASES = (  # (regex, group of the name, group of the owner)
    (re.compile(rf"({_ID})\s+{_KIND}\s+(?:of|in|on|from)\s+(?:the\s+)?{_OWNER_KIND}({_ID})"), 1, 2),
    (re.compile(rf"\b{_KIND}\s+({_ID})\s+(?:of|in|on|from)\s+(?:the\s+)?{_OWNER_KIND}({_ID})"), 1, 2),
    (re.compile(rf"({_ID})\s+(?:of|in|on|from)\s+(?:the\s+)?(?:class|struct|type|trait|interface)\s+({_ID})"), 1, 2),
    (re.compile(rf"({_ID})'s\s+({_ID})"), 2, 1),
)
_PLAIN = re.compile(r"[a-z]+|[A-Z][a-z]+")  # step 4: a name that is also an ordinary word ("release", "Lock")
_AS_NAME = (  # step 4: ... counts where the request uses it as a name: quoted, called, or in a question about it
    r"`[^`\n]*(?<![\w.]){n}(?![\w])[^`\n]*`", r"\b{n}\s*\(",
    r"\b(?:does|did|do|[Ii]n|[Ee]xplain|[Cc]all|[Cc]alling|[Uu]se|[Uu]sing)\s+{n}\b(?=\s*(?:works?\b|do\b|does\b"
    r"|returns?\b|means?\b|[,:?]))",
    r"\b[Ww]hat\s+{n}\s+(?:does|do|returns?)\b", r"\b{n}\s+(?:function|method|def)\b",
    r"\b(?:function|method|def|class)\s+{n}\b")
_GENERIC = frozenset("method function property attribute member class struct type def return returns what does "
                     "do work code file line lines".split())


class NamedDefinitions(NamedTuple):
    """Step 4's outcome: units always kept, and definitions (each a tuple of units) kept while they fit."""

    named: frozenset[int]
    optional: tuple[tuple[int, ...], ...]


def definitions(tt: TokenizedText) -> list[tuple[int, str]]:
    """Step 1: (line index, name) of every definition line; the functions below take it, so the lines are
    matched once per message."""
    return [(i, m.group("name")) for i, line in enumerate(tt.lines) if (m := _DEF.match(line))]


def owners(lines: Sequence[str], defs: Sequence[tuple[int, str]]) -> dict[int, str]:
    """Step 2: definition line -> the name of its owner (definitions without one are left out)."""
    return {i: name for i, (name, _) in _owners(lines, defs).items()}


def _owners(lines: Sequence[str], defs: Sequence[tuple[int, str]]) -> dict[int, tuple[str, bool]]:
    """Step 2: definition line -> (owner's name, whether the owner is a class-like container)."""
    heads = sorted([*defs, *((i, m.group(1)) for i, line in enumerate(lines)
                             if (m := _IMPL.match(line)) and not _DEF.match(line))])
    out: dict[int, tuple[str, bool]] = {}
    stack: list[tuple[int, int, str, bool]] = []  # (indent, end line, name, container) of the open blocks
    for i, name in heads:
        ind = _indent(lines[i])
        while stack and (stack[-1][1] <= i or stack[-1][0] >= ind):
            stack.pop()
        if (m := _RECEIVER.match(lines[i])) is not None:
            out[i] = (m.group(1), True)
        elif stack:
            out[i] = (stack[-1][2], stack[-1][3])
        d = _DEF.match(lines[i])
        stack.append((ind, _block_end(lines, i), name, d is None or d.group("kind") in _CONTAINERS))
    return out


def outline(lines: Sequence[str], defs: Sequence[tuple[int, str]]) -> tuple[tuple[int, str, str | None], ...]:
    """What an omission marker names (``rewrite.names_in``): per definition line, in order, its name and its
    owner's: class-like definitions (owner ``None``, name ``"class X"``, ``"struct X"``...), and the functions and
    methods the file, those or an ``impl`` block hold (a function nested in a function is left out)."""
    own = _owners(lines, defs)
    out: list[tuple[int, str, str | None]] = []
    for i, name in defs:
        m = _DEF.match(lines[i])
        kind = m.group("kind") if m is not None else "def"
        owner = own.get(i)
        if owner is not None and not owner[1]:
            continue  # inside a function body
        if kind in _CONTAINERS:
            out.append((i, f"{kind} {name}", None))
        else:
            out.append((i, name, owner[0] if owner is not None else None))
    return tuple(out)


def _pairs(request: str) -> set[tuple[str, str]]:
    """Step 3: (owner, name) pairs the request spells out."""
    text = request.replace("`", "")
    out: set[tuple[str, str]] = set()
    for m in _CHAIN.finditer(text):
        parts = re.split(r"\s*(?:\.|::|#)\s*", m.group(0))
        out.update(zip(parts, parts[1:]))
    for rx, name, owner in _PHRASES:
        for m in rx.finditer(text):
            out.add((m.group(owner), m.group(name)))
    return out


def _as_name(name: str, request: str) -> bool:
    """Step 4: the request uses the ordinary word ``name`` as a name (``_AS_NAME``)."""
    n = re.escape(name)
    return any(re.search(p.format(n=n), request) for p in _AS_NAME)


def _terms(text: str) -> set[str]:
    return {t for t in text_terms(text) if t not in STOPWORDS and len(t) > 1}


def named_definitions(tt: TokenizedText, units: Sequence[Unit], request: str,
                      defs: list[tuple[int, str]] | None = None) -> NamedDefinitions:
    """Steps 1-6: the units of the definitions the request names, and the optional ones."""
    none = NamedDefinitions(frozenset(), ())
    if not request or not units:
        return none
    defs = definitions(tt) if defs is None else defs
    where: dict[str, list[int]] = defaultdict(list)
    for i, name in defs:
        if len(name) >= 3:
            where[name].append(i)
    words = set(re.findall(_ID, request))
    if not where or words.isdisjoint(where):
        return none
    owner = owners(tt.lines, defs)
    chosen: list[int] = []
    resolved: set[str] = set()
    used: set[str] = set()  # owners that told which definition: not names of their own
    for o, n in _pairs(request):  # step 3
        hit = [i for i in where.get(n, ()) if owner.get(i) == o]
        if hit:
            chosen += hit
            resolved.add(n)
            used.add(o)
    bare = [n for n in where if n in words and n not in resolved and (not _PLAIN.fullmatch(n) or _as_name(n, request))]
    qterms = _terms(request) - _GENERIC
    optional: list[list[int]] = []
    single: list[str] = []
    for n in bare:  # step 4
        at = where[n]
        if len(at) == 1:
            single.append(n)
            continue
        own = qterms - _terms(n)
        rating = [3.0 * (owner.get(i) in words) + len(_terms(owner.get(i, "")) & own)
                  + 0.5 * len((_terms(tt.lines[i]) - _terms(n)) & own) for i in at]
        if max(rating) > min(rating):
            best = [i for i, r in zip(at, rating) if r == max(rating)]
            chosen += best
            used.update(owner[i] for i in best if owner.get(i) in words)
        else:
            optional.append(at)
    single = [n for n in single if n not in used]
    chosen += [where[n][0] for n in single]
    if len(resolved) + len(bare) - len(used & set(bare)) > MAX_NAMES:
        return none
    starts = [u.start_line for u in units]

    def span(at: int) -> tuple[int, ...]:  # step 6
        end = _block_end(tt.lines, at)
        first, last = bisect_right(starts, _decorated(tt.lines, at)) - 1, bisect_right(starts, end - 1) - 1
        return tuple(range(first, min(last, first + MAX_UNITS - 1) + 1))

    named = frozenset(k for at in chosen for k in span(at))
    return NamedDefinitions(named, tuple(span(at) for group in optional for at in group))


def named_units(tt: TokenizedText, units: Sequence[Unit], request: str,
                defs: list[tuple[int, str]] | None = None) -> set[int]:
    """The units of the definitions the request names, optional ones included (module docstring)."""
    found = named_definitions(tt, units, request, defs)
    return set(found.named).union(*found.optional)


def _decorated(lines: Sequence[str], at: int) -> int:
    """Step 6: the first line of the decorators right above the definition line ``at`` (``at`` without any)."""
    depth, first, k = _indent(lines[at]), at, at - 1
    while k >= 0 and lines[k].strip():
        text = lines[k].lstrip()
        if text.startswith("@") and _indent(lines[k]) == depth:
            first = k
        elif not (_indent(lines[k]) > depth or text.startswith((")", "]", "}"))):
            break  # not a decorator, nor a line of one that runs over several lines
        k -= 1
    return first


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _block_end(lines: Sequence[str], start: int) -> int:
    """Step 6: the line after the definition starting at ``start``."""
    depth, last = _indent(lines[start]), start
    for k in range(start + 1, len(lines)):
        text = lines[k].strip()
        if text.startswith(("#", "//")):
            continue  # a comment, even at column 0, is inside when the code after it is (decided there)
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


def definition_atoms(tt: TokenizedText, units: Sequence[Unit], max_tokens: int,
                     defs: list[tuple[int, str]] | None = None) -> list[tuple[int, ...]]:
    """The units of each function or method (a ``def``, ``function``, ``fn``, ``func`` at file scope or in a
    class-like body, not one nested in a function: steps 1, 2, 6), with its decorators; definitions that share a
    unit are one group (a unit holding the tail of one and the head of the next). The groups of at most
    ``max_tokens`` tokens, in order (``coderank``: what the selection keeps whole in code)."""
    if len(units) < 2:
        return []
    defs = definitions(tt) if defs is None else defs
    own = _owners(tt.lines, defs)
    starts = [u.start_line for u in units]
    spans: list[tuple[int, int]] = []
    for i, _ in defs:
        m = _DEF.match(tt.lines[i])
        if m is None or m.group("kind") in _CONTAINERS:
            continue
        o = own.get(i)
        if o is not None and not o[1]:
            continue  # nested in a function: part of that one
        first = bisect_right(starts, _decorated(tt.lines, i)) - 1
        last = bisect_right(starts, _block_end(tt.lines, i) - 1) - 1
        spans.append((first, last))
    spans.sort()
    out: list[tuple[int, ...]] = []
    cur: list[int] | None = None
    for a, b in spans:
        if cur is not None and a <= cur[1]:
            cur[1] = max(cur[1], b)
            continue
        if cur is not None:
            out.append(tuple(range(cur[0], cur[1] + 1)))
        cur = [a, b]
    if cur is not None:
        out.append(tuple(range(cur[0], cur[1] + 1)))
    return [g for g in out if sum(units[k].tokens for k in g) <= max_tokens]
