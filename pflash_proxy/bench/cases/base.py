"""What the case generator (`generator`) and its family builders (`_families`, `_code`, `_logs`) share.

The data types (`Case`, `FollowUp`, `CountTokens`), the text a chat carries (`messages_text`, `case_tokens`,
`default_count_tokens`), the real-text sources (`prose_paragraphs`, `prose_sentences`, `stdlib_modules`: the
Python documentation and standard-library sources that ship with the interpreter) and the per-case filling state
(`Ctx`: the seeded rng, `fill`, `fit`, `depths`; `place`).  It imports nothing of the generator or the builders,
so all of them import it and none imports another back; how a case is built is told in `generator`.
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
def stdlib_modules() -> tuple[tuple[str, str], ...]:
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
    texts.extend(inspect.cleandoc(m.group(1)) for _, src in stdlib_modules() for m in _DOCSTRING_RX.finditer(src))
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


class Ctx:
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
