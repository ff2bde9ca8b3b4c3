"""Seeded, offline generator of long-prompt benchmark cases whose gold evidence is known.

Each `Case` is an OpenAI-style chat (`messages`), the question it asks, the gold evidence strings that must reach
the upstream whole for the question to be answerable, and the expected answer. Nothing is downloaded.

Algorithm:
1. Real text. Prose comes from the Python documentation that ships with the interpreter: the reference-manual
   topics behind `help()` (`pydoc_data.topics`) and the docstrings of the top-level standard-library modules,
   read as text and cleaned with `inspect.cleandoc`. Only prose paragraphs are kept (no indented code, no
   doctests); targets above ~70K tokens add the docstrings of the stdlib packages (email, asyncio, ...), and
   only past that pool (~165K tokens) do paragraphs repeat. Code comes from the top-level modules' source files.
   Both are read once per process and depend only on the Python version, so one seed gives the same cases on
   every machine with that Python.
2. One `random.Random` per case, seeded by (seed, family, target length, index): a case does not depend on
   which other cases are generated with it.
3. The family plants its evidence (needles, assignment hops, facts, a log block, records, a function) and writes
   the question about it. The gold is exactly the planted text, as it appears in the prompt.
4. Fill. The case is first rendered with no filler to measure its fixed cost; shuffled filler units (prose
   paragraphs, log lines, records, whole modules) are then added while the whole case stays under the target.
   Filler that contains any evidence string (keys, names, cities, values) is skipped, so the haystack cannot
   answer by accident or contradict the gold. A custom `count_tokens` is memoised for the run.
5. Evidence goes in at seeded depths, as its own paragraph or line, so gold units are whole units.
6. Lengths count every message's text (`messages_text`) with `count_tokens` (default: UTF-8 bytes / 4).

The per-family builders live in `pflash_proxy.bench.cases._families`; this module holds the data types, the real-text
sources, the filling helpers and `generate`.
"""

from __future__ import annotations

import inspect
import os
import random
import re
import sysconfig
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Sequence

from pflash_proxy.jsontypes import ChatMessage, JSONObject

CountTokens = Callable[[str], int]

RULER_FAMILIES = ("ruler_single", "ruler_multikey", "ruler_multivalue", "ruler_multiquery")
FAMILIES = RULER_FAMILIES + ("vartrack", "nolima", "code", "agent", "multiturn", "aggregation")
DEFAULT_LENGTHS = (16_384, 32_768)


def default_count_tokens(text: str) -> int:
    """Token estimate used everywhere unless a real tokenizer is passed: UTF-8 bytes / 4, rounded up."""
    return (len(text.encode("utf-8")) + 3) // 4


@dataclass
class FollowUp:
    """A later user turn of a multi-turn case, with the evidence that turn needs."""

    question: str
    gold: list[str]
    answer: str | list[str]


@dataclass
class Case:
    case_id: str
    family: str
    messages: list[ChatMessage]
    question: str
    gold: list[str]
    answer: str | list[str]
    negative_control: bool
    target_tokens: int
    followups: list[FollowUp] = field(default_factory=list)
    meta: JSONObject = field(default_factory=dict)

    def turn_messages(self, turn: int, replies: Sequence[str] | None = None) -> list[ChatMessage]:
        """Messages sent at `turn` (0 = the first request). Earlier assistant turns use `replies[i]` when given,
        else a placeholder answer; turn k>0 ends with follow-up k-1's question."""
        if turn < 0 or turn > len(self.followups):
            raise IndexError(f"case {self.case_id} has turns 0..{len(self.followups)}")
        msgs = [ChatMessage(**m) for m in self.messages]
        for k in range(turn):
            reply = replies[k] if replies is not None and k < len(replies) else f"(answer to question {k + 1})"
            msgs.append({"role": "assistant", "content": reply})
            msgs.append({"role": "user", "content": self.followups[k].question})
        return msgs

    def turn_gold(self, turn: int) -> list[str]:
        return list(self.gold) if turn == 0 else list(self.followups[turn - 1].gold)


def messages_text(messages: Sequence[ChatMessage] | str) -> str:
    """All text a chat carries (contents, text parts, tool-call names and arguments), one block per item."""
    if isinstance(messages, str):
        return messages
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        for call in m.get("tool_calls") or ():
            fn = call.get("function", {})
            parts.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
    return "\n\n".join(parts)


def case_tokens(case: Case, count_tokens: CountTokens | None = None) -> int:
    return (count_tokens or default_count_tokens)(messages_text(case.messages))


# ----------------------------------------------------------------------------------------------- real text


def _stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def _is_prose(p: str) -> bool:
    if len(p) < 120:
        return False
    for line in p.split("\n"):
        if line.startswith((" ", "\t")) or line.lstrip().startswith((">>>", "...", "+", "*", "-", "=", "|")):
            return False
    return sum(c.isalpha() or c == " " for c in p) / len(p) >= 0.85


@lru_cache(maxsize=1)
def _stdlib_modules() -> tuple[tuple[str, str], ...]:
    """(path shown to the model, source) of top-level stdlib modules, sorted by name."""
    root = _stdlib_dir()
    out = []
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py") or name.startswith("_"):
            continue
        try:
            with open(os.path.join(root, name), encoding="utf-8") as fh:
                out.append((f"Lib/{name}", fh.read()))
        except (OSError, UnicodeDecodeError):
            continue
    return tuple(out)


_DOCSTRING_RX = re.compile(r'^[ \t]*[rRuU]?"""(.*?)"""', re.S | re.M)


_SKIP_PACKAGES = {"test", "tests", "site-packages", "__pycache__", "idlelib", "tkinter", "turtledemo", "lib2to3"}


@lru_cache(maxsize=1)
def _stdlib_package_sources() -> tuple[str, ...]:
    """Sources of the stdlib packages (email, asyncio, ...), read only for very long targets."""
    root = _stdlib_dir()
    out = []
    for name in sorted(os.listdir(root)):
        top = os.path.join(root, name)
        if name in _SKIP_PACKAGES or name.startswith("config-") or not os.path.isdir(top):
            continue
        for here, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_PACKAGES)
            for f in sorted(files):
                if f.endswith(".py"):
                    try:
                        with open(os.path.join(here, f), encoding="utf-8") as fh:
                            out.append(fh.read())
                    except (OSError, UnicodeDecodeError):
                        continue
    return tuple(out)


def _paragraphs(texts: Iterable[str], seen: set[str]) -> list[str]:
    out = []
    for text in texts:
        for p in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
            p = p.strip("\n").rstrip()
            if _is_prose(p) and p not in seen:
                seen.add(p)
                out.append(p)
    return out


@lru_cache(maxsize=2)
def prose_paragraphs(extended: bool = False) -> tuple[str, ...]:
    """Real documentation prose installed with Python, deduplicated, in a fixed order (~100K tokens; `extended`
    adds the stdlib packages' docstrings, ~165K tokens in all)."""
    texts: list[str] = []
    try:
        from pydoc_data.topics import topics

        texts.extend(topics[k] for k in sorted(topics))
    except ImportError:  # some distributions strip pydoc_data; docstrings still suffice
        pass
    texts.extend(inspect.cleandoc(m.group(1)) for _, src in _stdlib_modules() for m in _DOCSTRING_RX.finditer(src))
    seen: set[str] = set()
    out = _paragraphs(texts, seen)
    if extended:
        out += _paragraphs((inspect.cleandoc(m.group(1)) for src in _stdlib_package_sources()
                            for m in _DOCSTRING_RX.finditer(src)), seen)
    return tuple(out)


@lru_cache(maxsize=1)
def prose_sentences() -> tuple[str, ...]:
    out = []
    for p in prose_paragraphs():
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(p.split())):
            if 40 <= len(s) <= 220 and s[-1] in ".!?":
                out.append(s)
    return tuple(out)


# ----------------------------------------------------------------------------------------------- filling


class _Ctx:
    """Per-case state: the seeded rng and the token counter."""

    def __init__(self, seed: int, family: str, target: int, index: int, count: CountTokens,
                 nominal: int | None = None):
        self.index = index
        self.rng = random.Random(f"pflash-bench:{seed}:{family}:{target}:{index}")
        self.count = count
        self.target = target
        self.nominal = nominal or target  # the length the case is labelled with (choices like a variant use it)

    def fill(self, pool: Sequence[str], budget: int, forbid: Iterable[str] = (), sep: str = "\n\n",
             cycle: bool = True) -> list[str]:
        """Shuffled items of `pool` whose total (with separators) stays within `budget` tokens. Items that contain
        any forbidden string (case-insensitive) are skipped. Only when every eligible item is already in, and
        `cycle` allows it, does a new shuffled round repeat them."""
        bad = [w.lower() for w in forbid if w]
        eligible = [p for p in pool if not (bad and any(w in p.lower() for w in bad))]
        costs = [self.count(p + sep) for p in eligible]
        out: list[str] = []
        used = 0
        for _round in range(16):
            order = list(range(len(eligible)))
            self.rng.shuffle(order)
            took_all = True
            for i in order:
                if used + costs[i] <= budget:
                    out.append(eligible[i])
                    used += costs[i]
                else:
                    took_all = False
                if budget - used < 4:
                    return out
            if not (cycle and took_all and eligible):
                break
        return out

    def prose(self) -> tuple[str, ...]:
        """The prose pool for this case: the base pool, or the extended one when the target would use most of it
        (so 128K haystacks do not repeat paragraphs)."""
        base = prose_paragraphs()
        if self.target <= 0.7 * sum(len(p) for p in base) / 4:
            return base
        return prose_paragraphs(extended=True)

    def depths(self, n: int, lo: float = 0.05, hi: float = 0.95) -> list[float]:
        return sorted(self.rng.uniform(lo, hi) for _ in range(n))

    def fit(self, render: Callable[[list[str]], list[ChatMessage]], pool: Sequence[str],
            forbid: Iterable[str] = (), sep: str = "\n\n", cycle: bool = True) -> list[str]:
        """Filler for a case whose messages are `render(filler)`, sized so the whole case meets the target."""
        fixed = self.count(messages_text(render([])))
        return self.fill(pool, max(0, self.target - fixed), forbid, sep, cycle)


def place(filler: Sequence[str], items: Sequence[str], depths: Sequence[float]) -> list[str]:
    """`filler` with `items` inserted in order at fractional `depths` (sorted, in [0, 1])."""
    out = list(filler)
    for k, (d, item) in enumerate(zip(depths, items)):
        out.insert(min(len(out), round(d * len(filler)) + k), item)
    return out


# ----------------------------------------------------------------------------------------------- generate


def generate(families: Sequence[str] | None = None, lengths: Sequence[int] = DEFAULT_LENGTHS,
             per_family: int = 1, seed: int = 0, count_tokens: CountTokens | None = None) -> list[Case]:
    """Cases for every (family, length, index), in that order. `families` may name `ruler` for all four
    RULER variants. Deterministic in (families, lengths, per_family, seed, count_tokens)."""
    names = family_names(families)
    count = lru_cache(maxsize=None)(count_tokens) if count_tokens else default_count_tokens
    return [generate_case(name, int(target), i, seed, count) for name in names for target in lengths
            for i in range(per_family)]


def family_names(families: Sequence[str] | None = None) -> list[str]:
    """The families named (``ruler`` = the four RULER variants, None = all), deduplicated, validated."""
    names: list[str] = []
    for f in families or FAMILIES:
        for name in RULER_FAMILIES if f == "ruler" else (f,):
            if name not in FAMILIES:
                raise ValueError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
            if name not in names:
                names.append(name)
    return names


def generate_case(family: str, target: int, index: int = 0, seed: int = 0,
                  count_tokens: CountTokens | None = None, nominal: int | None = None) -> Case:
    """One case: the (family, target, index) item of `generate`.  `nominal` (default `target`) is the length
    it will be labelled with when `target` is a resizing step (`bench.sizing`)."""
    from pflash_proxy.bench.cases import _families as _fam  # builders import this module's helpers

    ctx = _Ctx(seed, family, int(target), index, count_tokens or default_count_tokens, nominal)
    case = _fam.BUILDERS[family](ctx)
    case.case_id = f"{family}-{int(target) // 1024}k-{index}-s{seed}"
    case.family = family
    case.target_tokens = int(target)
    return case


def gold_in_messages(case: Case, turn: int = 0) -> list[bool]:
    """Whether each gold string occurs verbatim in one message of the case as generated (sanity check)."""
    texts = [messages_text([m]) for m in case.turn_messages(turn)]
    return [any(g in t for t in texts) for g in case.turn_gold(turn)]
