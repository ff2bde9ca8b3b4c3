"""The compression pipeline for one new long message.

Algorithm (``Compressor.compress``), each stage timed into ``stage_ms``:
0. gutter: when every line carries a line number (an agent's file read, ``cat -n``,
   ``grep -n``: ``gutter.find_gutter``), stages 1-3 work on the text behind the numbers
   (``gutter.bare_text``: the same lines, one for one), so kind detection, cuts and
   scores see the code: the segmenter sizes units by the estimated tokens behind the
   numbers (so they fall where they fall in the plain file), and the units then carry
   the numbered lines' token counts, which are what the budget spends.  The rewrite
   and recall (step 6) use the original, numbered lines, so the served lines keep
   their numbers.  The outcome names the gutter's form (``gutter``).
1. segment: cut the message into whole-line units (``Segmenter``).  A line over ``max_segment`` tokens is
   first cut into pieces (``longlines.cut_long_lines``: sentences, JSON items, HTML elements, statements...);
   every later stage sees a piece as a line (the segmenter and scorers each piece on a line of its own), the
   rewrite says what an omission hides in lines or in pieces, and recall can bring back a part of a line.
2. pin: when the request pins the message tail, the units holding the trailing lines
   whose tokens sum to at most ``pinned_tail_tokens`` (at least the last non-blank
   line) are always kept, and so are the units holding the question found by its form
   (``RequestSpec.kept_lines``, ``asked``: a question before its paste).  The units that define a name the
   request spells out, outside the file paths it names (``request.without_paths``: the agent's "I'll read
   relativedelta.py" names the file, not its ``class relativedelta``)
   (``named.named_definitions``: "what does array_split do?" keeps all of ``def array_split``,
   "Store.__setitem__" that class's method) are kept too, like the first choice below (they
   do not count as pinned for the spread); a name defined several times that the request
   does not tie to one of them names optional definitions, kept in step 4.
3. score: ``represent`` then ``score`` against the request text; ``validate_scores``.  In code
   (``routed.is_code``), the text without the file paths it names and the tool call's name and keys
   (``request.without_paths``: they name the file, and their words match its header and imports); when that
   leaves nothing the message shares, the whole request text.
4. budget: ``message_budget`` from the curve on ``prompt_tokens`` (the tokens the
   upstream would prefill); when the pinned units (the tail and the question) leave the ranked ones less than
   ``MIDDLE_SHARE`` of it, widened to the pinned tokens plus that share (``middle_budget``), or, when that is the
   whole message, the message is served whole (``full-budget``); either way the outcome says so
   (``budget_note``/``reason``: ``insufficient_middle_budget``), never a message silently cut to its two ends.
   Then ``BudgetSelector`` by density, with the pinned units
   and the scorer's first choice (``first_choice``: the unpinned unit with the highest
   score, when it is positive; ties to the first) kept before the walk: the budget is
   passed only when those alone exceed it, and then by at most that unit's tokens.
   In code (``routed.is_code``) the selection's pieces are definitions, not units (``coderank``): every function
   and method (``named.definition_atoms``, up to ``BLOCK_SEGMENTS`` max_segments) is one atom, every other unit
   an atom of its own; an atom is ranked as one document (BM25 of the query over the atoms, when BM25 serves
   code: ``lexical``, or ``auto`` on code; for another scorer, its best unit's score), and the walk keeps atoms
   whole, by ``score / tokens ** coderank.SIZE_POWER``, then fills the rest of the budget with single units.
   The first choice there is the best unit of the best-ranked atom (``atom_first``): a question in other words
   asks about a definition, and its words often match the head of it only (the signature and docstring), or
   its body spread over several units. (Before: the units scoring within ``TIE`` of the first choice were first
   choices too, each with the rest of its definition (``first_definitions``) within ``FIRST_SHARE`` of the
   budget, the rest by unit density; that selection still counts the flat gate's kept units, step 5.)
   The optional named definitions (step 2) join them, most relevant first (their best unit's
   density), each while all named units together stay within ``NAMED_SHARE`` of the budget.
   The note and marker lines cost tokens too: the selection is rerun with the budget
   lowered by their estimated size (``approx_tokens``) and the parts added below (by the
   excess, when a round passed the budget) so the served message lands on the budget, at
   most it: the budget is a ceiling, passed only when the always-kept units leave no room.  A definition the cutter had to cut (longer than its largest unit,
   ``named.definition_blocks``: at most ``2 * max_segment`` tokens) is not served in part
   when the rest is small: the selection's partly kept blocks, most relevant first, get
   their missing units while those are at most ``CLOSE_SHARE`` of the block's tokens and
   all such additions stay within ``CLOSE_BUDGET`` of the budget.
5. spread: ``spread.flat_gate`` over the non-pinned units, at the threshold the settings' curve gives for the
   prompt's tokens, of BM25's scores of the request's every-clause (``gate_scores``, computed with stage 3 for
   a request that asks for every match, whatever the serving scorer), per unit that step 4 keeps when it ranks
   by BM25's scores of the request (for another scorer a second selection: the decision does not turn on how
   many units the serving scorer's ranking packs into the budget): flat only for zero
   relevance or a request that asks for every match (not for zero relevance when the question's matches all sit in
   the pinned tail: ``held_in_pin``); flat on a cold request -> ``full-flat`` (original text,
   the reason one sentence with the numbers the decision used); flat inside a running conversation -> compress
   anyway (recall can bring lines back), but not for a request that asks for every match or for the whole: the
   answer needs them in this turn, and the long message is new, so serving it whole costs no cached prefix.
5b. every match: a request that asks for every match and is not flat is served with every match (``every_match``:
   the units that spell a name the request spells, ``name_scores``, else those whose BM25 of the every-clause is
   at least ``MATCH_SHARE`` of the best), kept like the pinned units,
   when they fit the budget with the pinned ones; when they do not, it is flat (as step 5: whole when cold).
6. rewrite: note + kept lines + markers (in code, each naming the definitions it hides:
   ``named.outline``, ``rewrite.marker_names``, all names within ``NAMES_SHARE`` of the budget; their tokens
   are part of the overhead of step 4);
   keep the reps and every unit's text (kept and omitted) as a ``RecallSource``.
Any exception in stages 1-6 (including ``CannotSegment`` and ``InvalidScores``)
returns ``full-error`` with the original text and the reason; ``compress`` never
raises.  A compressed outcome carries its ``Analysis`` (stages 1-3): a caller that
re-runs the budget (``budget_adjust``) passes it back, so a drafter scorer does not
read the message again.  A ``full-flat`` outcome carries it too (the flat scores, for
the inspector).
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
from .coderank import SIZE_POWER, AtomIndex, atom_scores, atoms, select_atoms
from .named import definition_atoms, definition_blocks, definitions, named_definitions, outline
from .recall import RecallSource
from .request import RequestSpec, tail_lines, without_paths
from .routed import is_code
from .rewrite import Rewriter, Source, marker_names, marker_tokens, marker_tokens_arrays, names_tokens, note_line
from .scores import LexicalScorer, Scorer, UnitReps, density, validate_scores
from .forms import request_names
from .spread import SpreadCurve, asks_for_every, every_clause, flat_gate
from .text import TokenizedText, approx_tokens
from .units import Segmenter, Unit, UnitSegmenter

__all__ = ["Analysis", "CompressionOutcome", "CompressionSettings", "Compressor", "Landing", "Mode", "first_choice",
           "first_definitions", "landed", "landing_key"]

_START, _END, _TOKENS = attrgetter("start_line"), attrgetter("end_line"), attrgetter("tokens")

Mode = Literal["compressed", "full-flat", "full-error", "full-budget"]


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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
                 analysis: Analysis | None = None) -> CompressionOutcome:
        """``budget_adjust``: tokens to take off the budget (a caller that measured the served message exactly
        and found the note/marker estimate off re-runs with the difference, passing the first outcome's
        ``analysis`` so that stages 1-3 are not repeated)."""
        ms: dict[str, float] = {}
        m_tok = tt.total_tokens
        gutter: str | None = None if analysis is None else analysis.gutter

        def full(mode: Mode, reason: str, *, budget_tokens: int = 0, units_in: int = 0, spread: float | None = None,
                 analysis: Analysis | None = None) -> CompressionOutcome:
            return CompressionOutcome(mode, tt.text, prompt_tokens, m_tok, budget_tokens, m_tok, 0, units_in,
                                      units_in, None, ms, reason, spread, analysis, gutter)

        try:
            t = time.perf_counter()
            if analysis is None:
                g = find_gutter(tt.lines)  # step 0: cut and score behind the line numbers
                seg = tt if g is None else bare_text(tt, g, content_tokens=True)
                pieces = cut_long_lines(seg, getattr(self.segmenter, "max_segment", self.settings.max_segment),
                                        None if g is None else g.prefix)  # step 1: long lines cut in pieces
                work = tt if g is None else bare_text(tt, g)
                if pieces is not None:
                    seg, work = pieces.apply(seg, newlines=True), pieces.apply(work, newlines=True)
                    tt = pieces.apply(tt, numbered=g is not None)
                units = list(self.segmenter.segment(seg, None))
                if g is not None:
                    gutter = g.form
                    units = _recount(units, tt)
                _check_units(units, tt)
                t = _lap(ms, "segment", t)
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
                t = _lap(ms, "represent", t)
                code = is_code(units)
                query = without_paths(request.text) if code else request.text
                scores = rank(self.scorer, reps, query, request.text, len(units))
                t = _lap(ms, "score", t)
                intent = request.text if request.user_text is None else request.user_text  # the user's own words
                gate, ranking = gate_scores(self.scorer, work, units, reps, scores, intent, query, request.text)
                analysis = Analysis(units, pinned, reps, scores, dict(ms), gutter, named, blocks, optional,
                                    outline(work.lines, defs) if code else (), gate, ranking, pieces,
                                    tt if pieces is not None else None, asked,
                                    name_scores(self.scorer, work, units, reps, intent),
                                    *code_atoms(work, units, defs, reps, query, request.text,
                                                BLOCK_SEGMENTS * self.settings.max_segment, code))
            else:
                ms.update(analysis.stage_ms)
                tt = analysis.served or tt
            units, pinned, reps, scores = analysis.units, analysis.pinned, analysis.reps, analysis.scores
            intent = request.text if request.user_text is None else request.user_text
            toks = np.fromiter(map(_TOKENS, units), dtype=np.int64, count=len(units))
            budget = message_budget(self.settings.curve, max(prompt_tokens, m_tok), m_tok,
                                    min(self.settings.min_message_budget, m_tok))
            budget, note = middle_budget(budget, int(toks[list(pinned)].sum()) if pinned else 0, m_tok)
            if note is not None and budget >= m_tok:
                return full("full-budget", note, budget_tokens=budget, units_in=len(units), analysis=analysis)
            budget = max(1, budget - budget_adjust)
            kept = self._choose(scores, analysis, toks, budget, source, label, len(tt.lines))
            t = _lap(ms, "select", t)
            # The pinned units (the request itself, when it sits in the message) are kept whatever their
            # score and would dominate the measure: spread is over the units the budget actually chooses.
            free = np.ones(len(units), dtype=bool)
            free[list(pinned)] = False
            assert isinstance(self.settings.fallback_spread, SpreadCurve)  # __post_init__
            gate = analysis.gate_scores
            counted = kept if analysis.gate_ranking is None and not analysis.atoms else \
                self._choose(scores if analysis.gate_ranking is None else analysis.gate_ranking, analysis, toks,
                             budget, source, label, len(tt.lines), by_units=True)
            sp = flat_gate(scores[free], len(set(counted) - pinned),
                           self.settings.fallback_spread.at(max(prompt_tokens, m_tok)), intent,
                           None if gate is None else gate[free], is_code(units))
            t = _lap(ms, "spread", t)
            if sp.flat and not sp.whole and analysis.asked and held_in_pin(scores, free, pinned, analysis.asked):
                sp = replace(sp, flat=False)  # step 5: what the question matches is all in the pinned tail
            if not sp.flat and sp.applies and gate is not None:  # step 5b: every match, or served whole
                matches = every_match(gate, pinned, analysis.names)
                if not matches <= set(kept):
                    need = int(toks[sorted(matches | pinned)].sum())
                    if need <= budget:
                        kept = self._choose(scores, analysis, toks, budget, source, label, len(tt.lines), matches)
                    else:
                        sp = replace(sp, flat=True, matches=(len(matches), need, budget))
            if sp.flat and (not in_conversation or sp.whole or sp.matches is not None
                            or (sp.applies and asks_for_every(intent))):
                return full("full-flat", sp.reason, budget_tokens=budget, units_in=len(units), spread=sp.spread,
                            analysis=analysis)  # the scores that were too flat: the inspector shows them
            out = self.rewriter.rewrite(tt, units, kept, source, label, analysis.outline, int(NAMES_SHARE * budget),
                                        pieces=analysis.pieces)
            overhead = approx_tokens(out.note) + marker_tokens(out.omitted) + names_tokens(out.names)
            kept_tokens = int(toks[kept].sum())
            omitted_ids = [i for r in out.omitted for i in r.unit_indices]
            us, ue = list(map(_START, units)), list(map(_END, units))
            lines = tt.lines

            def unit_text(i: int) -> str:
                return lines[us[i]] if ue[i] - us[i] == 1 else "".join(lines[us[i]:ue[i]])

            omitted_set = set(omitted_ids)
            recall = RecallSource(label, reps, tuple(zip(us, ue)), tuple(toks.tolist()),
                                  {i: unit_text(i) for i in omitted_ids},
                                  {i: unit_text(i) for i in range(len(units)) if i not in omitted_set},
                                  tuple(tt.line_tokens), tuple(ContentKind(u.kind).value for u in units),
                                  analysis.pieces.to_plain() if analysis.pieces is not None else ())
            _lap(ms, "rewrite", t)
            return CompressionOutcome("compressed", out.text, prompt_tokens, m_tok, budget, kept_tokens, overhead,
                                      len(units), len(kept), recall, ms, note, sp.spread, analysis, gutter,
                                      None if note is None else INSUFFICIENT_MIDDLE)
        except Exception as e:  # noqa: BLE001 - a failure here serves the message whole, never fails the request
            return full("full-error", f"{type(e).__name__}: {e}")

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
