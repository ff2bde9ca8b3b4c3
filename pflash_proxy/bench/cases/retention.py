"""Did the gold evidence reach the upstream whole? Plus the two baselines PFlash is compared with.

Retention algorithm:
1. The prompt the upstream received (an OpenAI messages list, or one raw string) becomes one text per message:
   its content (or text parts) and its tool calls' names and arguments, as `messages_text` renders them.
2. Line endings are normalised (`\\r\\n` and `\\r` become `\\n`) on both the gold and the received texts; nothing
   else is touched: no whitespace folding, no marker stripping.
3. A gold item is whole when it occurs as one exact substring of one received text. A gold split by a
   `[… lines A–B omitted …]` marker, cut in half, or spread across two messages is not whole.
4. Kept fraction = tokens of the received prompt / tokens of the case's prompt for that turn, with the same
   estimator (default UTF-8 bytes / 4).

Baselines (pure functions over one message text and a token budget; line numbers in markers are 1-based):
- `head_tail_truncate`: keep whole lines from the head and from the tail, half the budget each (the tail takes
  what the head leaves), and replace the middle with one marker line.
- `random_units`: split the text into units (a run of non-blank lines plus the blank lines after it), visit the
  units in a seeded random order and keep each one that still fits, counting one marker line per omitted run;
  kept units stay in their original order, every omitted run becomes one marker line.
Both return the text unchanged when it already fits the budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

from pflash_proxy.bench.cases.base import Case, CountTokens, default_count_tokens, messages_text
from pflash_proxy.jsontypes import ChatMessage

Received = Sequence[ChatMessage] | str


def marker_line(n: int, first: int, last: int) -> str:
    """The line that stands for the `n` omitted lines `first`..`last` (1-based, inclusive) of a message, as the
    proxy writes it (``compress.rewrite.marker_line``)."""
    return f"[… line {first} omitted …]" if n == 1 else f"[… lines {first}–{last} omitted …]"


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def received_texts(received: Received) -> list[str]:
    if isinstance(received, str):
        return [normalize_newlines(received)]
    return [normalize_newlines(messages_text([m])) for m in received]


def gold_whole(gold: Sequence[str], received: Received) -> list[bool]:
    """For each gold string, whether it occurs whole (one exact substring of one received message)."""
    texts = received_texts(received)
    return [any(normalize_newlines(g) in t for t in texts) for g in gold]


@dataclass(frozen=True)
class Retention:
    case_id: str
    gold_whole: int
    gold_total: int
    all_gold: bool
    kept_fraction: float
    turn: int = 0
    missing: tuple[int, ...] = ()  # indexes of gold items that did not arrive whole


def check_retention(case: Case, received: Received, turn: int = 0,
                    count_tokens: CountTokens | None = None) -> Retention:
    """Retention of `case`'s gold for `turn` (0 = first request, k = follow-up k) in what the upstream received."""
    count = count_tokens or default_count_tokens
    gold = case.turn_gold(turn)
    whole = gold_whole(gold, received)
    original = count(messages_text(case.turn_messages(turn)))
    kept = count(received if isinstance(received, str) else messages_text(received))
    return Retention(case_id=case.case_id, gold_whole=sum(whole), gold_total=len(gold), all_gold=all(whole),
                     kept_fraction=kept / original if original else 1.0, turn=turn,
                     missing=tuple(i for i, ok in enumerate(whole) if not ok))


# ----------------------------------------------------------------------------------------------- baselines


def _line_costs(lines: Sequence[str], count: CountTokens) -> list[int]:
    return [count(line + "\n") for line in lines]


def head_tail_truncate(text: str, budget_tokens: int, count_tokens: CountTokens | None = None) -> str:
    """Whole head and tail lines within `budget_tokens`, the middle replaced by one marker line."""
    count = count_tokens or default_count_tokens
    if count(text) <= budget_tokens:
        return text
    lines = text.split("\n")
    n = len(lines)
    costs = _line_costs(lines, count)
    avail = budget_tokens - count(marker_line(n, n, n) + "\n")
    head, used = 0, 0
    while head < n and used + costs[head] <= avail / 2:
        used += costs[head]
        head += 1
    tail = n
    while tail > head + 1 and used + costs[tail - 1] <= avail:
        used += costs[tail - 1]
        tail -= 1
    if tail <= head:  # everything fits after all (estimator rounding)
        return text
    return "\n".join(lines[:head] + [marker_line(tail - head, head + 1, tail)] + lines[tail:])


MAX_UNIT_TOKENS = 512  # the seed's max_segment: a longer paragraph (records, a log) is cut into its lines


def split_units(lines: Sequence[str], count_tokens: CountTokens | None = None,
                max_tokens: int = MAX_UNIT_TOKENS) -> list[tuple[int, int]]:
    """Units as (start, end) line indexes, end exclusive: a run of non-blank lines plus the blank lines after it
    (leading blank lines form the first unit).  A run over ``max_tokens`` becomes one unit per line, as PFlash's
    segmenter cuts records and logs, so a baseline can keep part of a one-paragraph export."""
    count = count_tokens or default_count_tokens
    paragraphs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(lines)):
        if lines[i].strip() and not lines[i - 1].strip():
            paragraphs.append((start, i))
            start = i
    if lines:
        paragraphs.append((start, len(lines)))
    units: list[tuple[int, int]] = []
    for s, e in paragraphs:
        if e - s > 1 and count("\n".join(lines[s:e])) > max_tokens:
            body_end = e
            while body_end > s + 1 and not lines[body_end - 1].strip():
                body_end -= 1  # trailing blank lines stay with the paragraph's last line
            units += [(i, i + 1) for i in range(s, body_end - 1)] + [(body_end - 1, e)]
        else:
            units.append((s, e))
    return units


def random_units(text: str, budget_tokens: int, seed: int, count_tokens: CountTokens | None = None) -> str:
    """Random whole units in original order within `budget_tokens`, each omitted run replaced by a marker line."""
    count = count_tokens or default_count_tokens
    if count(text) <= budget_tokens:
        return text
    lines = text.split("\n")
    units = split_units(lines, count)
    n = len(units)
    costs = [count("\n".join(lines[s:e]) + "\n") for s, e in units]
    marker_cost = count(marker_line(len(lines), len(lines), len(lines)) + "\n")
    kept = [False] * n
    used = marker_cost  # one omitted run covering everything
    for i in random.Random(seed).sample(range(n), n):
        left = i > 0 and not kept[i - 1]
        right = i < n - 1 and not kept[i + 1]
        new = used + costs[i] + (int(left) + int(right) - 1) * marker_cost
        if new <= budget_tokens:
            kept[i] = True
            used = new
    out: list[str] = []
    i = 0
    while i < n:
        if kept[i]:
            s, e = units[i]
            out.extend(lines[s:e])
            i += 1
            continue
        j = i
        while j < n and not kept[j]:
            j += 1
        first, last = units[i][0] + 1, units[j - 1][1]
        out.append(marker_line(last - first + 1, first, last))
        i = j
    return "\n".join(out)


def shorten_longest(messages: Sequence[ChatMessage], shorten: Callable[[str], str]) -> list[ChatMessage]:
    """A copy of `messages` with the longest string content (the last one on a tie) passed through `shorten`:
    how a baseline is applied to a case at the same budget as PFlash, which also shortens one long message."""
    out = [ChatMessage(**m) for m in messages]
    best, longest = -1, ""
    for i, m in enumerate(out):
        if isinstance(content := m.get("content"), str) and (best < 0 or len(content) >= len(longest)):
            best, longest = i, content
    if best >= 0:
        out[best]["content"] = shorten(longest)
    return out
