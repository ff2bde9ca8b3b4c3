"""Recall: bring omitted lines of earlier messages back when a new question needs them.

Algorithm (``RecallGate.decide``):
0. The question less what the client repeats from the earlier messages (``asked_anew``): a line an earlier
   message kept verbatim (an instruction template sent with each question) and that line's words elsewhere.
1. For every stored earlier message, score ALL its units (kept and omitted) against
   the new question; validate the scores.  The serving scorer reads the stored reps
   when it made them (same ``Scorer.name``, payload of the current ``REPS_VERSION``);
   reps of another scorer or layout (a session written before a ``--scorer`` change
   or an upgrade) are made again by the serving scorer from the message's stored text
   (``RecallSource.scored_text``; kept in a small cache, so a conversation pays it
   once).  A source stored before its text was kept is scored by the scorer that made
   it when that one is model-free (lexical), else it is left out of recall (logged).
2. ``share = sum(scores of omitted units) / sum(all scores)`` over all stored
   messages together (0 when the total is 0).
3. Below ``theta`` (``PFLASH_CHAT_RECALL``, 0.075) nothing is recalled.
3b. The second hop (``RecallGate.widened``): the names (capitalised words not opening a sentence, years) of the
   ``FEEDBACK_FROM`` best-scored units, kept or omitted, score the units again, and the ``FEEDBACK_ADDS`` other
   units they score highest are raised to at most ``FEEDBACK_WEIGHT`` times the question's top score: the
   paragraph a first paragraph names ("compared to Alice's Adventures in Wonderland") is found though it shares
   no word with the question. The gate (steps 2-3) reads the question alone.
4. Otherwise rank the omitted units with a positive score by density (score per
   token; ties by message order, then unit index), the one with the highest score first whatever its size (as
   the compressor's first choice: a long unit holding the best match is not crowded out by many small ones that
   each match a word), and take each that still fits in
   ``recall_budget`` tokens, a unit next to none already taken counting its excerpt's
   header line too (``HEADER_TOKENS``: many scattered small units, such as the items
   of a one-line JSON answer, would otherwise pass the budget by their headers).
5. Adjacent recalled units of the same message merge into one excerpt; excerpts are
   ordered by message, then line.  ``format_recall_block`` renders each as
   ``[pflash recall: from earlier message N, lines A–B]`` followed by its lines, to be
   prepended to the new user turn.  In a message whose long lines were cut (``pieces``: the units are runs of
   pieces, ``longlines``) an excerpt may be part of a line, and says which in the reader's terms:
   ``[pflash recall: from earlier message N, line 12, 6 sentences]`` (``longlines.describe``), or
   ``lines A–B, in part`` when it starts or ends inside a line.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .gutter import bare_text, find_gutter
from .kinds import ContentKind
from .longlines import Pieces, describe
import numpy as np

from .scores import REPS_VERSION, STOPWORDS, LexicalScorer, Scorer, UnitReps, terms, validate_scores
from .text import TokenizedText
from .units import Unit

log = logging.getLogger("pflash_proxy.compress")

__all__ = ["Excerpt", "RecallDecision", "RecallGate", "RecallSource", "format_recall_block"]


@dataclass(frozen=True, kw_only=True)
class RecallSource:
    """What a compressed message leaves for recall: plain data, stored with its session.

    ``kept_texts`` with ``omitted_texts`` hold every unit's lines (the message as sent), ``line_tokens`` its
    per-line token counts and ``unit_kinds`` each unit's ``ContentKind``: enough for any scorer to make its own
    reps again (``scored_text``). Sources stored before those fields have them empty."""

    label: str
    reps: UnitReps
    unit_lines: tuple[tuple[int, int], ...]  # 0-based [start, end) per unit
    unit_tokens: tuple[int, ...]
    omitted_texts: Mapping[int, str] = field(default_factory=dict)  # unit index -> its lines
    kept_texts: Mapping[int, str] = field(default_factory=dict)  # unit index -> its lines
    line_tokens: tuple[int, ...] = ()
    unit_kinds: tuple[str, ...] = ()
    pieces: tuple[object, ...] = ()  # ``Pieces.to_plain()`` when long lines were cut: units, line_tokens by piece

    def piece_map(self) -> Pieces | None:
        return Pieces.from_plain(self.pieces) if self.pieces else None

    @property
    def omitted(self) -> tuple[int, ...]:
        return tuple(sorted(self.omitted_texts))

    def scored_text(self) -> tuple[TokenizedText, list[Unit]] | None:
        """The message and units as the scorer saw them (behind a line-number gutter, as the pipeline's step 0),
        or None when this source does not hold all its text."""
        n = len(self.unit_lines)
        texts = [self.kept_texts.get(i, self.omitted_texts.get(i)) for i in range(n)]
        if not n or any(t is None for t in texts) or len(self.unit_kinds) != n:
            return None
        text = "".join(t for t in texts if t is not None)
        pieces = self.piece_map()
        if pieces is None:
            tt = TokenizedText.from_text(text, list(self.line_tokens))
            gutter = find_gutter(tt.lines)
            work = tt if gutter is None else bare_text(tt, gutter)
        else:  # the whole lines, behind their gutter, cut again into the same pieces (with newlines, as scored)
            first = pieces.first()
            per_line = [sum(self.line_tokens[first[i]:first[i + 1]]) for i in range(pieces.n_lines)]
            tt = TokenizedText.from_text(text, per_line)
            gutter = find_gutter(tt.lines)
            work = pieces.apply(tt if gutter is None else bare_text(tt, gutter), newlines=True)
        units = [Unit(i, a, b, t, ContentKind(k)) for i, ((a, b), t, k) in
                 enumerate(zip(self.unit_lines, self.unit_tokens, self.unit_kinds))]
        return work, units


@dataclass(frozen=True, kw_only=True)
class Excerpt:
    label: str
    start_line: int  # 0-based inclusive
    end_line: int  # 0-based exclusive
    text: str
    tokens: int
    unit_indices: tuple[int, ...]
    part: str = ""  # a part of a line: what it is (``longlines.describe``), or "in part" across lines

    @property
    def header(self) -> str:
        a, b = self.start_line + 1, self.end_line
        where = f"line {a}" if a == b else f"lines {a}–{b}"
        return f"[pflash recall: from earlier message {self.label}, {where}{', ' + self.part if self.part else ''}]"


@dataclass(frozen=True)
class RecallDecision:
    recalled: list[Excerpt]
    share: float

    @property
    def recall(self) -> bool:
        return bool(self.recalled)


HEADER_TOKENS = 24  # step 4: an excerpt's header line, "[pflash recall: from earlier message 1, line 1, items 69–101
# of 500]" (gemma and Qwen give every digit a token)
RESCORED_KEEP = 8  # step 1: reps made again from stored text, kept per (scorer, message text, units)


FEEDBACK_FROM = 2  # step 3b: the top-scored units whose names widen the question
FEEDBACK_ADDS = 2  # step 3b: the units those names score highest, raised (the second hop)
FEEDBACK_WEIGHT = 0.8  # step 3b: the best of them is raised to this times the question's top score (below it)
_NAME = re.compile(r"(?<![\w'’])[A-Z][\w'’-]*[A-Za-z0-9]|\b[0-9]{3,4}\b")
_SENTENCE_START = re.compile(r"(?:^|[.!?:]\s+|\n)$")


REPEAT_CHARS = 24  # step 0: a shorter line ("Answer:", a heading) may repeat by chance


def asked_anew(question: str, sources: Sequence[RecallSource]) -> str:
    """Step 0: the question less what the client repeats from the earlier messages: its lines an earlier message's
    kept text holds verbatim (an instruction template sent with every question: "Answer the question based on the
    given documents. ..."), and those lines' words wherever else they occur ("Question:"). The template's words
    match the template, which the earlier message kept, and would hide what the new question asks. The question
    unchanged when nothing repeats, or when nothing else would be left."""
    lines = question.splitlines(keepends=True)
    wanted = {ln.strip() for ln in lines if len(ln.strip()) >= REPEAT_CHARS}
    if not wanted:
        return question
    held = {ln.strip() for src in sources for t in src.kept_texts.values() for ln in t.splitlines()
            if ln.strip() in wanted}
    if not held:
        return question
    template = {w.lower() for ln in held for w in re.findall(r"\w+", ln)}
    rest = "".join(ln for ln in lines if ln.strip() not in held)
    new = re.sub(r"\w+", lambda m: " " if m.group().lower() in template else m.group(), rest)
    return new if terms(new) else question


def feedback_terms(text: str, question: str) -> str:
    """Step 3b: the names ``text`` spells (capitalised words not opening a sentence, and years), less the
    question's words and stopwords, as one query string (each once, in order)."""
    asked = {w.lower() for w in re.findall(r"\w+", question)}
    out: dict[str, None] = {}
    for m in _NAME.finditer(text):
        word = m.group(0)
        if _SENTENCE_START.search(text[max(0, m.start() - 3):m.start()]) or m.start() == 0:
            continue
        key = word.lower()
        if key in asked or key in STOPWORDS or key.split("'")[0] in asked:
            continue
        out.setdefault(word, None)
    return " ".join(out)


@dataclass(frozen=True)
class RecallGate:
    theta: float = 0.075
    recall_budget: int = 2048
    feedback: bool = True  # step 3b: widen the question with the names of its best units
    anew: bool = True  # step 0: the question less the lines (and their words) the client repeats
    first: bool = True  # step 4: the best-scored omitted unit first, whatever its size
    _rescored: OrderedDict[tuple[str, str, tuple[tuple[int, int], ...]], UnitReps] = field(
        default_factory=OrderedDict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def reader(self, src: RecallSource, scorer: Scorer) -> tuple[Scorer, UnitReps] | None:
        """Step 1: the scorer and reps that score ``src`` for a question, or None when nothing can."""
        reps = src.reps
        if reps.scorer == scorer.name and reps.version == REPS_VERSION:
            return scorer, reps
        made = self.scored_text(src)
        if made is not None:
            tt, units = made
            key = (scorer.name, hashlib.sha1(tt.text.encode("utf-8", "surrogatepass")).hexdigest(), src.unit_lines)
            with self._lock:
                got = self._rescored.get(key)
                if got is not None:
                    self._rescored.move_to_end(key)
                    return scorer, got
            log.info("recall: message %s was scored by %s (reps version %d); scoring it again with %s",
                     src.label, reps.scorer, reps.version, scorer.name)
            got = scorer.represent(tt, units)
            with self._lock:
                self._rescored[key] = got
                while len(self._rescored) > RESCORED_KEEP:
                    self._rescored.popitem(last=False)
            return scorer, got
        lexical = LexicalScorer()
        if reps.scorer == lexical.name and reps.version == REPS_VERSION:  # model-free: rebuilt here
            return lexical, reps
        log.warning("recall: message %s was scored by %s (reps version %d) and its text is not stored; %s cannot "
                    "score it, it is left out of recall", src.label, reps.scorer, reps.version, scorer.name)
        return None

    @staticmethod
    def scored_text(src: RecallSource) -> tuple[TokenizedText, list[Unit]] | None:
        try:
            return src.scored_text()
        except ValueError as exc:  # stored text that does not rebuild the message (a damaged record)
            log.warning("recall: the stored text of message %s is unusable (%s)", src.label, exc)
            return None

    def widened(self, scored: list[tuple[int, RecallSource, Scorer, UnitReps, np.ndarray]], question: str
                ) -> list[tuple[int, RecallSource, Scorer, UnitReps, np.ndarray]]:
        """Step 3b: the names the ``FEEDBACK_FROM`` top-scored units hold (kept or omitted; ``feedback_terms``)
        score the units again; the ``FEEDBACK_ADDS`` other units they score highest are raised to
        ``FEEDBACK_WEIGHT`` times the question's top score, in proportion to that score (never lowered, and never
        above the question's own best match, as ``links.propagate`` raises a reached unit). Unchanged when the top
        units name nothing new."""
        top = heapq.nlargest(FEEDBACK_FROM, ((float(s[u]), k, u) for k, (*_, s) in enumerate(scored)
                                             for u in np.flatnonzero(s > 0).tolist()))
        texts = [t for _, k, u in top
                 if (t := scored[k][1].kept_texts.get(u, scored[k][1].omitted_texts.get(u))) is not None]
        names = feedback_terms(" ".join(texts), question)
        if not names:
            return scored
        extra = [validate_scores(sc.score(reps, names), len(s)) for _, _, sc, reps, s in scored]
        for _, k, u in top:
            extra[k][u] = 0.0
        best = heapq.nlargest(FEEDBACK_ADDS, ((float(e[u]), k, u) for k, e in enumerate(extra)
                                              for u in np.flatnonzero(e > 0).tolist()))
        if not best:
            return scored
        q_top, f_top = top[0][0], best[0][0]
        out = [(m, src, sc, reps, s.copy()) for m, src, sc, reps, s in scored]
        for f, k, u in best:
            out[k][4][u] = max(out[k][4][u], FEEDBACK_WEIGHT * q_top * f / f_top)
        return out

    def chosen(self, scored: list[tuple[int, RecallSource, Scorer, UnitReps, np.ndarray]]) -> dict[int, set[int]]:
        """Step 4: the omitted units to bring back, per message: the best-scored first (ties: the densest), then by
        density, each while it fits the budget (with its excerpt's header when it has no chosen neighbour)."""
        cands: list[tuple[float, int, int, float, int]] = []  # (-density, msg, unit, score, tokens)
        for m, src, _, _, s in scored:
            for u in src.omitted:
                sc = float(s[u])
                if sc > 0:
                    tok = src.unit_tokens[u]
                    cands.append((-sc / max(tok, 1), m, u, sc, tok))
        cands.sort()
        if self.first and cands:
            top = max(range(len(cands)), key=lambda i: (cands[i][3], -i))
            cands.insert(0, cands.pop(top))
        chosen: dict[int, set[int]] = {}
        used = 0
        for _, m, u, _, tok in cands:
            have = chosen.setdefault(m, set())
            cost = tok + (0 if u - 1 in have or u + 1 in have else HEADER_TOKENS)
            if used + cost <= self.recall_budget:
                have.add(u)
                used += cost
        return chosen

    def decide(self, sources: Sequence[RecallSource], question: str, scorer: Scorer) -> RecallDecision:
        if self.anew:  # step 0
            question = asked_anew(question, sources)
        total = omitted_mass = 0.0
        scored: list[tuple[int, RecallSource, Scorer, UnitReps, np.ndarray]] = []
        for m, src in enumerate(sources):  # step 1
            found = self.reader(src, scorer)
            if found is None:
                continue
            s = validate_scores(found[0].score(found[1], question), len(src.unit_tokens))
            scored.append((m, src, found[0], found[1], s))
            total += float(s.sum())
            omitted_mass += float(s[list(src.omitted)].sum()) if src.omitted else 0.0
        share = omitted_mass / total if total > 0 else 0.0  # step 2
        if share < self.theta:
            return RecallDecision([], share)
        if self.feedback:  # step 3b
            scored = self.widened(scored, question)
        chosen = self.chosen(scored)
        excerpts: list[Excerpt] = []
        for m in sorted(k for k, units in chosen.items() if units):  # step 5
            src = sources[m]
            pieces = src.piece_map()
            first = pieces.first() if pieces is not None else []
            group: list[int] = []
            ends: list[int | None] = [*sorted(chosen[m]), None]
            for unit in ends:
                if group and (unit is None or unit != group[-1] + 1):
                    text = "".join(src.omitted_texts[g] for g in group)
                    a, b = src.unit_lines[group[0]][0], src.unit_lines[group[-1]][1]
                    part = ""
                    if pieces is not None:
                        la, lb = pieces.line[a], pieces.line[b - 1]
                        whole = first[la] == a and first[lb + 1] == b
                        part = "" if whole else describe(pieces.label[a:b], pieces.length[a:b]) if la == lb \
                            else "in part"
                        a, b = la, lb + 1
                    excerpts.append(Excerpt(label=src.label, start_line=a, end_line=b, text=text,
                                            tokens=sum(src.unit_tokens[g] for g in group),
                                            unit_indices=tuple(group), part=part))
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

