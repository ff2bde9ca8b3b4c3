"""The compression pipeline for one new long message (``Compressor.compress``; each step timed into ``stage_ms``).

0. gutter: when every line carries a line number (``gutter.find_gutter``: ``cat -n``, ``grep -n``, an agent's
   file read), steps 1-3 read the text behind the numbers (``bare_text``, line for line); the units carry the
   numbered lines' tokens, and the rewrite and recall serve the numbered lines.
1. segment: a line over the segmenter's ``max_segment`` is cut into pieces first (``longlines.cut_long_lines``),
   which every later step sees as lines; the ``Segmenter`` cuts the message into whole-line units.
2. pin: the units holding the trailing lines within ``pinned_tail_tokens`` and the question found by its form
   (``RequestSpec.kept_lines``) are always kept; so are the definitions of a name the request spells out outside
   the paths it names (``named.named_definitions``).  A name defined several times names optional definitions.
3. score: ``represent`` and ``score`` against the request (``rank``: in code, without the paths and tool-call
   keys it names, unless that leaves nothing to match), ``validate_scores``; for a request that asks for every
   match, BM25 of its every-clause and of the names it spells too (``gate_scores``, ``name_scores``).
4. select: ``message_budget`` from the curve on the prompt's tokens (in code ranked by BM25, widened up to
   ``coderank.UNSURE_WIDEN`` when the ranking has no clear leader: ``coderank.widen``), widened when the pinned
   units leave the ranked ones less than ``MIDDLE_SHARE`` of it (``middle_budget``; ``full-budget`` when that is
   the whole message).  The pinned and named units, the optional definitions within ``NAMED_SHARE`` and the first choice
   (``first_choice``) are kept, then the rest by density (``BudgetSelector``); in code, whole definitions
   ranked by ``coderank`` (``code_atoms``, ``atom_first``).  The selection is rerun until the kept units plus
   the note and marker lines land on the budget, at most it (``_select_with_overhead``), and a cut
   definition's small missing parts are added (``close_blocks``).
5. gate: ``spread.flat_gate`` of the unpinned units' relevance over the units step 4 keeps (counted by units:
   in code by ``first_definitions``; by BM25's ranking for a request for every match), at the threshold the
   spread curve gives for the prompt's tokens: flat for zero relevance, a request for every match whose
   relevance is spread, or one about the whole message.  Flat -> ``full-flat`` on a cold request or one for
   every match or the whole; else compressed anyway (recall brings lines back).  A question whose matches all
   sit in the pinned tail is not flat (``held_in_pin``).
5b. every match: a request for every match keeps all its matches (``every_match``) when they fit the budget
   with the pinned units, else it is flat.
6. rewrite: note + kept lines + omission markers (in code naming the definitions they hide, within
   ``NAMES_SHARE`` of the budget), and a ``RecallSource`` of every unit's text for recall.
Any exception serves the original text (``full-error``, with the reason): ``compress`` never raises.  An outcome
carries its ``Analysis`` (steps 0-3): a caller re-running the budget (``budget_adjust``) passes it back.
"""

from __future__ import annotations

import time
from dataclasses import replace
from operator import attrgetter
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Literal

import numpy as np

from .budget import DEFAULT_CURVE, BudgetCurve, BudgetSelector, message_budget
from .gutter import bare_text, find_gutter
from .kinds import ContentKind
from .longlines import Pieces, cut_long_lines
from .coderank import SIZE_POWER, AtomIndex, atom_scores, atoms, select_atoms, widen
from .named import definition_atoms, definition_blocks, definitions, named_definitions, outline
from .recall import RecallSource
from .request import RequestSpec, tail_lines, without_paths
from .routed import is_code
from .rewrite import Rewriter, Source, marker_names, marker_tokens, marker_tokens_arrays, names_tokens, note_line
from .scores import LexicalScorer, Scorer, UnitReps, density, validate_scores
from .forms import request_names
from .spread import Spread, SpreadCurve, asks_for_every, every_clause, flat_gate
from .text import TokenizedText, approx_tokens
from .units import Segmenter, Unit, UnitSegmenter

__all__ = ["Analysis", "CompressionOutcome", "CompressionSettings", "Compressor", "Landing", "Mode", "first_choice",
           "first_definitions", "landed", "landing_key"]

_START, _END, _TOKENS = attrgetter("start_line"), attrgetter("end_line"), attrgetter("tokens")

Mode = Literal["compressed", "full-flat", "full-error", "full-budget"]


@dataclass(frozen=True, kw_only=True)
class CompressionSettings:
    threshold: int = 16384
    curve: BudgetCurve = field(default_factory=lambda: BudgetCurve.parse(DEFAULT_CURVE))
    query_pin: int = 512
    fallback_spread: SpreadCurve | str | float = 0.11  # the flat threshold (``spread.SpreadCurve``: by prompt tokens)
    theta: float = 0.075
    recall_budget: int = 2048
    min_segment: int = 32
    max_segment: int = 512
    min_message_budget: int = 256  # floor of a message's budget, in tokens

    def __post_init__(self) -> None:
        if isinstance(self.curve, str):
            object.__setattr__(self, "curve", BudgetCurve.parse(self.curve))
        if not isinstance(self.fallback_spread, SpreadCurve):
            object.__setattr__(self, "fallback_spread", SpreadCurve.parse(self.fallback_spread))
        for name in ("threshold", "query_pin", "recall_budget", "min_segment", "max_segment"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not 0 <= self.theta <= 1:
            raise ValueError("theta must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """Stages 1-3 for one message and request: what a budget re-run reuses (independent of the budget)."""
    units: list[Unit]
    pinned: set[int]
    reps: UnitReps
    scores: np.ndarray
    stage_ms: dict[str, float]  # what stages 1-3 cost, reported again by every outcome built on them
    gutter: str | None = None  # step 0: the form of the line-number gutter stages 1-3 looked behind
    named: frozenset[int] = frozenset()  # step 2: units of the definitions the request names (kept, not pinned)
    blocks: tuple[tuple[int, ...], ...] = ()  # step 4: definitions cut into several units (kept whole when small)
    named_optional: tuple[tuple[int, ...], ...] = ()  # step 2: a name's definitions kept while they fit (step 4)
    outline: tuple[tuple[int, str, str | None], ...] = ()  # step 6: the definitions a marker names (named.outline)
    gate_scores: np.ndarray | None = None  # step 5: BM25 of the request's every-clause (``gate_scores``), or None
    gate_ranking: np.ndarray | None = None  # step 5: BM25's ranking the gate's ``k`` is selected by, or None (own)
    pieces: Pieces | None = None  # step 1: the long lines' pieces (the units are runs of pieces), or None
    served: TokenizedText | None = None  # step 1: the message as those pieces (what the rewrite cuts)
    asked: frozenset[int] = frozenset()  # step 2: the units holding the question found by its form (pinned)
    names: np.ndarray | None = None  # step 5b: BM25 of the names an every-X request spells, or None
    atoms: tuple[tuple[int, ...], ...] = ()  # step 4 (code): the selection's pieces (``coderank.atoms``), or ()
    atom_ranks: np.ndarray | None = None  # step 4 (code): the atoms' BM25 (``coderank.AtomIndex``), or None


@dataclass(frozen=True, kw_only=True)
class CompressionOutcome:
    mode: Mode
    text: str
    prompt_tokens: int
    message_tokens: int
    budget_tokens: int
    kept_tokens: int  # message tokens of the kept units (exact)
    overhead_tokens: int  # estimated tokens of the note and marker lines
    units_in: int
    units_kept: int
    recall: RecallSource | None
    stage_ms: dict[str, float]
    reason: str | None = None
    spread: float | None = None
    analysis: Analysis | None = field(default=None, repr=False, compare=False)
    gutter: str | None = None  # step 0: the line-number gutter found (``"N<TAB>"``, ``"N: "``, ...), or None
    budget_note: str | None = None  # step 4: ``insufficient_middle_budget`` when the budget was widened, or None

    @property
    def served_message_tokens(self) -> int:
        return self.kept_tokens + self.overhead_tokens

    @property
    def kept_prompt_tokens(self) -> int:
        """Estimated prompt tokens after shortening the message."""
        return self.prompt_tokens - self.message_tokens + self.served_message_tokens


def pinned_units(tt: TokenizedText, units: list[Unit], pin_tokens: int) -> set[int]:
    """Step 2: units holding the trailing lines within ``pin_tokens``."""
    if pin_tokens <= 0 or not units:
        return set()
    first = tail_lines(tt.lines, tt.line_tokens, pin_tokens, paragraphs=False)
    starts = np.fromiter(map(_START, units), dtype=np.int64, count=len(units))
    k = int(np.searchsorted(starts, first, side="right")) - 1
    return set(range(max(k, 0), len(units)))


MIDDLE_SHARE = 0.5  # step 4: the least share of the budget left to the ranked units beside the pinned ones
INSUFFICIENT_MIDDLE = "insufficient_middle_budget"


def middle_budget(budget: int, pinned_tokens: int, message_tokens: int) -> tuple[int, str | None]:
    """Step 4: the budget, widened when the pinned tail and the question leave the ranked units less than
    ``MIDDLE_SHARE`` of it (the message would otherwise be cut to its two ends): to the pinned tokens plus that
    share, at most the whole message; with the reason (``insufficient_middle_budget: ...``), else None."""
    room = int(MIDDLE_SHARE * budget)
    if budget - pinned_tokens >= room:
        return budget, None
    wide = min(pinned_tokens + room, message_tokens)
    what = "serving the message whole" if wide >= message_tokens else f"budget widened to {wide} tokens"
    return wide, (f"{INSUFFICIENT_MIDDLE}: the pinned tail and the question take {pinned_tokens} of the "
                  f"{budget}-token budget, leaving the ranked units less than {MIDDLE_SHARE:.0%} of it; {what}")


def line_units(units: list[Unit], lines: tuple[int, int] | None) -> set[int]:
    """Step 2: the units holding any of the lines ``[start, end)`` (none for None)."""
    if lines is None or not units:
        return set()
    a, b = lines
    return {u.index for u in units if u.start_line < b and u.end_line > a}


def gate_scores(scorer: Scorer, work: TokenizedText, units: list[Unit], reps: UnitReps, scores: np.ndarray,
                request: str, query: str, full: str | None = None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Step 5's scores, for a request (the user's own words: ``RequestSpec.user_text``) that asks for every match
    ((None, None) otherwise; ``full``: the text step 3 scored, when it is not ``request``): BM25 of the request's
    every-clause (``spread.every_clause``) over the units, and the ranking whose selection gives the gate its
    ``k``: BM25's of ``query`` (what step 3 ranks by), None when BM25 is the serving scorer (its own).
    Whatever the serving scorer: what a "list every X" asks for is the units that spell X, and BM25 tells an
    every-clause whose words name nothing here (zero) from one whose words are everywhere, where a drafter's
    relevance of a clause cut from its object ("list all the steps it takes") is spread over the message either
    way; and the spread per kept unit must not turn on how many units a scorer's own ranking happens to pack into
    the budget (a ranking that prefers small units keeps more of them and reads as pointed)."""
    if not asks_for_every(request):
        return None, None
    clause = every_clause(request)
    if isinstance(scorer, LexicalScorer):
        same = clause == (request if full is None else full)  # step 3 scored exactly this text
        return (scores if same else validate_scores(scorer.score(reps, clause), len(units))), None
    lexical = LexicalScorer()
    lex_reps = lexical.represent(work, units)
    return validate_scores(lexical.score(lex_reps, clause), len(units)), rank(lexical, lex_reps, query, request,
                                                                              len(units))


def name_scores(scorer: Scorer, work: TokenizedText, units: list[Unit], reps: UnitReps,
                request: str) -> np.ndarray | None:
    """Step 5b: for a request that asks for every match and spells names (``forms.request_names``: "every caller
    of `add_listener`"), BM25 of those names alone over the units (the units that name them are its matches),
    else None."""
    names = request_names(request) if asks_for_every(request) else []
    if not names:
        return None
    lexical = scorer if isinstance(scorer, LexicalScorer) else LexicalScorer()
    lex_reps = reps if lexical is scorer else lexical.represent(work, units)
    return validate_scores(lexical.score(lex_reps, " ".join(names)), len(units))


def rank(scorer: Scorer, reps: UnitReps, query: str, request: str, n: int) -> np.ndarray:
    """Step 3: ``scorer``'s scores of ``query`` (the request, in code without its paths), or of the whole request
    when the query leaves nothing to rank by."""
    scores = validate_scores(scorer.score(reps, query), n)
    if query != request and not scores.any():
        scores = validate_scores(scorer.score(reps, request), n)
    return scores


MATCH_SHARE = 0.3  # step 5b: a unit scoring at least this share of the best on the every-clause is a match


def every_match(gate: np.ndarray, pinned: set[int], names: np.ndarray | None = None) -> set[int]:
    """Step 5b: the unpinned units that match a request for every match: every unit that spells a name the
    request spells (``names``, when any unit does), else those whose BM25 of its every-clause is at least
    ``MATCH_SHARE`` of the best unit's (none when the clause's words name nothing here)."""
    if names is not None and float(np.asarray(names)[[i for i in range(len(names)) if i not in pinned]].sum()) > 0:
        return {i for i in np.flatnonzero(np.asarray(names) > 0).tolist() if i not in pinned}
    g = np.asarray(gate, dtype=np.float64).copy()
    g[list(pinned)] = 0.0
    best = float(g.max()) if len(g) else 0.0
    return set(np.flatnonzero(g >= MATCH_SHARE * best).tolist()) if best > 0 else set()


def held_in_pin(scores: np.ndarray, free: np.ndarray, pinned: set[int], asked: frozenset[int]) -> bool:
    """Step 5: no unpinned unit has any relevance, but a pinned one other than the question's own does: what the
    question matches sits in the pinned tail, which is kept; nothing is spread."""
    rest = sorted(pinned - asked)
    return float(scores[free].sum()) <= 0.0 and bool(rest) and float(scores[rest].sum()) > 0.0


def first_choice(scores: np.ndarray, pinned: set[int]) -> set[int]:
    """Step 4: the unpinned unit with the highest positive score (the first of equals), or nothing."""
    free = np.asarray(scores, dtype=np.float64).copy()
    free[list(pinned)] = -np.inf
    if not len(free) or not free.max() > 0:
        return set()
    return {int(np.argmax(free))}


TIE = 0.9  # step 4 (code): a unit scoring at least this share of the first choice's score is a first choice too
# (users'-words code tasks, dev split, offline, FIRST_SHARE 0.9: 0.9 kept the needed definition in 66 of 84 reads,
# 0.7 in 68, but at 0.7 the runner-up's definition crowds the rest out of a small budget: bench quality --quick
# lost its 2K agent case)


def first_definitions(scores: np.ndarray, pinned: set[int], first: set[int], blocks: tuple[tuple[int, ...], ...],
                      toks: np.ndarray, budget: int) -> set[int]:
    """Step 4 (code): the first choice, then the unpinned units scoring within ``TIE`` of it, best first, and the
    whole definitions they are all part of (``blocks``), best first, while what they add stays within
    ``FIRST_SHARE`` of the budget."""
    if not first:
        return first
    best = float(scores[next(iter(first))])
    out = set(first)
    room = FIRST_SHARE * budget - float(toks[list(out)].sum())
    ties = [i for i in np.flatnonzero(scores >= TIE * best).tolist() if i not in pinned and i not in out]
    for i in sorted(ties, key=lambda i: (-float(scores[i]), i)):
        if toks[i] <= room:
            out.add(i)
            room -= float(toks[i])
    for u in sorted(out, key=lambda i: (-float(scores[i]), i)):
        block = next((b for b in blocks if u in b), None)  # innermost first
        if block is not None:
            room = _take_whole(out, block, toks, room)
    return out


def code_atoms(work: TokenizedText, units: list[Unit], defs: list[tuple[int, str]], reps: UnitReps | None, query: str,
               request: str, max_tokens: int, code: bool) -> tuple[tuple[tuple[int, ...], ...], np.ndarray | None]:
    """Step 4 (code): the selection's atoms (``coderank.atoms`` of ``named.definition_atoms``) and, when BM25
    serves code (``lexical``, or ``auto`` on code), their BM25 of ``query`` (of ``request`` when the query shares
    nothing with the file); ((), None) for a message that is not code."""
    if not code:
        return (), None
    groups = atoms(len(units), definition_atoms(work, units, max_tokens, defs))
    if not _lexical(reps):
        return groups, None
    index = AtomIndex.build(work, units, groups)
    ranks = index.score(query)
    if query != request and not ranks.any():
        ranks = index.score(request)
    return groups, ranks


def _lexical(reps: object) -> bool:
    """Reps of plain BM25 (``lexical``, or ``auto`` routed to it)."""
    if not isinstance(reps, UnitReps):  # a plug-in scorer's own representation
        return False
    if reps.scorer == "auto" and isinstance(reps.payload, tuple) and len(reps.payload) == 2:
        return _lexical(reps.payload[1])
    return reps.scorer == "lexical"


def atom_first(groups: tuple[tuple[int, ...], ...], ranks: np.ndarray, scores: np.ndarray, pinned: set[int],
               toks: np.ndarray) -> set[int]:
    """Step 4 (code): the first choice: the best unit of the best-ranked atom with an unpinned unit, when its rank
    is positive (kept whatever the budget, as ``first_choice``)."""
    size = np.array([float(max(int(toks[list(g)].sum()), 1)) for g in groups])
    key = np.asarray(ranks, dtype=np.float64) / size ** SIZE_POWER
    for k in np.lexsort((np.arange(len(groups)), -key)).tolist():
        if key[k] <= 0:
            return set()
        free = [u for u in groups[k] if u not in pinned]
        if free:
            return {max(free, key=lambda u: (float(scores[u]), -u))}
    return set()


@dataclass
class _Job:
    """One ``compress`` call's running state: the message as served (its pieces, once step 1 cut them), where it
    goes, the steps' timings and the clock of the step under way, and the gutter found (step 0)."""
    tt: TokenizedText
    prompt_tokens: int
    source: Source
    label: str
    message_tokens: int = 0
    gutter: str | None = None
    widen_room: int | None = None  # step 4: the most ``coderank.widen`` may take the budget to
    ms: dict[str, float] = field(default_factory=dict)
    t: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.message_tokens = self.tt.total_tokens

    def lap(self, name: str) -> None:
        """Count the time since the last lap to step ``name``."""
        self.t = _lap(self.ms, name, self.t)

    def full(self, mode: Mode, reason: str, *, budget_tokens: int = 0, units_in: int = 0,
             spread: float | None = None, analysis: Analysis | None = None) -> CompressionOutcome:
        """The outcome that serves the message whole, saying why."""
        return CompressionOutcome(mode=mode, text=self.tt.text, prompt_tokens=self.prompt_tokens,
                                  message_tokens=self.message_tokens, budget_tokens=budget_tokens,
                                  kept_tokens=self.message_tokens, overhead_tokens=0, units_in=units_in,
                                  units_kept=units_in, recall=None, stage_ms=self.ms, reason=reason, spread=spread,
                                  analysis=analysis, gutter=self.gutter)


def _intent(request: RequestSpec) -> str:
    """The user's own words of the request (``RequestSpec.user_text``), else its text."""
    return request.text if request.user_text is None else request.user_text


class Compressor:
    def __init__(self, settings: CompressionSettings | None = None, segmenter: Segmenter | None = None,
                 scorer: Scorer | None = None) -> None:
        self.settings = settings or CompressionSettings()
        self.segmenter = segmenter or UnitSegmenter(self.settings.min_segment, self.settings.max_segment)
        self.scorer = scorer or LexicalScorer()
        self.selector = BudgetSelector()
        self.rewriter = Rewriter()

    def compress(self, tt: TokenizedText, request: RequestSpec, prompt_tokens: int, in_conversation: bool,
                 source: Source, label: str = "", budget_adjust: int = 0,
                 analysis: Analysis | None = None, widen_room: int | None = None) -> CompressionOutcome:
        """Steps 0-6 (module docstring); never raises: a failure serves the message whole (``full-error``).

        ``budget_adjust``: tokens to take off the budget (a caller that measured the served message exactly
        and found the note/marker estimate off re-runs with the difference, passing the first outcome's
        ``analysis`` so that stages 1-3 are not repeated). ``widen_room``: the most an unsure code ranking may
        widen the message's budget to (``coderank.widen``; the caller knows the slot's context), None: no bound."""
        job = _Job(tt, prompt_tokens, source, label, gutter=None if analysis is None else analysis.gutter,
                   widen_room=widen_room)
        try:
            analysis = self._analyse(job, request) if analysis is None else self._resume(job, analysis)
            toks = np.fromiter(map(_TOKENS, analysis.units), dtype=np.int64, count=len(analysis.units))
            budget, note = self._budget(job, analysis, toks)
            if note is not None and budget >= job.message_tokens:
                return job.full("full-budget", note, budget_tokens=budget, units_in=len(analysis.units),
                                analysis=analysis)
            budget = max(1, budget - budget_adjust)
            kept = self._choose(analysis.scores, analysis, toks, budget, source, label, len(job.tt.lines))
            job.lap("select")
            sp = self._gate(job, analysis, _intent(request), toks, budget, kept)
            kept, sp = self._every_match(job, analysis, toks, budget, kept, sp)
            if sp.flat and (not in_conversation or sp.whole or sp.matches is not None
                            or (sp.applies and asks_for_every(_intent(request)))):
                return job.full("full-flat", sp.reason, budget_tokens=budget, units_in=len(analysis.units),
                                spread=sp.spread, analysis=analysis)  # the scores that were too flat: the inspector
            return self._rewrite(job, analysis, toks, budget, kept, note, sp)
        except Exception as e:  # noqa: BLE001 - a failure here serves the message whole, never fails the request
            return job.full("full-error", f"{type(e).__name__}: {e}")

    def _resume(self, job: _Job, analysis: Analysis) -> Analysis:
        """A re-run on an earlier call's steps 0-3: their timings, and the message as they cut it."""
        job.ms.update(analysis.stage_ms)
        job.tt = analysis.served or job.tt
        return analysis

    def _segment(self, job: _Job) -> tuple[TokenizedText, list[Unit], Pieces | None]:
        """Steps 0-1: the text the scorers read (behind a gutter, long lines as pieces) and its units; ``job.tt``
        becomes the served message as those pieces."""
        tt = job.tt
        g = find_gutter(tt.lines)  # step 0: cut and score behind the line numbers
        seg = tt if g is None else bare_text(tt, g, content_tokens=True)
        pieces = cut_long_lines(seg, self.segmenter.max_segment, None if g is None else g.prefix)
        work = tt if g is None else bare_text(tt, g)
        if pieces is not None:
            seg, work = pieces.apply(seg, newlines=True), pieces.apply(work, newlines=True)
            job.tt = pieces.apply(tt, numbered=g is not None)
        units = list(self.segmenter.segment(seg, None))
        if g is not None:
            job.gutter = g.form
            units = _recount(units, job.tt)
        _check_units(units, job.tt)
        job.lap("segment")
        return work, units, pieces

    def _analyse(self, job: _Job, request: RequestSpec) -> Analysis:
        """Steps 0-3: units, the always-kept ones, the definitions the request names, and the scores."""
        work, units, pieces = self._segment(job)
        kept_lines = request.kept_lines
        if kept_lines is not None and pieces is not None:  # the question's lines, counted in pieces
            first = pieces.first()
            n = len(first) - 1
            kept_lines = (first[min(kept_lines[0], n)], first[min(kept_lines[1], n)])
        asked = frozenset(line_units(units, kept_lines))
        pinned = pinned_units(work, units, request.pinned_tail_tokens) | asked
        defs = definitions(work)
        named, optional = named_definitions(work, units, without_paths(request.text), defs)
        blocks = tuple(definition_blocks(work, units, BLOCK_SEGMENTS * self.settings.max_segment, defs))
        reps = self.scorer.represent(work, units)
        job.lap("represent")
        code = is_code(units)
        query = without_paths(request.text) if code else request.text
        scores = rank(self.scorer, reps, query, request.text, len(units))
        job.lap("score")
        intent = _intent(request)
        gate, ranking = gate_scores(self.scorer, work, units, reps, scores, intent, query, request.text)
        atoms, atom_ranks = code_atoms(work, units, defs, reps, query, request.text,
                                       BLOCK_SEGMENTS * self.settings.max_segment, code)
        return Analysis(units=units, pinned=pinned, reps=reps, scores=scores, stage_ms=dict(job.ms),
                        gutter=job.gutter, named=named, blocks=blocks, named_optional=optional,
                        outline=outline(work.lines, defs) if code else (), gate_scores=gate, gate_ranking=ranking,
                        pieces=pieces, served=job.tt if pieces is not None else None, asked=asked,
                        names=name_scores(self.scorer, work, units, reps, intent), atoms=atoms,
                        atom_ranks=atom_ranks)

    def _budget(self, job: _Job, analysis: Analysis, toks: np.ndarray) -> tuple[int, str | None]:
        """Step 4's budget: the curve's, widened when the pinned units leave too little (``middle_budget``)."""
        m_tok, pinned = job.message_tokens, analysis.pinned
        budget = message_budget(self.settings.curve, max(job.prompt_tokens, m_tok), m_tok,
                                min(self.settings.min_message_budget, m_tok))
        budget = widen(budget, m_tok, analysis.atoms, analysis.atom_ranks, toks,  # code: more when unsure
                       job.widen_room)
        return middle_budget(budget, int(toks[list(pinned)].sum()) if pinned else 0, m_tok)

    def _gate(self, job: _Job, analysis: Analysis, intent: str, toks: np.ndarray, budget: int,
              kept: list[int]) -> Spread:
        """Step 5: the spread of the unpinned units' relevance over the units the budget keeps (``flat_gate``)."""
        # The pinned units (the request itself, when it sits in the message) are kept whatever their
        # score and would dominate the measure: spread is over the units the budget actually chooses.
        units, pinned, scores = analysis.units, analysis.pinned, analysis.scores
        free = np.ones(len(units), dtype=bool)
        free[list(pinned)] = False
        assert isinstance(self.settings.fallback_spread, SpreadCurve)  # __post_init__
        gate = analysis.gate_scores
        counted = kept if analysis.gate_ranking is None and not analysis.atoms else \
            self._choose(scores if analysis.gate_ranking is None else analysis.gate_ranking, analysis, toks,
                         budget, job.source, job.label, len(job.tt.lines), by_units=True)
        sp = flat_gate(scores[free], len(set(counted) - pinned),
                       self.settings.fallback_spread.at(max(job.prompt_tokens, job.message_tokens)), intent,
                       None if gate is None else gate[free], is_code(units))
        job.lap("spread")
        if sp.flat and not sp.whole and analysis.asked and held_in_pin(scores, free, pinned, analysis.asked):
            sp = replace(sp, flat=False)  # what the question matches is all in the pinned tail
        return sp

    def _every_match(self, job: _Job, analysis: Analysis, toks: np.ndarray, budget: int, kept: list[int],
                     sp: Spread) -> tuple[list[int], Spread]:
        """Step 5b: for a request for every match, the selection with every match, or flat when they do not fit."""
        gate, pinned = analysis.gate_scores, analysis.pinned
        if sp.flat or not sp.applies or gate is None:
            return kept, sp
        matches = every_match(gate, pinned, analysis.names)
        if matches <= set(kept):
            return kept, sp
        need = int(toks[sorted(matches | pinned)].sum())
        if need > budget:
            return kept, replace(sp, flat=True, matches=(len(matches), need, budget))
        return self._choose(analysis.scores, analysis, toks, budget, job.source, job.label, len(job.tt.lines),
                            matches), sp

    def _rewrite(self, job: _Job, analysis: Analysis, toks: np.ndarray, budget: int, kept: list[int],
                 note: str | None, sp: Spread) -> CompressionOutcome:
        """Step 6: the served text (note, kept lines, markers) and what recall needs, as the compressed outcome."""
        units = analysis.units
        out = self.rewriter.rewrite(job.tt, units, kept, job.source, job.label, analysis.outline,
                                    int(NAMES_SHARE * budget), pieces=analysis.pieces)
        overhead = approx_tokens(out.note) + marker_tokens(out.omitted) + names_tokens(out.names)
        recall = _recall_source(job, analysis, toks, [i for r in out.omitted for i in r.unit_indices])
        job.lap("rewrite")
        return CompressionOutcome(mode="compressed", text=out.text, prompt_tokens=job.prompt_tokens,
                                  message_tokens=job.message_tokens, budget_tokens=budget,
                                  kept_tokens=int(toks[kept].sum()), overhead_tokens=overhead, units_in=len(units),
                                  units_kept=len(kept), recall=recall, stage_ms=job.ms, reason=note,
                                  spread=sp.spread, analysis=analysis, gutter=job.gutter,
                                  budget_note=None if note is None else INSUFFICIENT_MIDDLE)

    def _choose(self, scores: np.ndarray, analysis: Analysis, toks: np.ndarray, budget: int, source: Source,
                label: str, n_lines: int, also: Iterable[int] = (), by_units: bool = False) -> list[int]:
        """Step 4 for one ranking: the named definitions and the first choice kept, then the budget's selection
        by density (``_select_with_overhead``); in code, of whole definitions (``coderank``), unless ``by_units``
        (the flat gate's count, step 5: calibrated on the units a ranking by density keeps)."""
        units, pinned = analysis.units, analysis.pinned
        dens = density(scores, toks)
        keep_named = named_keep(analysis.named, analysis.named_optional, toks, dens, budget)
        first = first_choice(scores, pinned)
        pieces: tuple[tuple[tuple[int, ...], ...], np.ndarray, np.ndarray] | None = None
        if analysis.atoms and not by_units:  # code: definitions ranked and kept whole (``coderank``)
            ranks = analysis.atom_ranks if analysis.atom_ranks is not None and scores is analysis.scores \
                else atom_scores(scores, analysis.atoms)
            pieces = (analysis.atoms, ranks, scores)
            first = atom_first(analysis.atoms, ranks, scores, pinned, toks)
        elif is_code(units):  # the ties' definitions get what the note and the markers around them leave
            base = sorted(pinned | keep_named | first)
            starts = np.fromiter(map(_START, units), dtype=np.int64, count=len(units))
            ends = np.fromiter(map(_END, units), dtype=np.int64, count=len(units))
            marks = self._overhead(starts, ends, base, source, label, n_lines, analysis.outline,
                                   int(NAMES_SHARE * budget)) if base else 0
            first = first_definitions(scores, pinned, first, analysis.blocks, toks, max(budget - 2 * marks, 1))
        return self._select_with_overhead(units, toks, dens, budget, pinned | keep_named | first | set(also), source,
                                          label, n_lines, analysis.blocks, analysis.outline, pieces)

    def _select_with_overhead(self, units: list[Unit], toks: np.ndarray, dens: np.ndarray, budget: int,
                              pinned: set[int], source: Source, label: str, n_lines: int,
                              blocks: tuple[tuple[int, ...], ...] = (),
                              outline: tuple[tuple[int, str, str | None], ...] = (),
                              pieces: tuple[tuple[tuple[int, ...], ...], np.ndarray, np.ndarray] | None = None
                              ) -> list[int]:
        """Step 4: select so that kept units plus note/marker lines (and the parts ``close_blocks`` adds) land on
        the budget, never past it.

        Reselects with the selection's budget lowered by the last round's note, marker and ``close_blocks``
        tokens (when that round passed the budget: lowered by its excess) until it lands within ``LAND_SLACK``
        below the budget, the selection's budget repeats, or ``LAND_ROUNDS`` rounds, and returns the best round
        (``landing_key``: at most the budget and closest to it, else the least over; the always-kept units alone
        can pass it).
        """
        best: tuple[tuple[bool, int], list[int]] | None = None
        n = len(units)
        starts = np.fromiter(map(_START, units), dtype=np.int64, count=n)
        ends = np.fromiter(map(_END, units), dtype=np.int64, count=n)
        room = budget
        seen = {room}
        for _ in range(LAND_ROUNDS):
            chosen = self._select(units, dens, max(room, 1), pinned, toks) if pieces is None else \
                select_atoms(pieces[0], pieces[1], pieces[2], toks, max(room, 1), pinned)
            kept = close_blocks(chosen, blocks, toks, dens, budget)
            extra = self._overhead(starts, ends, kept, source, label, n_lines, outline, int(NAMES_SHARE * budget))
            extra += int(toks[kept].sum()) - int(toks[chosen].sum())
            served = int(toks[chosen].sum()) + extra
            key = landing_key(served, budget)
            if best is None or key < best[0]:
                best = (key, kept)
            if landed(served, budget):
                break
            room = room - (served - budget) if served > budget else budget - extra
            if room in seen:
                break
            seen.add(room)
        assert best is not None  # the loop runs at least once
        return best[1]

    def _select(self, units: list[Unit], dens: np.ndarray, budget: int, pinned: set[int],
                toks: np.ndarray) -> list[int]:
        if isinstance(self.selector, BudgetSelector):  # hand it the token array it would rebuild each round
            return self.selector.select(units, dens, budget, pinned, tokens=toks)
        return self.selector.select(units, dens, budget, pinned)

    @staticmethod
    def _overhead(starts: np.ndarray, ends: np.ndarray, kept: list[int], source: Source, label: str,
                  n_lines: int, outline: tuple[tuple[int, str, str | None], ...] = (), names_room: int = 0) -> int:
        """Estimated tokens of the note and marker lines for this selection (vectorised; the names a marker
        holds, one range at a time)."""
        n = len(starts)
        keep = np.zeros(n + 2, dtype=bool)
        keep[[0, n + 1]] = True
        keep[np.asarray(kept, dtype=np.int64) + 1] = True
        edges = np.flatnonzero(keep[1:] != keep[:-1])
        a, b = starts[edges[0::2]], ends[edges[1::2] - 1]
        shown = n_lines - int((b - a).sum())
        names = 0
        if outline and names_room > 0:
            names = names_tokens(marker_names(outline, list(zip(a.tolist(), b.tolist())), names_room))
        return approx_tokens(note_line(source, shown, n_lines, label)) + int(marker_tokens_arrays(a, b).sum()) + names


LAND_SLACK = 0.015  # step 4: a served total within this share below the budget has landed
LAND_ROUNDS = 6  # step 4: selections tried to land on the budget


def landing_key(served: int, budget: int) -> tuple[bool, int]:
    """Order of landings (smaller is better): at most the budget first, then the closest to it."""
    return served > budget, abs(served - budget)


def landed(served: int, budget: int, slack: float = LAND_SLACK) -> bool:
    """A served total on the budget: at most it, and within ``slack`` of it."""
    return budget - slack * budget <= served <= budget


@dataclass
class Landing:
    """A caller's landing of a compressed outcome on its budget, once the served text is counted exactly (the
    proxy re-tokenizes it: the note/marker estimate can be off): ``next_adjust`` gives the ``budget_adjust`` of
    the next re-run (None once landed), ``offer`` takes that run's outcome and count; ``best`` is the best so far
    (``landing_key``). An offer no better than the best steps the adjustment back half way."""
    target: int
    best: tuple[CompressionOutcome, int]
    adjust: int = 0

    def next_adjust(self) -> int | None:
        if landed(self.best[1], self.target):
            return None
        self.adjust += self.best[1] - self.target
        return self.adjust

    def offer(self, outcome: CompressionOutcome, count: int) -> None:
        if landing_key(count, self.target) < landing_key(self.best[1], self.target):
            self.best = (outcome, count)
        else:
            self.adjust -= (self.best[1] - self.target) // 2  # overshot: step back half way


NAMES_SHARE = 0.025  # step 6: the names omission markers give take at most this share of the budget
NAMED_SHARE = 0.5  # step 4: optional named definitions join while all named units stay within this share
FIRST_SHARE = 0.9  # step 4 (code): the first choices and their whole definitions, within this share of the budget
# less twice the note and markers around the always-kept units (users'-words code tasks, dev split, offline, 84
# reads, TIE 0.9: 0.5 kept the needed definition in 60, 0.7 in 65, 0.9 in 66: a long definition whose head the
# question matches needs most of a small read's budget)


def named_keep(named: frozenset[int], optional: tuple[tuple[int, ...], ...], toks: np.ndarray, dens: np.ndarray,
               budget: int) -> set[int]:
    """Step 4: the named units and the optional definitions that fit the named share of the budget."""
    keep = set(named)
    if not optional:
        return keep
    room = NAMED_SHARE * budget - float(toks[list(keep)].sum()) if keep else NAMED_SHARE * budget
    for d in sorted(optional, key=lambda d: (-float(dens[list(d)].max()), d[0])):
        room = _take_whole(keep, d, toks, room)
    return keep


def _take_whole(keep: set[int], group: Iterable[int], toks: np.ndarray, room: float) -> float:
    """Add the units of ``group`` not yet in ``keep`` when together they fit ``room`` (all or none); the room left."""
    add = [k for k in group if k not in keep]
    size = float(toks[add].sum()) if add else 0.0
    if size > room:
        return room
    keep.update(add)
    return room - size


BLOCK_SEGMENTS = 8  # step 4: definitions of up to this many max_segment tokens are blocks (kept whole when chosen)
CLOSE_SHARE = 0.25  # step 4: a cut definition's missing units, at most this share of its tokens, are added
CLOSE_BUDGET = 0.10  # ... and all such additions together at most this share of the budget


def close_blocks(kept: list[int], blocks: tuple[tuple[int, ...], ...], toks: np.ndarray, dens: np.ndarray,
                 budget: int) -> list[int]:
    """Step 4: the selection with the small missing parts of its partly kept definitions (sorted)."""
    if not blocks:
        return kept
    have = set(kept)
    partial = []
    for b in blocks:
        missing = [k for k in b if k not in have]
        if missing and len(missing) < len(b):
            size = int(toks[list(b)].sum())
            add = int(toks[missing].sum())
            if add <= CLOSE_SHARE * size:
                partial.append((-float(max(dens[k] for k in b if k in have)), add, missing))
    room = CLOSE_BUDGET * budget
    for _, add, missing in sorted(partial, key=lambda x: (x[0], x[1])):
        missing = [k for k in missing if k not in have]
        add = int(toks[missing].sum()) if missing else 0
        if missing and add <= room:
            have.update(missing)
            room -= add
    return sorted(have)


def _recall_source(job: _Job, analysis: Analysis, toks: np.ndarray, omitted_ids: list[int]) -> RecallSource:
    """Step 6: what recall needs of a compressed message: the reps, and every unit's lines, tokens, kind and text."""
    units, lines = analysis.units, job.tt.lines
    us, ue = list(map(_START, units)), list(map(_END, units))

    def unit_text(i: int) -> str:
        return lines[us[i]] if ue[i] - us[i] == 1 else "".join(lines[us[i]:ue[i]])

    omitted = set(omitted_ids)
    return RecallSource(label=job.label, reps=analysis.reps, unit_lines=tuple(zip(us, ue)),
                        unit_tokens=tuple(toks.tolist()), omitted_texts={i: unit_text(i) for i in omitted_ids},
                        kept_texts={i: unit_text(i) for i in range(len(units)) if i not in omitted},
                        line_tokens=tuple(job.tt.line_tokens), unit_kinds=tuple(ContentKind(u.kind).value for u in units),
                        pieces=analysis.pieces.to_plain() if analysis.pieces is not None else ())


def _check_units(units: list[Unit], tt: TokenizedText) -> None:
    """Units from a plug-in segmenter must tile the message in order."""
    pos = 0
    for i, u in enumerate(units):
        if u.index != i or u.start_line != pos or u.end_line <= u.start_line:
            raise ValueError(f"segmenter returned a unit {i} that does not tile the message")
        pos = u.end_line
    if pos != len(tt.lines) or len(units) < 2:
        raise ValueError("segmenter units do not cover the message")


def _recount(units: list[Unit], tt: TokenizedText) -> list[Unit]:
    """Step 0: the same units with ``tt``'s token counts (the served lines' tokens)."""
    off = tt.token_offsets
    return [Unit(u.index, u.start_line, u.end_line, int(off[u.end_line] - off[u.start_line]), u.kind)
            for u in units]


def _lap(ms: dict[str, float], name: str, t: float) -> float:
    now = time.perf_counter()
    ms[name] = ms.get(name, 0.0) + (now - t) * 1e3
    return now
