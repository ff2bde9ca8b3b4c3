"""The scorer registry (``SCORERS``) and ``build_scorer``: the scorer and segmenter ``--scorer``, ``--segmenter``
and ``--drafter`` ask for.

``SCORERS`` is the one list of scorers: the values ``--scorer`` accepts (``check_scorer``, the command line's
choices), the ``--help`` text and ``build_scorer`` all read it. An entry says what the scorer needs (a drafter,
the trained scorer head, the attention scorer, the probe taps) and builds it from those parts (``ScorerParts``);
the scorer itself lives in its own module.

1. ``lexical`` scorer and ``heuristic`` segmenter need nothing: the model-free default.
2. Anything else needs ``--drafter`` (llama-cpp-python, loaded once here, on its own worker thread).
3. ``--segmenter probe`` needs ``--segment-probe``; a scorer that reads the head needs ``--scoring-head`` (and uses
   ``--request-probe`` when given). When none of the three is given, they come from the set the package ships
   for this very drafter (``drafter/trained``, matched by sha256: gemma-3-270m Q4_K_M), so those need no
   download. All are checked against the drafter's sha256 and read the tap block their file names.
   ``--scorer attention`` needs only the drafter (training-free, global-attention layers); with
   ``--attention-heads auto`` its retrieval heads come from a one-off calibration cached by the drafter's sha256
   (``drafter/calibrate.py``, at the first start only; the gemma-3-270m set ships its heads, so it never runs
   for the embedded default).
   ``--scorer hybrid`` fuses the lexical scorer and that attention scorer (``compress/fusion.py``);
   ``--scorer head-attention`` fuses the head and that attention scorer, read from one pass (``drafter/joint.py``);
   ``--scorer auto``, the default with a drafter, scores a message that is mostly code with ``lexical`` (no
   drafter pass) and everything else with ``head-attention`` (``compress/routed.py``); defaulted, it falls back to
   ``attention`` when no head exists for the drafter (a log line).
   The three drafter scorers (attention, hybrid, head-attention) follow reference hops from their top units
   (``compress/links.py``).
4. Any missing, corrupt or mismatched file raises ``DrafterSetupError`` with one line naming the option, so
   start-up stops with a clear message instead of serving with a different configuration than asked.
This module imports nothing of the project at import time (the command line imports it for ``--help``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pflash_proxy.config import Settings

log = logging.getLogger("pflash_proxy.drafter")


@dataclass
class ScorerParts:
    """What a drafter scorer is built from: ``attention`` (an ``AttentionScorer``, calibrated or not), the scorer
    ``head`` and ``request`` probe, the ``ProbeTaps`` (tap reader) that ``head`` reads through."""

    attention: Any = None
    head: Any = None
    request: Any = None
    taps: Any = None


@dataclass(frozen=True)
class ScorerEntry:
    name: str
    help: str  # for --help
    build: Callable[[ScorerParts], Any]
    drafter: bool = True  # needs --drafter
    head: bool = False  # reads the trained scorer head (--scoring-head, or the set shipped for the drafter)
    attention: bool = False  # reads the attention scorer (--attention-heads)
    taps: bool = False  # reads the head through the probe taps (ProbeTaps), not in its own pass
    spread: str = "0.11"  # the flat gate's threshold by prompt tokens (``compress.spread.SpreadCurve``): the seed's 0.11


def _lexical(parts: ScorerParts) -> Any:
    from pflash_proxy.compress import LexicalScorer

    return LexicalScorer()


def _attention(parts: ScorerParts) -> Any:
    from pflash_proxy.compress.links import Linked

    return Linked(parts.attention)


def _hybrid(parts: ScorerParts) -> Any:
    from pflash_proxy.compress.fusion import hybrid
    from pflash_proxy.compress.links import Linked

    return Linked(hybrid(parts.attention))


def _head(parts: ScorerParts) -> Any:
    from pflash_proxy.drafter.head import HeadScorer

    return HeadScorer(parts.taps, parts.head, parts.request)


def _head_attention(parts: ScorerParts) -> Any:
    from pflash_proxy.compress.links import Linked
    from pflash_proxy.drafter.joint import HeadAttentionScorer

    return Linked(HeadAttentionScorer(parts.attention, parts.head, parts.request))


def _auto(parts: ScorerParts) -> Any:
    from pflash_proxy.compress import LexicalScorer
    from pflash_proxy.compress.routed import RoutedScorer

    return RoutedScorer(LexicalScorer(), _head_attention(parts))


# The registry: a new scorer is one entry here plus its own module.
SCORERS: dict[str, ScorerEntry] = {e.name: e for e in (
    # lexical's flat thresholds: calibrated on the train split of benchmarks/flat_gate (reported/flat-gate/)
    ScorerEntry("lexical", "BM25, model-free", _lexical, drafter=False, spread="4096:0.156 16384:0.015 32768:0.023"),
    ScorerEntry("attention", "the drafter's retrieval heads, training-free; needs --drafter", _attention,
                attention=True),
    ScorerEntry("hybrid", "lexical and attention fused; needs --drafter", _hybrid, attention=True),
    ScorerEntry("head", "trained probe files: shipped for gemma-3-270m, or from `pflash-proxy train`", _head,
                head=True, taps=True),
    ScorerEntry("head-attention", "the head and attention fused, from one drafter pass", _head_attention,
                head=True, attention=True),
    ScorerEntry("auto", "code by lexical (no drafter pass), everything else by head-attention", _auto,
                head=True, attention=True),
)}
SCORER_NAMES: tuple[str, ...] = tuple(SCORERS)
DRAFTER_SCORERS: tuple[str, ...] = tuple(n for n, e in SCORERS.items() if e.drafter)  # need a --drafter


def default_spread(name: str) -> str:
    """The flat gate's thresholds for the scorer named ``name`` (its registry entry; the seed's 0.11 for a scorer
    the registry does not know, such as a plug-in)."""
    entry = SCORERS.get(name)
    return entry.spread if entry is not None else "0.11"


def scorer_help() -> str:
    """The ``--scorer`` help text, from the registry."""
    names = "; ".join(f"{e.name} ({e.help})" for e in SCORERS.values())
    return (f"unit relevance: {names}; default lexical, or with --drafter and no --scorer the bench's winner, "
            "auto (attention for a drafter without a shipped or given head)")


class DrafterSetupError(Exception):
    pass


def check_scorer(name: str) -> None:
    """``DrafterSetupError`` (one line naming ``scorer``) unless ``name`` is a registered scorer."""
    if name not in SCORERS:
        raise DrafterSetupError(f"scorer: unknown scorer {name!r} (one of {', '.join(SCORER_NAMES)})")


@dataclass
class Scoring:
    segmenter: Any = None  # None → the heuristic UnitSegmenter
    scorer: Any = None  # None → LexicalScorer
    drafter: Any = None

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"segmenter": getattr(self.segmenter, "name", "heuristic"),
                               "scorer": getattr(self.scorer, "name", "lexical")}
        heads = getattr(self.scorer, "heads", getattr(getattr(self.scorer, "second", None), "heads", "n/a"))
        if heads != "n/a":  # the attention scorer, alone or fused: which heads it reads (None = all)
            out["attention_heads"] = None if heads is None else [f"{L}.{h}" for L, h in sorted(heads)]
        if self.drafter is not None:
            out["drafter"] = {"path": self.drafter.path, **self.drafter.stats}
        return out


def build_scorer(settings: Settings) -> Scoring:
    """The segmenter and scorer the settings ask for, with the drafter they read (``Scoring.close`` closes it)."""
    check_scorer(settings.compression.scorer)
    wants_drafter = SCORERS[settings.compression.scorer].drafter or settings.compression.segmenter != "heuristic"
    if not wants_drafter:
        if settings.drafter.path is not None:
            log.info("--drafter given but --scorer lexical and --segmenter heuristic need no drafter; not loading it")
        return Scoring()
    if settings.drafter.path is None:
        raise DrafterSetupError(f"drafter: --scorer {settings.compression.scorer} / --segmenter "
                                f"{settings.compression.segmenter} need --drafter PATH (PFLASH_DRAFTER_GGUF)")
    from pflash_proxy.drafter import ProbeError, load_request_probe, load_scorer_head, load_segment_probe
    from pflash_proxy.drafter.runtime import Drafter, DrafterError
    from pflash_proxy.drafter.taps import DrafterSegmenter, ProbeTaps

    hash_cache = settings.proxy.home / "drafter-hashes.json"
    settings = _with_packaged_probes(settings, hash_cache)
    d = settings.drafter
    assert d.path is not None  # checked above; the packaged probes never unset it
    try:
        drafter = Drafter(d.path, n_ctx=d.drafter_ctx, n_threads=d.drafter_threads, n_gpu_layers=d.drafter_gpu_layers,
                          timeout=d.drafter_timeout_s, cache_mb=d.drafter_cache_mb)
    except DrafterError as exc:
        raise DrafterSetupError(f"drafter: cannot load {settings.drafter.path}: {exc}") from exc
    built = Scoring(drafter=drafter)
    settings = _default_scorer_for_this_drafter(settings)  # after the load: a drafter that cannot load is one line
    entry = SCORERS[settings.compression.scorer]
    try:
        probe = head = request = None
        try:
            if settings.compression.segmenter == "probe":
                if settings.drafter.segment_probe is None:
                    raise DrafterSetupError("segment_probe: --segmenter probe needs --segment-probe PATH "
                                            "(PFLASH_SEGMENT_PROBE_GGUF)")
                probe = load_segment_probe(settings.drafter.segment_probe, settings.drafter.path, hash_cache=hash_cache)
            if entry.head:
                if settings.drafter.scoring_head is None:
                    raise DrafterSetupError(f"scoring_head: --scorer {settings.compression.scorer} needs "
                                            "--scoring-head PATH (PFLASH_SCORING_HEAD_GGUF)")
                head = load_scorer_head(settings.drafter.scoring_head, settings.drafter.path, hash_cache=hash_cache)
                if settings.drafter.request_probe is not None:
                    request = load_request_probe(settings.drafter.request_probe, settings.drafter.path,
                                                 hash_cache=hash_cache)
        except ProbeError as exc:
            raise DrafterSetupError(str(exc)) from exc
        # the segment probe and --scorer head read the tap block through ProbeTaps; head-attention reads its
        # taps in its own pass
        reader = probe if probe is not None else head if entry.taps else None
        taps = ProbeTaps(drafter, reader.meta.tap_block) if reader is not None else None
        if probe is not None:
            assert taps is not None  # the probe is the reader
            built.segmenter = DrafterSegmenter(taps, probe)
        if entry.drafter:
            attention = _attention_scorer(settings, drafter, hash_cache) if entry.attention else None
            built.scorer = entry.build(ScorerParts(attention, head, request, taps))
    except (DrafterSetupError, DrafterError) as exc:
        drafter.close()
        raise DrafterSetupError(str(exc)) from exc
    log.info("scorer and segmenter: %s", built.describe())
    return built


def drafter_scorer(name: str, attention: Any, head: Any = None, request: Any = None, taps: Any = None) -> Any:
    """The scorer ``--scorer NAME`` serves, from its parts (``ScorerParts``). One place, so ``bench quality``
    measures exactly what the proxy serves (reference hops included)."""
    entry = SCORERS.get(name)
    if entry is None or not entry.drafter:
        raise ValueError(f"not a drafter scorer: {name!r} (one of {', '.join(DRAFTER_SCORERS)})")
    return entry.build(ScorerParts(attention, head, request, taps))


def _with_packaged_probes(settings: Settings, hash_cache: Any) -> Settings:
    """Fill unset probe paths from the set shipped for this very drafter (``drafter/trained``), if any."""
    heads = SCORERS[settings.compression.scorer].head
    wanted = {"segment_probe": settings.compression.segmenter == "probe", "scoring_head": heads, "request_probe": heads}
    missing = [k for k, want in wanted.items() if want and getattr(settings.drafter, k) is None]
    if any(getattr(settings.drafter, k) is not None for k in wanted):
        return settings  # files given by the user are one set: never mix a shipped file into it
    if not missing or settings.drafter.path is None or not settings.drafter.path.is_file():
        return settings
    from pflash_proxy.drafter.trained import for_drafter_file

    found = for_drafter_file(settings.drafter.path, hash_cache)
    if found is None:
        return settings
    log.info("using the packaged probes trained for this drafter: %s", {k: str(found[k]) for k in missing})
    return settings.with_options(**{k: found[k] for k in missing})


def _default_scorer_for_this_drafter(settings: Settings) -> Settings:
    """The default drafter scorer (auto: head-attention for everything but code) needs a scorer head trained for
    this drafter. With none given or shipped, a defaulted scorer is ``attention`` (training-free); an explicit
    ``--scorer auto`` or ``head-attention`` still stops at the missing file."""
    if settings.compression.scorer != "auto" or "scorer" in settings.compression.model_fields_set \
            or settings.drafter.scoring_head is not None:
        return settings
    log.warning("no scorer head is shipped or given for this drafter (%s): scoring with --scorer attention; "
                "`pflash-proxy train --drafter %s --out DIR` trains one for --scorer head-attention",
                settings.drafter.path, settings.drafter.path)
    return settings.with_options(scorer="attention")


def _attention_scorer(settings: Settings, drafter: Any, hash_cache: Any) -> Any:
    from pflash_proxy.config import parse_heads
    from pflash_proxy.drafter.attention import AttentionScorer

    if settings.drafter.attention_heads == "all":
        return AttentionScorer(drafter)
    if settings.drafter.attention_heads != "auto":
        return AttentionScorer(drafter, heads=parse_heads(settings.drafter.attention_heads))
    from pflash_proxy.drafter.calibrate import calibrated

    return calibrated(AttentionScorer(drafter), settings.proxy.home, hash_cache)
