"""The three kinds of question about one function or method, and the leak check of the described ones.

1. ``named(target, rng)``: the bare name in one of ``NAMED`` templates ("What does `parse` do?").
2. ``qualified(target, rng)``: ``Class.method`` in one of the same templates (dunders and names that several
   classes of the file define are the generator's choice, not this module's).
3. ``described(target, fn, cls, tree, rng)``: what the function does in other words, none of its identifiers:
   a. the docstring's first sentence, code left out: backticked spans, ``:role:`x``` references, doctest lines,
      any word that is not plain letters (``a_b``, ``f()``, ``x.y``, ``camelCase``, digits), and every word that
      ``leaks``; a sentence that lost more than half of its words is not used;
   b. words of the body: the names it calls and the words of its string literals, names split into words
      (``compute_checksum`` → compute, checksum), each kept only when it does not ``leak`` on its own, the
      longest one word per called name (two words of one name in a row would spell it), at most
      ``BODY_WORDS`` in order of first use;
   c. one of the ``DESCRIBED`` templates around them; the whole question must pass ``leaks`` (else the next
      template; none passes, or too few content words: no question, the generator drops the function).
4. ``identifiers(fn, cls, tree)``: every name of the function's AST (its own name, arguments, names read or
   written, attributes, keyword names, names it imports or defines), its class's name, and every function and
   class name the file defines.
5. ``leaks(question, idents, own)``: the identifiers the question spells, case-insensitive: a word equal to an
   identifier as written (``parse_message``, ``encode``) or joined (``parsemessage``); the words of a
   several-word identifier in a row ("parse message"); any word of the function's or its class's own name
   (``own``: ``get_close_matches`` forbids "close" and "matches" anywhere).
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

__all__ = ["DESCRIBED", "NAMED", "described", "identifiers", "leaks", "named", "own_words", "qualified",
           "split_identifier", "words"]

BODY_WORDS = 6
MIN_CONTENT_WORDS = 3

NAMED = ("What does `{name}` do?",
         "How does {name} work, and what does it return?",
         "Explain `{name}`: what does it do with its arguments?",
         "In {name}, what happens step by step?",
         "When would I call `{name}`, and what does it give back?")

DESCRIBED = ("Which part of this source does this: {sentence}? It involves {body}. How is that done?",
             "Where is this done: {sentence}? Explain how, step by step.",
             "What handles the following here: {sentence}? I think it deals with {body}.",
             "Which piece of this source deals with {body}, and what does it do?")

STOPWORDS = frozenset("""a an the and or but if of to in on at by for with from as is are was were be been being
this that these those it its it's into than then so such not no nor can could should would will shall may might
must do does did done has have had having which who whom whose what when where why how all any each every some
other more most same both either neither only own very just also there their them they he she we you your our
i me my us one two""".split())

_WORD = re.compile(r"[A-Za-z0-9_]+")
_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_PLAIN = re.compile(r"[A-Za-z][a-z]*(?:['-][a-z]+)*")
_ROLE = re.compile(r":[a-z:]+:`[^`]*`")
_TICKS = re.compile(r"``[^`]*``|`[^`]*`")


def split_identifier(name: str) -> list[str]:
    """``parseHTTPMessage_v2`` → ["parse", "http", "message", "v", "2"] (lower case)."""
    return [p.lower() for p in _PARTS.findall(name)]


def words(text: str) -> list[str]:
    """The question's words, lower case, ``_`` splitting nothing (``a_b`` is one word)."""
    return [w.lower() for w in _WORD.findall(text)]


def identifiers(fn: ast.AST, cls: ast.ClassDef | None, tree: ast.AST) -> set[str]:
    """Step 4."""
    out: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.update(p for p in (n.asname or n.name).split("."))
            out.update(n.name.split("."))
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.update(n.module.split("."))
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            out.update(n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    if cls is not None:
        out.add(cls.name)
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
    return {i for i in out if i}


def own_words(name: str, cls: str | None) -> set[str]:
    """The words of the function's and its class's names (step 5's ``own``)."""
    return set(split_identifier(name)) | (set(split_identifier(cls)) if cls else set())


def leaks(question: str, idents: set[str], own: set[str]) -> list[str]:
    """Step 5: the identifiers ``question`` spells (empty: it spells none)."""
    ws = words(question)
    flat = [p for w in ws for p in (w.split("_") if "_" in w else [w]) if p]
    exact = {i.lower() for i in idents}
    joined = {"".join(split_identifier(i)) for i in idents}
    found = {w for w in ws if w in exact or w in joined or w.strip("_") in exact}
    found |= {w for w in flat if w in own or w in exact}
    text = " " + " ".join(flat) + " "
    for i in idents:
        parts = split_identifier(i)
        if len(parts) > 1 and " " + " ".join(parts) + " " in text:
            found.add(i)
    return sorted(found)


@dataclass(frozen=True)
class Target:
    """What a question is about (the generator's ``Function`` carries more)."""

    name: str
    cls: str | None

    @property
    def qualname(self) -> str:
        return f"{self.cls}.{self.name}" if self.cls else self.name


def named(target: Target, rng: random.Random) -> str:
    return rng.choice(NAMED).format(name=target.name)


def qualified(target: Target, rng: random.Random) -> str:
    if target.cls is None:
        raise ValueError(f"{target.name} is not a method")
    return rng.choice(NAMED).format(name=target.qualname)


def _first_sentence(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    para = " ".join(line.strip() for line in para.splitlines() if not line.strip().startswith(">>>"))
    return re.split(r"(?<=[.!?])\s", para, maxsplit=1)[0]


def _ok(word: str, idents_lower: set[str], joined: set[str], own: set[str]) -> bool:
    w = word.lower()
    return w not in idents_lower and w not in joined and w not in own


def _docstring_part(doc: str | None, idents_lower: set[str], joined: set[str], own: set[str]) -> list[str]:
    """Step 3a: the kept words of the first sentence, in order."""
    if not doc:
        return []
    sent = _TICKS.sub(" ", _ROLE.sub(" ", _first_sentence(doc)))
    out = []
    raws = sent.split()
    for raw in raws:
        w = raw.strip(".,;:!?()[]{}\"'")
        if not _PLAIN.fullmatch(w) or len(w) > 24 or (len(w) == 1 and w.lower() != "a"):
            continue  # a lone letter is what an apostrophe or a left-out name leaves behind
        if _ok(w, idents_lower, joined, own):
            out.append(w.lower() if w[:1].isupper() and w[1:].islower() else w)
    if 2 * len(out) < len(raws):
        return []  # more than half of it was code: no sentence
    while out and out[0].lower() in STOPWORDS:  # "the and hand back …": what a left-out word leaves behind
        out.pop(0)
    while out and out[-1].lower() in STOPWORDS:
        out.pop()
    return out


def _body_part(fn: ast.AST, idents_lower: set[str], joined: set[str], own: set[str]) -> list[str]:
    """Step 3b: words of the called names and string literals, first use first."""
    doc_node = None
    body = getattr(fn, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        doc_node = body[0].value
    found: list[str] = []
    nodes = sorted((n for n in ast.walk(fn) if hasattr(n, "lineno")),
                   key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    for n in nodes:
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            cands = split_identifier(name) if name else []
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n is not doc_node:
            cands = [w.lower() for w in re.findall(r"[A-Za-z]{4,}", n.value) if _PLAIN.fullmatch(w)]
        else:
            continue
        fresh = [w for w in cands if len(w) >= 3 and w.isalpha() and w not in STOPWORDS and w not in found
                 and _ok(w, idents_lower, joined, own)]
        if isinstance(n, ast.Call) and fresh:  # one word per called name: its words in a row would spell it
            fresh = [max(fresh, key=len)]
        found += [w for w in dict.fromkeys(fresh)]
    return found[:BODY_WORDS]


def _join(ws: list[str]) -> str:
    return ws[0] if len(ws) == 1 else ", ".join(ws[:-1]) + " and " + ws[-1]


def described(target: Target, fn: ast.AST, cls: ast.ClassDef | None, tree: ast.AST,
              rng: random.Random) -> str | None:
    """Step 3: a question about ``fn`` that spells none of its identifiers, or None."""
    idents = identifiers(fn, cls, tree)
    own = own_words(target.name, target.cls)
    lower = {i.lower() for i in idents}
    joined = {"".join(split_identifier(i)) for i in idents}
    sent = _docstring_part(ast.get_docstring(fn), lower, joined, own)  # type: ignore[arg-type]
    body = _body_part(fn, lower, joined, own)
    content = [w for w in sent if w.lower() not in STOPWORDS]
    sentence = " ".join(sent) if len(content) >= MIN_CONTENT_WORDS else ""
    body_text = _join(body) if len(body) >= 2 else ""
    options = []
    for t in DESCRIBED:
        if "{sentence}" in t and not sentence:
            continue
        if "{body}" in t and not body_text:
            continue
        if "{sentence}" not in t and len(body) < 4:
            continue  # a question of body words alone needs several of them
        options.append(t)
    rng.shuffle(options)
    for t in options:
        q = t.format(sentence=sentence, body=body_text)
        if not leaks(q, idents, own):
            return q
    return None
