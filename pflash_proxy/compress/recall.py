"""Recall: bring omitted lines of earlier messages back when a new question needs them.

Algorithm (``RecallGate.decide``):
1. For every stored earlier message, score ALL its units (kept and omitted) against
   the new question with the scorer that made its reps; validate the scores.
2. ``share = sum(scores of omitted units) / sum(all scores)`` over all stored
   messages together (0 when the total is 0).
3. Below ``theta`` (``PFLASH_CHAT_RECALL``, 0.075) nothing is recalled.
4. Otherwise rank the omitted units with a positive score by density (score per
   token; ties by message order, then unit index) and take each that still fits in
   ``recall_budget`` tokens.
5. Adjacent recalled units of the same message merge into one excerpt; excerpts are
   ordered by message, then line.  ``format_recall_block`` renders each as
   ``[pflash recall: from earlier message N, lines A–B]`` followed by its lines, to be
   prepended to the new user turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .scores import Scorer, UnitReps, validate_scores

__all__ = ["Excerpt", "RecallDecision", "RecallGate", "RecallSource", "format_recall_block"]


@dataclass(frozen=True)
class RecallSource:
    """What a compressed message leaves for recall (picklable)."""

    label: str
    reps: UnitReps
    unit_lines: tuple[tuple[int, int], ...]  # 0-based [start, end) per unit
    unit_tokens: tuple[int, ...]
    omitted_texts: Mapping[int, str] = field(default_factory=dict)  # unit index -> its lines

    @property
    def omitted(self) -> tuple[int, ...]:
        return tuple(sorted(self.omitted_texts))


@dataclass(frozen=True)
class Excerpt:
    label: str
    start_line: int  # 0-based inclusive
    end_line: int  # 0-based exclusive
    text: str
    tokens: int
    unit_indices: tuple[int, ...]

    @property
    def header(self) -> str:
        a, b = self.start_line + 1, self.end_line
        where = f"line {a}" if a == b else f"lines {a}–{b}"
        return f"[pflash recall: from earlier message {self.label}, {where}]"


@dataclass(frozen=True)
class RecallDecision:
    recalled: list[Excerpt]
    share: float

    @property
    def recall(self) -> bool:
        return bool(self.recalled)


@dataclass(frozen=True)
class RecallGate:
    theta: float = 0.075
    recall_budget: int = 2048

    def decide(self, sources: Sequence[RecallSource], question: str, scorer: Scorer) -> RecallDecision:
        cands: list[tuple[float, int, int, float, int]] = []  # (-density, msg, unit, score, tokens)
        total = omitted_mass = 0.0
        for m, src in enumerate(sources):  # step 1
            s = validate_scores(scorer.score(src.reps, question), src.reps.n_units)
            total += float(s.sum())
            for u in src.omitted:
                sc = float(s[u])
                omitted_mass += sc
                if sc > 0:
                    tok = src.unit_tokens[u]
                    cands.append((-sc / max(tok, 1), m, u, sc, tok))
        share = omitted_mass / total if total > 0 else 0.0  # step 2
        if share < self.theta or not cands:
            return RecallDecision([], share)
        cands.sort()
        chosen: dict[int, list[int]] = {}
        used = 0
        for _, m, u, _, tok in cands:  # step 4
            if used + tok <= self.recall_budget:
                chosen.setdefault(m, []).append(u)
                used += tok
        excerpts: list[Excerpt] = []
        for m in sorted(chosen):  # step 5
            src = sources[m]
            group: list[int] = []
            ends: list[int | None] = [*sorted(chosen[m]), None]
            for unit in ends:
                if group and (unit is None or unit != group[-1] + 1):
                    text = "".join(src.omitted_texts[g] for g in group)
                    excerpts.append(Excerpt(src.label, src.unit_lines[group[0]][0], src.unit_lines[group[-1]][1],
                                            text, sum(src.unit_tokens[g] for g in group), tuple(group)))
                    group = []
                if unit is not None:
                    group.append(unit)
        return RecallDecision(excerpts, share)


def format_recall_block(excerpts: Sequence[Excerpt]) -> str:
    """Excerpts as labelled blocks, ending with a blank line (empty string for none)."""
    if not excerpts:
        return ""
    out = []
    for e in excerpts:
        body = e.text if e.text.endswith("\n") else e.text + "\n"
        out.append(f"{e.header}\n{body}")
    return "\n".join(out) + "\n"

