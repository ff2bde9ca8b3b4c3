"""Calibration sets for the flat-relevance gate: pointed questions and "list every X" over the same cold documents.

Documents are real text installed with Python, each one whole: the top-level standard-library modules (code) and
the reference-manual topics behind ``help()`` (prose, ``pydoc_data.topics``), as ``bench/cases/generator.py``
reads them. Each document goes to ``train`` or ``test`` by a hash of its name (``split``), so a calibration on
train never sees a test document.

A case (``make_case``) is one cold user message: several shuffled documents of one split and one kind,
concatenated (``# ===== Lib/x.py =====`` / ``===== topic =====`` headers) up to the target length in
``approx_tokens``, followed by the question:
- ``pointed``: about one thing in one document. Code: a documented function (``_code._candidates``: a docstring
  whose first sentence starts with a verb), asked "Which function <that sentence>?" (``described``) or "What
  does <name> do ...?" (``named``), a third of the described ones asking to "list all the steps" (words that
  make the flat gate apply). Prose: one paragraph, asked about one of its sentences' words in other order
  ("Where do the docs explain this ...?"; a third "Quote all that the docs say about ...").
- ``aggregation``: "List every function or method that uses ``X``" (code), X a word held by at least
  ``AGG_SHARE`` of the documents' blocks (definitions), or "List every paragraph that mentions "a", "b" or "c""
  (prose), the commonest words (at most 4) until their paragraphs are ``AGG_SHARE`` of all: more than a budget of
  ~30 % can keep. These must be served whole.
``agent_read``: an agent_reads file (``benchmarks/agent_reads/cases.py``) as a Claude Code ``Read`` result
(``N<TAB>line``), with its question asked in the user turn before it: the cold agent read (no earlier turn).
"""

from __future__ import annotations

import hashlib
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pflash_proxy.bench.cases._code import _candidates  # noqa: E402
from pflash_proxy.bench.cases.generator import _stdlib_modules  # noqa: E402
from pflash_proxy.compress.text import approx_tokens  # noqa: E402

AGG_SHARE = 0.4
_STOP = frozenset("""a an the and or but if of to in on at by for with from into as is are was were be been it its
this that these those there which who what when where why how not no can may must will would should could than then
so such also any all each other only one two more most some same see used use using value values""".split())


@dataclass(frozen=True)
class Doc:
    name: str
    kind: str  # "code" | "prose"
    text: str


@dataclass(frozen=True)
class GateCase:
    case_id: str
    kind: str  # "pointed" | "aggregation" | "agent_read"
    docs: str  # "code" | "prose" | "agent"
    target: int
    messages: list[dict]
    long_index: int
    gold: str  # a pointed case's evidence ("" for aggregation)


def split(name: str) -> str:
    return "train" if int(hashlib.sha1(name.encode()).hexdigest(), 16) % 2 == 0 else "test"


def documents(which: str) -> list[Doc]:
    out = [Doc(p, "code", s) for p, s in _stdlib_modules() if 1500 <= len(s) <= 200_000]
    try:
        from pydoc_data.topics import topics
    except ImportError:
        topics = {}
    out += [Doc(k, "prose", v) for k, v in sorted(topics.items()) if len(v) >= 1500]
    return [d for d in out if split(d.name) == which]


def _header(d: Doc) -> str:
    return f"# ===== {d.name} =====\n" if d.kind == "code" else f"===== {d.name} =====\n"


def _blocks(d: Doc) -> list[str]:
    """Definitions (code: top-level and method ``def`` blocks) or paragraphs (prose)."""
    if d.kind == "prose":
        return [p for p in re.split(r"\n\s*\n", d.text) if len(p) > 80]
    return re.split(r"\n(?=[ \t]*(?:async\s+)?def |class )", d.text)[1:]


def _fill(rng: random.Random, pool: list[Doc], target: int, first: Doc) -> list[Doc]:
    chosen, used = [first], approx_tokens(_header(first) + first.text)
    others = [d for d in pool if d is not first]
    rng.shuffle(others)
    for d in others:
        cost = approx_tokens(_header(d) + d.text)
        if used + cost <= target:
            chosen.append(d)
            used += cost
    rng.shuffle(chosen)
    return chosen


def _message(chosen: list[Doc], question: str) -> list[dict]:
    body = "\n".join(_header(d) + d.text.rstrip("\n") + "\n" for d in chosen)
    return [{"role": "user", "content": f"{body}\n{question}"}]


def _sentences(p: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(p.split())) if 60 <= len(s) <= 240]


def make_case(which: str, kind: str, docs: str, target: int, index: int, seed: int = 0) -> GateCase | None:
    rng = random.Random(f"flat-gate:{seed}:{which}:{kind}:{docs}:{target}:{index}")
    pool = [d for d in documents(which) if d.kind == docs and approx_tokens(d.text) <= target * 0.6]
    if not pool:
        return None
    for _ in range(50):
        first = rng.choice(pool)
        chosen = _fill(rng, pool, int(target * 0.97), first)
        if approx_tokens("".join(d.text for d in chosen)) < target * 0.6:
            continue
        if kind == "pointed":
            got = _pointed(rng, first)
            if got is None:
                continue
            question, gold = got
        else:
            question, gold = _aggregation(chosen, docs), ""
            if not question:
                continue
        cid = f"{kind}-{docs}-{target // 1024}k-{index}-{which}"
        return GateCase(cid, kind, docs, target, _message(chosen, question), 0, gold)
    return None


def _pointed(rng: random.Random, d: Doc) -> tuple[str, str] | None:
    if d.kind == "code":
        cands = list(_candidates(d.name, d.text))
        if not cands:
            return None
        name, qual, start, d0, d1, end, docstring, sentence, phrase = rng.choice(cands)
        gold = "\n".join(d.text.split("\n")[start - 1:end])
        form = rng.randrange(3)
        if form == 0:
            return f"Which function {phrase.rstrip('.')}? Explain how it does it.", gold
        if form == 1:
            return f"Which function {phrase.rstrip('.')}? List all the steps it takes.", gold  # "all": gated
        return f"What does {name} do, and what does it return?", gold
    paras = [p for p in _blocks(d) if _sentences(p)]
    if not paras:
        return None
    p = rng.choice(paras)
    s = rng.choice(_sentences(p))
    words = [w for w in re.findall(r"[A-Za-z][a-z]+", s) if w.lower() not in _STOP]
    if len(words) < 4:
        return None
    rng.shuffle(words)
    if rng.randrange(3) == 0:  # "all": the gate applies
        return f"Quote all that the docs say about this: {' '.join(words[:8]).lower()}.", p
    return f"Where do the docs explain this, and what do they say: {' '.join(words[:8]).lower()}?", p


def _aggregation(chosen: list[Doc], docs: str) -> str | None:
    blocks = [b for d in chosen for b in _blocks(d)]
    if len(blocks) < 10:
        return None
    if docs == "code":
        for x in ("self", "return", "None", "raise", "len", "isinstance", "if"):
            if sum(bool(re.search(rf"\b{x}\b", b)) for b in blocks) >= AGG_SHARE * len(blocks):
                return f"List every function or method in these files that uses `{x}`, with its file and line."
        return None
    counts: dict[str, set[int]] = {}
    for k, b in enumerate(blocks):
        for w in set(re.findall(r"[a-z]{4,}", b.lower())) - _STOP:
            counts.setdefault(w, set()).add(k)
    words: list[str] = []
    covered: set[int] = set()
    for w, ks in sorted(counts.items(), key=lambda x: (-len(x[1]), x[0]))[:4]:  # the commonest words, at most 4
        words.append(w)
        covered |= ks
        if len(covered) >= AGG_SHARE * len(blocks):
            listed = ", ".join(f'"{x}"' for x in words[:-1]) + (" or " if len(words) > 1 else "") + f'"{words[-1]}"'
            return f"List every paragraph that mentions {listed}, each with its section."
    return None
