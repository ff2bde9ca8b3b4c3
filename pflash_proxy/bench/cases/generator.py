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

The per-family builders live in `pflash_proxy.bench.cases._families` (with `_code` and `_logs`); the data types,
the real-text sources and the filling helpers they share with this module in `pflash_proxy.bench.cases.base`; this
module holds the family names and `generate`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from pflash_proxy.bench.cases._families import BUILDERS
from pflash_proxy.bench.cases.base import Case, CountTokens, Ctx, default_count_tokens, messages_text

RULER_FAMILIES = ("ruler_single", "ruler_multikey", "ruler_multivalue", "ruler_multiquery")
FAMILIES = RULER_FAMILIES + ("vartrack", "nolima", "code", "agent", "multiturn", "aggregation")
DEFAULT_LENGTHS = (16_384, 32_768)


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
    ctx = Ctx(seed, family, int(target), index, count_tokens or default_count_tokens, nominal)
    case = BUILDERS[family](ctx)
    case.case_id = f"{family}-{int(target) // 1024}k-{index}-s{seed}"
    case.family = family
    case.target_tokens = int(target)
    return case


def gold_in_messages(case: Case, turn: int = 0) -> list[bool]:
    """Whether each gold string occurs verbatim in one message of the case as generated (sanity check)."""
    texts = [messages_text([m]) for m in case.turn_messages(turn)]
    return [any(g in t for t in texts) for g in case.turn_gold(turn)]
