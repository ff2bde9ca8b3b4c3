"""The scorer registry (``SCORERS``) and ``build_scorer``: the scorer and segmenter ``--scorer``, ``--segmenter``
and ``--drafter`` ask for.

``SCORERS`` is the one list of scorers: the values ``--scorer`` accepts (``check_scorer``, the command line's
choices), the ``--help`` text, ``build_scorer`` and ``bench quality`` all read it. An entry (``ScorerEntry``) declares, typed:

- ``needs`` (``Needs``): a drafter (``--drafter``), the trained scorer head (``--scoring-head``, with
  ``--request-probe`` when given, or the set shipped for the drafter), the attention scorer (over
  ``--attention-heads``), and whether the head reads the probe taps in a pass of its own (``ProbeTaps``);
- ``spread``: its flat gate's thresholds by prompt tokens (``compress.spread.SpreadCurve``);
- ``build``: a function of the loaded parts (``ScorerParts``) returning the ``Scorer``; the scorer itself lives in
  its own module.

``ScorerKit`` loads the parts an entry needs from one drafter, each once: ``build_scorer`` makes one per start,
``bench quality`` one for all its rows (so the rows share the drafter and the attention scorer's content keys).
Nothing else decides what a scorer needs, so a new scorer is its own module plus one entry here.

Start-up (``build_scorer``):
1. A scorer that needs no drafter and the ``heuristic`` segmenter: nothing is loaded (the model-free default).
2. Anything else needs ``--drafter`` (llama-cpp-python, loaded once, on its own worker thread).
3. Unset probe paths come from the set the package ships for this very drafter (``drafter/trained``, matched by
   sha256), unless the user gave any of them (a given set is never mixed with a shipped file). Every file is
   checked against the drafter's sha256 and reads the tap block its file names.
   ``--attention-heads auto`` takes the retrieval heads from a one-off calibration cached by the drafter's sha256
   (``drafter/calibrate.py``; a shipped set carries its heads, so it does not run for those drafters).
4. The default drafter scorer (``auto``, chosen by ``config`` when ``--drafter`` is given without ``--scorer``)
   needs a trained head; with none given or shipped it falls back to ``attention`` (a log line). An explicit
   ``--scorer`` never changes.
5. Any missing, corrupt or mismatched file raises ``DrafterSetupError`` with one line naming the option, so
   start-up stops with a clear message instead of serving with a different configuration than asked.
This module imports nothing of the project at import time (the command line imports it for ``--help``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pflash_proxy.jsontypes import JSONObject
    from pflash_proxy.stats import ScoringStats
    from pflash_proxy.compress.scores import Scorer
    from pflash_proxy.compress.units import Segmenter
    from pflash_proxy.config import Settings
    from pflash_proxy.drafter.attention import AttentionScorer
    from pflash_proxy.drafter.probes import RequestProbe, ScorerHeadWeights, SegmentProbe
    from pflash_proxy.drafter.runtime import Drafter
    from pflash_proxy.drafter.taps import ProbeTaps

log = logging.getLogger("pflash_proxy.drafter")

SEED_SPREAD = "0.11"  # the seed's flat threshold, at every prompt length
# The flat gate's thresholds of every registered scorer. The gate reads BM25 of the request's every-clause
# whatever the scorer (``pipeline.gate_scores``), so a scorer changes only ``k``, the units its budget keeps.
# Calibrated with lexical on the train split of the flat-gate sets at 4K, 16K and 32K (docs/results.md, flat gate).
# The drafter scorers' own rows there are 4K cases of index 0 only (4 train, 4 test); the thresholds chosen on
# those (0.15-1.0 at every length) served an estimated 0-33 of 48 "list every X" at 16K and 32K whole (lexical
# gate scores and k under them); under this curve their measured 4K test rows are all served right
# (docs/results.md, flat gate, which also says how much a drafter's own k moves the estimate).
GATE_SPREAD = "4096:0 16384:-0.314 32768:-0.169"


class DrafterSetupError(Exception):
    """A scorer or segmenter that cannot be built as configured; the message names the option."""


def check_scorer(name: str) -> None:
    """``DrafterSetupError`` (one line naming ``scorer``) unless ``name`` is a registered scorer."""
    if name not in SCORERS:
        raise DrafterSetupError(f"scorer: unknown scorer {name!r} (one of {', '.join(SCORER_NAMES)})")


@dataclass(frozen=True)
class Needs:
    """What a scorer is built from (``ScorerKit.parts`` loads exactly these)."""

    drafter: bool = True  # a drafter model (--drafter)
    scoring_head: bool = False  # the trained scorer head and, when given or shipped, the request probe
    attention: bool = False  # the attention scorer over --attention-heads (calibrated with ``auto``)
    head_taps: bool = False  # the head reads the probe taps in a pass of its own (``ProbeTaps``)


@dataclass
class ScorerParts:
    """The loaded parts an entry's ``build`` reads; each is None unless the entry's ``Needs`` asked for it."""

    attention: AttentionScorer | None = None
    head: ScorerHeadWeights | None = None
    request: RequestProbe | None = None
    taps: ProbeTaps | None = None

    def need_attention(self) -> AttentionScorer:
        if self.attention is None:
            raise ValueError("this scorer needs the attention scorer (Needs.attention)")
        return self.attention

    def need_head(self) -> ScorerHeadWeights:
        if self.head is None:
            raise ValueError("this scorer needs the trained scorer head (Needs.scoring_head)")
        return self.head

    def need_taps(self) -> ProbeTaps:
        if self.taps is None:
            raise ValueError("this scorer needs the probe taps (Needs.head_taps)")
        return self.taps


@dataclass(frozen=True)
class ScorerEntry:
    name: str
    help: str  # for --help
    build: Callable[[ScorerParts], Scorer]
    needs: Needs = Needs()
    spread: str = SEED_SPREAD  # the flat gate's threshold by prompt tokens (``compress.spread.SpreadCurve``)


def _lexical(parts: ScorerParts) -> Scorer:
    from pflash_proxy.compress import LexicalScorer

    return LexicalScorer()


def _attention(parts: ScorerParts) -> Scorer:
    from pflash_proxy.compress.links import Linked

    return Linked(parts.need_attention())


def _hybrid(parts: ScorerParts) -> Scorer:
    from pflash_proxy.compress.fusion import hybrid
    from pflash_proxy.compress.links import Linked

    return Linked(hybrid(parts.need_attention()))


def _head(parts: ScorerParts) -> Scorer:
    from pflash_proxy.drafter.head import HeadScorer

    return HeadScorer(parts.need_taps(), parts.need_head(), parts.request)


def _head_attention(parts: ScorerParts) -> Scorer:
    from pflash_proxy.compress.links import Linked
    from pflash_proxy.drafter.joint import HeadAttentionScorer

    return Linked(HeadAttentionScorer(parts.need_attention(), parts.need_head(), parts.request))


def _auto(parts: ScorerParts) -> Scorer:
    from pflash_proxy.compress import LexicalScorer
    from pflash_proxy.compress.routed import RoutedScorer

    return RoutedScorer(LexicalScorer(), _head_attention(parts))


_HEAD_AND_ATTENTION = Needs(scoring_head=True, attention=True)

# The registry: a new scorer is one entry here plus its own module.
SCORERS: dict[str, ScorerEntry] = {e.name: e for e in (
    ScorerEntry("lexical", "BM25, model-free", _lexical, Needs(drafter=False), spread=GATE_SPREAD),
    # the drafter scorers: the same curve (GATE_SPREAD: the gate's scores are BM25's for them too)
    ScorerEntry("attention", "the drafter's retrieval heads, training-free; needs --drafter", _attention,
                Needs(attention=True), spread=GATE_SPREAD),
    ScorerEntry("hybrid", "lexical and attention fused; needs --drafter", _hybrid,
                Needs(attention=True), spread=GATE_SPREAD),
    ScorerEntry("head", "trained probe files: shipped for gemma-3-270m, or from `pflash-proxy train`", _head,
                Needs(scoring_head=True, head_taps=True), spread=GATE_SPREAD),
    ScorerEntry("head-attention", "the head and attention fused, from one drafter pass", _head_attention,
                _HEAD_AND_ATTENTION, spread=GATE_SPREAD),
    ScorerEntry("auto", "code by lexical (no drafter pass), everything else by head-attention", _auto,
                _HEAD_AND_ATTENTION, spread=GATE_SPREAD),
)}
SCORER_NAMES: tuple[str, ...] = tuple(SCORERS)
DRAFTER_SCORERS: tuple[str, ...] = tuple(n for n, e in SCORERS.items() if e.needs.drafter)  # need a --drafter


def default_spread(name: str) -> str:
    """The flat gate's thresholds for the scorer named ``name`` (its registry entry; the seed's 0.11 for a scorer
    the registry does not know, such as a plug-in)."""
    entry = SCORERS.get(name)
    return entry.spread if entry is not None else SEED_SPREAD


def scorer_help() -> str:
    """The ``--scorer`` help text, from the registry."""
    names = "; ".join(f"{e.name} ({e.help})" for e in SCORERS.values())
    return (f"unit relevance: {names}; default lexical, or with --drafter and no --scorer auto (attention for a "
            "drafter without a shipped or given head)")


@dataclass(frozen=True)
class ProbeFiles:
    """The probe files given (``--segment-probe``, ``--scoring-head``, ``--request-probe``), or None each."""

    segment_probe: Path | None = None
    scoring_head: Path | None = None
    request_probe: Path | None = None

    def with_packaged(self, drafter: Path, hash_cache: Path, scoring_head: bool, segment_probe: bool
                      ) -> ProbeFiles:
        """Unset paths that are wanted, from the set shipped for this very drafter (``drafter/trained``), if any.
        Files given by the user are one set: a shipped file is never mixed into it."""
        wanted = {"segment_probe": segment_probe, "scoring_head": scoring_head, "request_probe": scoring_head}
        if any(getattr(self, k) is not None for k in wanted):
            return self
        missing = [k for k, want in wanted.items() if want]
        if not missing or not drafter.is_file():
            return self
        from pflash_proxy.drafter.trained import for_drafter_file

        found = for_drafter_file(drafter, hash_cache)
        if found is None:
            return self
        log.info("using the packaged probes trained for this drafter: %s", {k: str(found[k]) for k in missing})
        paths = {k: found[k] for k in missing}
        return ProbeFiles(paths.get("segment_probe"), paths.get("scoring_head"), paths.get("request_probe"))


@dataclass
class ScorerKit:
    """The parts of the registry's scorers, loaded from one drafter as entries ask for them, each once.

    ``attention_heads``: ``auto`` (calibrated, cached in ``home``), ``all`` (every head of the global layers) or a
    list such as ``5.0,11.2``. Every attention scorer of one kit shares its content keys. Raises
    ``DrafterSetupError`` for a missing or mismatched file."""

    drafter: Drafter
    home: Path
    files: ProbeFiles = ProbeFiles()
    attention_heads: str = "auto"
    _attention: dict[str, AttentionScorer] = field(default_factory=dict, repr=False)
    _head: tuple[ScorerHeadWeights, RequestProbe | None] | None = field(default=None, repr=False)
    _taps: dict[int, ProbeTaps] = field(default_factory=dict, repr=False)

    @property
    def hash_cache(self) -> Path:
        return self.home / "drafter-hashes.json"

    def scorer(self, name: str, attention_heads: str | None = None) -> Scorer:
        """The scorer ``--scorer NAME`` serves (with ``--attention-heads``, or this kit's)."""
        entry = SCORERS.get(name)
        if entry is None or not entry.needs.drafter:
            raise ValueError(f"not a drafter scorer: {name!r} (one of {', '.join(DRAFTER_SCORERS)})")
        return entry.build(self.parts(entry, attention_heads))

    def parts(self, entry: ScorerEntry, attention_heads: str | None = None) -> ScorerParts:
        n = entry.needs
        head, request = self.head(entry.name) if n.scoring_head else (None, None)
        return ScorerParts(attention=self.attention(attention_heads) if n.attention else None, head=head,
                           request=request, taps=self.taps(head.meta.tap_block) if head and n.head_taps else None)

    def attention(self, heads: str | None = None) -> AttentionScorer:
        spec = self.attention_heads if heads is None else heads
        got = self._attention.get(spec)
        if got is not None:
            return got
        from pflash_proxy.config import parse_heads
        from pflash_proxy.drafter.attention import AttentionScorer

        base = self._attention.get("all")
        if base is None:
            base = self._attention["all"] = AttentionScorer(self.drafter)
        if spec == "auto":
            from pflash_proxy.drafter.calibrate import calibrated

            got = calibrated(base, self.home, self.hash_cache)
        elif spec != "all":
            got = AttentionScorer(self.drafter, heads=parse_heads(spec), keys=base.keys)
        self._attention[spec] = got = got or base
        return got

    def head(self, scorer: str) -> tuple[ScorerHeadWeights, RequestProbe | None]:
        if self._head is None:
            from pflash_proxy.drafter import ProbeError, load_request_probe, load_scorer_head

            if self.files.scoring_head is None:
                raise DrafterSetupError(f"scoring_head: --scorer {scorer} needs --scoring-head PATH "
                                        "(PFLASH_SCORING_HEAD_GGUF)")
            try:
                head = load_scorer_head(self.files.scoring_head, self.drafter.path, hash_cache=self.hash_cache)
                request = None if self.files.request_probe is None else load_request_probe(
                    self.files.request_probe, self.drafter.path, hash_cache=self.hash_cache)
            except ProbeError as exc:
                raise DrafterSetupError(str(exc)) from exc
            self._head = (head, request)
        return self._head

    def segment_probe(self) -> SegmentProbe:
        from pflash_proxy.drafter import ProbeError, load_segment_probe

        if self.files.segment_probe is None:
            raise DrafterSetupError("segment_probe: --segmenter probe needs --segment-probe PATH "
                                    "(PFLASH_SEGMENT_PROBE_GGUF)")
        try:
            return load_segment_probe(self.files.segment_probe, self.drafter.path, hash_cache=self.hash_cache)
        except ProbeError as exc:
            raise DrafterSetupError(str(exc)) from exc

    def taps(self, block: int) -> ProbeTaps:
        """One tap reader per block, so the segment probe and the head share a pass when they read one block."""
        got = self._taps.get(block)
        if got is None:
            from pflash_proxy.drafter.taps import ProbeTaps

            got = self._taps[block] = ProbeTaps(self.drafter, block)
        return got


@dataclass
class Scoring:
    """What ``build_scorer`` built: None for the heuristic segmenter and the lexical scorer."""

    segmenter: Segmenter | None = None
    scorer: Scorer | None = None
    drafter: Drafter | None = None

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()

    def stats(self) -> ScoringStats:
        """What scores: the segmenter, the scorer, the heads an attention scorer reads, the drafter's passes."""
        from pflash_proxy.stats import DrafterStats, ScoringStats

        heads = getattr(self.scorer, "heads", getattr(getattr(self.scorer, "second", None), "heads", "n/a"))
        drafter = None
        if self.drafter is not None:
            d = self.drafter.stats
            drafter = DrafterStats(self.drafter.path, int(d["passes"]), int(d["tokens"]), d["seconds"],
                                   int(d["cache_hits"]), int(d["aborts"]))
        return ScoringStats(getattr(self.segmenter, "name", "heuristic"), getattr(self.scorer, "name", "lexical"),
                            # the attention scorer, alone or fused: which heads it reads (None = all)
                            None if heads in ("n/a", None) else [f"{L}.{h}" for L, h in sorted(heads)],
                            reads_heads=heads != "n/a", drafter=drafter)

    def describe(self) -> JSONObject:
        """``stats`` as JSON, for the start-up log."""
        return self.stats().as_json()


def build_scorer(settings: Settings) -> Scoring:
    """The segmenter and scorer the settings ask for, with the drafter they read (``Scoring.close`` closes it)."""
    c, d = settings.compression, settings.drafter
    check_scorer(c.scorer)
    entry = SCORERS[c.scorer]
    if not entry.needs.drafter and c.segmenter == "heuristic":
        if d.path is not None:
            log.info("--drafter given but --scorer %s and --segmenter heuristic need no drafter; not loading it",
                     c.scorer)
        return Scoring()
    if d.path is None:
        raise DrafterSetupError(f"drafter: --scorer {c.scorer} / --segmenter {c.segmenter} need --drafter PATH "
                                "(PFLASH_DRAFTER_GGUF)")
    from pflash_proxy.drafter.runtime import Drafter, DrafterError
    from pflash_proxy.drafter.taps import DrafterSegmenter

    home = settings.proxy.home
    files = ProbeFiles(d.segment_probe, d.scoring_head, d.request_probe)
    files = files.with_packaged(d.path, home / "drafter-hashes.json", entry.needs.scoring_head,
                                c.segmenter == "probe")
    try:
        drafter = Drafter(d.path, n_ctx=d.drafter_ctx, n_threads=d.drafter_threads, n_gpu_layers=d.drafter_gpu_layers,
                          timeout=d.drafter_timeout_s, cache_mb=d.drafter_cache_mb)
    except DrafterError as exc:
        raise DrafterSetupError(f"drafter: cannot load {d.path}: {exc}") from exc
    built = Scoring(drafter=drafter)
    entry = _default_scorer_for_this_drafter(settings, entry, files)  # after the load: a bad drafter is one line
    kit = ScorerKit(drafter, home, files, d.attention_heads)
    try:
        if c.segmenter == "probe":
            probe = kit.segment_probe()
            built.segmenter = DrafterSegmenter(kit.taps(probe.meta.tap_block), probe)
        if entry.needs.drafter:
            built.scorer = entry.build(kit.parts(entry))
    except (DrafterSetupError, DrafterError) as exc:
        drafter.close()
        raise DrafterSetupError(str(exc)) from exc
    log.info("scorer and segmenter: %s", built.describe())
    return built


def drafter_scorer(name: str, attention: AttentionScorer | None, head: ScorerHeadWeights | None = None,
                   request: RequestProbe | None = None, taps: ProbeTaps | None = None) -> Scorer:
    """The scorer ``--scorer NAME`` serves, from parts loaded by the caller (the benchmarks' scripts that load
    them their own way); the registry entry builds it, as ``build_scorer`` does."""
    entry = SCORERS.get(name)
    if entry is None or not entry.needs.drafter:
        raise ValueError(f"not a drafter scorer: {name!r} (one of {', '.join(DRAFTER_SCORERS)})")
    return entry.build(ScorerParts(attention, head, request, taps))


def _default_scorer_for_this_drafter(settings: Settings, entry: ScorerEntry, files: ProbeFiles) -> ScorerEntry:
    """The default drafter scorer (auto: head-attention for everything but code) needs a scorer head trained for
    this drafter. With none given or shipped, a defaulted scorer is ``attention`` (training-free); an explicit
    ``--scorer auto`` or ``head-attention`` still stops at the missing file."""
    if not entry.needs.scoring_head or "scorer" in settings.compression.model_fields_set \
            or files.scoring_head is not None:
        return entry
    log.warning("no scorer head is shipped or given for this drafter (%s): scoring with --scorer attention; "
                "`pflash-proxy train --drafter %s --out DIR` trains one for --scorer head-attention",
                settings.drafter.path, settings.drafter.path)
    return SCORERS["attention"]
