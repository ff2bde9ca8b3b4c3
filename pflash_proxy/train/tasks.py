"""Training examples: a document, a query with its request span, and the units that answer it.

One ``Example`` per index ``i``, drawn from ``random.Random(seed * 1_000_003 + i)`` so that any example can be
rebuilt alone (the feature cache is resumable by index). The families:

1. **docstring**: a code document with docstrings removed; the question is a function's docstring summary;
   the gold is the unit holding that function.
2. **task**: the same, phrased as an agent's task about a whole file read by a tool; the query ends with the
   tool call (``read_file({...})``), as the proxy's request finder builds it for a tool message.
3. **heading**: a prose document; the question names a section's heading; the gold is the section's units.
4. **needle**: a fact planted as a line inside a random unit of any kind of document; the question asks it.
5. **latent**: a WordNet noun planted in prose; the question names it only by a hypernym or by its gloss, so
   question and evidence share no content word (NoLiMa-style).

Queries put the question at a random place between chat filler (before, after, both or neither); the
question's character span is the request probe's label.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import TypedDict
from functools import lru_cache

from . import corpus
from .corpus import Doc

NAMES = ["Anouk", "Bartholomew", "Chidi", "Dagny", "Esperanza", "Fionnuala", "Gustavo", "Hiroshi", "Isolde",
         "Jovana", "Kwabena", "Leocadia", "Matthias", "Nadezhda", "Oisin", "Perpetua", "Quentin", "Radhika",
         "Saoirse", "Thaddeus", "Ulrike", "Valentin", "Wilhelmina", "Xiomara", "Yevgeny", "Zainab"]
PRE = ["Hi!", "I have a question about the text above.", "Thanks for the help so far.", "Quick one:",
       "Please read carefully.", "Context: I am reviewing this before the release.", "Hello, me again.",
       "Here is what I need.", "I pasted the output above."]
POST = ["Answer briefly.", "Thanks!", "Cite the relevant lines.", "Keep it short, please.",
        "Reply in one sentence.", "If unsure, say so."]
STOP = frozenset("""a an the and or but if of to in on at by for with from into is are was were be been has have had
do does did which who what when where why how that this these those it its as than then there their they them he
she his her some kind any one something""".split())

FAMILIES = (("docstring", 0.2), ("task", 0.15), ("heading", 0.15), ("needle", 0.25), ("latent", 0.25))


class ExampleMeta(TypedDict):
    """An example's labels as the feature cache stores them beside its taps (line indices, unit indices)."""

    index: int
    family: str
    kind: str
    source: str
    units: list[int]
    containers: list[int]
    subunits: list[int]
    request: list[int]
    gold: list[int]
    query: str


@dataclass
class Example:
    index: int
    family: str
    doc: Doc
    query: str
    request: tuple[int, int]  # character span of the question inside ``query``
    gold: list[int] = field(default_factory=list)  # unit indices

    def meta(self) -> ExampleMeta:
        return {"index": self.index, "family": self.family, "kind": self.doc.kind, "source": self.doc.source,
                "units": self.doc.units, "containers": self.doc.containers, "subunits": self.doc.subunits,
                "request": list(self.request), "gold": self.gold, "query": self.query}


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP and len(w) > 2}


def wrap_query(rng: random.Random, question: str, suffix: str = "") -> tuple[str, tuple[int, int]]:
    pre = " ".join(rng.sample(PRE, rng.randint(1, 2))) if rng.random() < 0.5 else ""
    post = rng.choice(POST) if rng.random() < 0.4 else ""
    sep = rng.choice([" ", "\n", "\n\n"])
    head = pre + sep if pre else ""
    q = head + question + (sep + post if post else "") + suffix
    return q, (len(head), len(head) + len(question))


def insert_line(doc: Doc, at: int, text: str) -> None:
    """Insert ``text`` as line ``at``; labels at or after it move down one line."""
    doc.lines.insert(at, text)
    shift = lambda xs: [x + 1 if x >= at else x for x in xs]  # noqa: E731
    doc.units, doc.containers, doc.subunits = shift(doc.units), shift(doc.containers), shift(doc.subunits)
    doc.functions = [(n, s, x + 1 if x >= at else x) for n, s, x in doc.functions]
    doc.sections = [(h, x + 1 if x >= at else x) for h, x in doc.sections]


def plant(rng: random.Random, doc: Doc, sentence: str) -> int:
    """Plant ``sentence`` as a line inside a random unit (not the first); returns that unit's index."""
    j = rng.randrange(1, len(doc.units)) if len(doc.units) > 1 else 0
    end = doc.units[j + 1] if j + 1 < len(doc.units) else len(doc.lines)
    at = rng.randint(doc.units[j] + 1, max(doc.units[j] + 1, end - 1))
    line = {"code": lambda s: "    # " + s, "diff": lambda s: "+    # " + s,
            "jsonl": lambda s: json.dumps({"note": s}),
            "log": lambda s: corpus.log_record(rng, 43_200, "note: " + s, "WARN")[0]}.get(doc.kind, str)(sentence)
    if doc.kind == "jsonl":  # one record per line: the note is a record (unit) of its own
        at = doc.units[j]
        insert_line(doc, at, line)
        doc.units = sorted(set(doc.units) | {at})
        return doc.unit_of(at)
    insert_line(doc, at, line)
    return doc.unit_of(at)


# ------------------------------------------------------------------------------------------------ wordnet
WORDNET = "/usr/share/wordnet/data.noun"
LEX_FILES = {"05": "animal", "06": "artifact", "13": "food", "20": "plant"}


@lru_cache(maxsize=1)
def wordnet_pairs() -> tuple[tuple[str, str, str], ...]:
    """(word, hypernym word, gloss) for one-word concrete nouns whose hypernym and gloss share no word with it."""
    syn: dict[str, tuple[list[str], list[str], str, str]] = {}
    try:
        with open(WORDNET, encoding="latin-1") as fh:
            for line in fh:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                f = head.split()
                lex, n = f[1], int(f[3], 16)
                ws = [f[4 + 2 * k].replace("_", " ").lower() for k in range(n)]
                p = 4 + 2 * n
                hyper = [f[p + 1 + 4 * k + 1] for k in range(int(f[p])) if f[p + 1 + 4 * k] in ("@", "@i")]
                syn[f[0]] = (ws, hyper, gloss.split(";")[0].strip(), lex)
    except OSError:
        return ()
    common = _tagged_counts()
    out = []
    for ws, hyper, gloss, lex in syn.values():
        if lex not in LEX_FILES or not hyper or hyper[0] not in syn:
            continue
        word = ws[0]
        hw = syn[hyper[0]][0][0]
        if common.get(word, 0) < 1 or common.get(hw, 0) < 3:  # words a small model has seen often enough
            continue
        if " " in word or not word.isalpha() or len(word) < 4 or len(gloss) < 12 or len(gloss) > 90:
            continue
        if words(word) & (words(hw) | words(gloss)) or any(w[:5] in word for w in words(hw) | words(gloss)):
            continue
        out.append((word, hw, gloss))
    return tuple(sorted(out))


def _tagged_counts() -> dict[str, int]:
    """Lemma -> how often its senses were tagged in WordNet's sense-tagged corpus (index.noun)."""
    out: dict[str, int] = {}
    try:
        with open(WORDNET.replace("data.noun", "index.noun"), encoding="latin-1") as fh:
            for line in fh:
                if line.startswith(" "):
                    continue
                f = line.split()
                n_ptr = int(f[3])
                out[f[0].replace("_", " ")] = int(f[5 + n_ptr])
    except (OSError, IndexError, ValueError):
        return {}
    return out


NEEDLES = ["{name} keeps a {word} at the back of the studio.", "Last winter {name} bought a {word} at a market.",
           "A {word} was the present that {name} received on Tuesday.", "{name} once drew a {word} on a napkin."]
LATENT_Q = ["Which character has a connection to {desc}?", "Who in the text is linked to {desc}?",
            "Name the person associated with {desc}."]


def article(w: str) -> str:
    return ("an " if w[:1] in "aeiou" else "a ") + w


# ------------------------------------------------------------------------------------------------ examples
def _code(rng: random.Random, lo: int, hi: int) -> Doc:
    files = corpus.package_files()
    for _ in range(50):
        path, src = files[rng.randrange(len(files))]
        d = corpus.code_doc(path, src, rng, rng.randint(lo, hi))
        if d is not None and d.functions:
            return d
    raise RuntimeError("no package module yields a documented code window")


def _any_doc(rng: random.Random, lo: int, hi: int) -> Doc:
    kind = rng.choice(["code", "prose", "prose", "log", "jsonl", "diff"])
    n = rng.randint(lo, hi)
    if kind == "code":
        return _code(rng, lo, hi)
    return {"prose": corpus.prose_doc, "log": corpus.log_doc, "jsonl": corpus.jsonl_doc,
            "diff": corpus.diff_doc}[kind](rng, n)


def build(index: int, seed: int, lo: int = 3000, hi: int = 9000) -> Example:
    """Example ``index`` of the corpus seeded by ``seed`` (deterministic)."""
    rng = random.Random(seed * 1_000_003 + index)
    family = rng.choices([f for f, _ in FAMILIES], [w for _, w in FAMILIES])[0]
    if family == "latent" and not wordnet_pairs():
        family = "needle"  # no WordNet on this machine: the latent family is replaced (train says so)
    if family in ("docstring", "task"):
        doc = _code(rng, lo, hi)
        name, summ, line = rng.choice(doc.functions)
        s = summ[0].lower() + summ[1:].rstrip(".")
        if family == "docstring":
            q = rng.choice(["Which function does this: {s}?", "Where is the code that does this: {s}?",
                            "Explain the function whose job is to {s}.", "{S}"]).format(s=s, S=summ)
            query, span = wrap_query(rng, q)
        else:
            q = rng.choice(["Fix the bug in the code that does this: {s}.", "Add type hints to `{n}`.",
                            "Write a unit test for the function that does this: {s}.",
                            "Why does `{n}` fail on empty input?"]).format(s=s, n=name)
            call = f'\nread_file({json.dumps({"path": doc.source})})'
            query, span = wrap_query(rng, q, call)
        return Example(index, family, doc, query, span, [doc.unit_of(line)])
    if family == "heading":
        doc = corpus.prose_doc(rng, rng.randint(lo, hi))
        k = rng.randrange(len(doc.sections))
        title, start = doc.sections[k]
        end = doc.sections[k + 1][1] if k + 1 < len(doc.sections) else len(doc.lines)
        gold = sorted({doc.unit_of(x) for x in range(start, end) if doc.lines[x].strip()})
        q = rng.choice(["What does the documentation say about {h}?", "Summarize the section on {h}.",
                        "Explain {h}."]).format(h=title.split(" (")[0])
        query, span = wrap_query(rng, q)
        return Example(index, family, doc, query, span, gold)
    if family == "latent":
        doc = corpus.prose_doc(rng, rng.randint(lo, hi))
        word, hyper, gloss = rng.choice(wordnet_pairs())
        name = rng.choice(NAMES)
        needle = rng.choice(NEEDLES).format(name=name, word=word)
        for _ in range(10):
            desc = rng.choice([f"some kind of {hyper}", article(gloss) if gloss[:2] not in ("a ", "an") else gloss,
                               f"{article(hyper)}"])
            q = rng.choice(LATENT_Q).format(desc=desc)
            if not (words(q) & words(needle)):
                break
        else:
            return build(index + 7_777_777, seed, lo, hi)
        gold = [plant(rng, doc, needle)]
        query, span = wrap_query(rng, q)
        return Example(index, family, doc, query, span, gold)
    doc = _any_doc(rng, lo, hi)
    thing = rng.choice(["relay", "vault", "archive", "beacon", "ledger", "turbine", "kiln", "observatory"])
    attr = rng.choice(["access code", "serial number", "owner", "colour", "location", "opening year"])
    value = f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randint(10, 99)}-{rng.choice(NAMES).upper()}"
    gold = [plant(rng, doc, f"The {attr} of the {rng.choice(['old', 'north', 'spare'])} {thing} is {value}.")]
    query, span = wrap_query(rng, f"What is the {attr} of the {thing}?")
    return Example(index, family, doc, query, span, gold)
