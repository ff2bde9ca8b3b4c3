"""Recorded analyses: the unit scores every scorer gave every case, to study score fusion without the drafter.

A drafter pass over a 16K message costs about a minute here; comparing ways to fuse two scorers' relevance
must not repeat it for every candidate. So ``bench quality --dump-analyses FILE`` keeps what each scorer's
first-turn ``Compressor.compress`` call saw and decided, and the fusion is replayed on the real pipeline:

1. ``record(stage, row, sink, current)`` wraps a ``CompressStage``'s compressor: each cold call (no analysis
   passed in) appends an ``Analysed`` (case id from ``current["case"]``, row, the tokenized message, request,
   prompt tokens, units, pinned units, scores, mode). Recall turns do not call it; the study replays first turns.
2. ``save(path, sink, cases)`` pickles the records with the cases (their gold); ``load`` reads them back.
3. ``replay(a, case, scores, settings)`` runs ``Compressor.compress`` with stages 1-3 taken from the record and
   the given scores (budget, spread, rewrite are the product's own), puts the served text in place of the long
   message and checks the case's gold with ``check_retention``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pflash_proxy.bench.cases import Case, check_retention
from pflash_proxy.compress.gutter import bare_text, find_gutter
from pflash_proxy.compress.named import definition_blocks, definitions, named_definitions, outline
from pflash_proxy.compress.pipeline import (BLOCK_SEGMENTS, Analysis, CompressionOutcome, CompressionSettings,
                                            Compressor, code_atoms)
from pflash_proxy.compress.rewrite import Source
from pflash_proxy.compress.request import RequestSpec, without_paths
from pflash_proxy.compress.scores import LexicalScorer
from pflash_proxy.compress.routed import is_code
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import Unit

if TYPE_CHECKING:
    from pflash_proxy.stages.compress import CompressStage


@dataclass
class Analysed:
    case_id: str
    row: str
    tt: TokenizedText
    request: RequestSpec
    prompt_tokens: int
    in_conversation: bool
    source: str
    label: str
    units: list[Unit]
    pinned: set[int]
    scores: np.ndarray
    mode: str
    settings: CompressionSettings  # the proxy's (threshold, curve, fallback spread): the replay uses the same


def record(stage: CompressStage, row: str, sink: list[Analysed], current: dict[str, str]) -> None:
    """Step 1: wrap ``stage.compressor.compress`` so that its cold calls are appended to ``sink``."""
    compressor = stage.compressor
    inner = compressor.compress

    def compress(tt: TokenizedText, request: RequestSpec, prompt_tokens: int, in_conversation: bool, source: Source,
                 label: str = "", budget_adjust: int = 0, analysis: Analysis | None = None,
                 widen_room: int | None = None) -> CompressionOutcome:
        out = inner(tt, request, prompt_tokens, in_conversation, source, label, budget_adjust, analysis, widen_room)
        if analysis is None and out.analysis is not None:
            a = out.analysis
            sink.append(Analysed(current.get("case", "?"), row, tt, request, prompt_tokens, in_conversation,
                                 source, label, list(a.units), set(a.pinned), np.asarray(a.scores), out.mode,
                                 compressor.settings))
        return out

    compressor.compress = compress  # type: ignore[method-assign]  # this one instance's calls are recorded


def save(path: Path, sink: list[Analysed], cases: list[Case]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump({"analysed": sink, "cases": {c.case_id: c for c in cases}}, f)


def load(path: Path) -> tuple[list[Analysed], dict[str, Case]]:
    with open(path, "rb") as f:
        data = pickle.load(f)
    return data["analysed"], data["cases"]


@dataclass(frozen=True)
class Replayed:
    mode: str
    all_gold: bool
    kept_fraction: float


def replay(a: Analysed, case: Case, scores: np.ndarray, settings: CompressionSettings | None = None) -> Replayed:
    """Step 3: what the pipeline serves for ``a``'s message with ``scores``, and whether the gold is in it."""
    settings = settings or a.settings
    comp = Compressor(settings)
    # the request-side parts of stages 1-3 as the pipeline derives them: named definitions, blocks, the outline
    g = find_gutter(a.tt.lines)
    work = a.tt if g is None else bare_text(a.tt, g)
    defs = definitions(work)
    named, optional = named_definitions(work, a.units, without_paths(a.request.text), defs)
    blocks = tuple(definition_blocks(work, a.units, 2 * settings.max_segment, defs))
    code = is_code(a.units)
    # code: the atoms the pipeline selects by, ranked by BM25 over them for the lexical row's own scores
    reps = LexicalScorer().represent(work, a.units) if code and a.row == "pflash-lexical" and scores is a.scores \
        else None
    groups, ranks = code_atoms(work, a.units, defs, reps, without_paths(a.request.text) if code else a.request.text,
                               a.request.text, BLOCK_SEGMENTS * settings.max_segment, code)
    analysis = Analysis(units=a.units, pinned=a.pinned, reps=None,  # type: ignore[arg-type]
                        scores=np.asarray(scores, dtype=np.float64), stage_ms={}, gutter=None if g is None else g.form,
                        named=named, blocks=blocks, named_optional=optional,
                        outline=outline(work.lines, defs) if code else (), atoms=groups, atom_ranks=ranks)
    out = comp.compress(a.tt, a.request, a.prompt_tokens, a.in_conversation, a.source, a.label,  # type: ignore
                        analysis=analysis)
    msgs = case.turn_messages(0)
    idx = next(i for i, m in enumerate(msgs) if m.get("content") == a.tt.text)
    msgs[idx] = {**msgs[idx], "content": out.text}
    r = check_retention(case, msgs)
    return Replayed(out.mode, r.all_gold, r.kept_fraction)
