"""I/O-free compression stages of pflash-proxy (segment, request, score, budget, spread, rewrite, recall).

``Compressor`` (pipeline.py) runs them for one new long message; every stage is a small
typed class that can be replaced (``Segmenter``/``Scorer`` protocols) by the drafter-based
probes.
"""

from .budget import DEFAULT_CURVE, BudgetCurve, BudgetSelector, message_budget
from .kinds import ContentKind, detect_kind
from .pipeline import CompressionOutcome, CompressionSettings, Compressor
from .recall import Excerpt, RecallDecision, RecallGate, RecallSource, format_recall_block
from .request import RequestFinder, RequestSpec
from .rewrite import OmittedRange, Rewriter, Rewritten
from .scores import InvalidScores, LexicalScorer, Scorer, UnitReps, density, validate_scores
from .spread import Spread, relevance_spread
from .text import TokenizedText, approx_line_tokens, approx_tokens
from .units import CannotSegment, Segmenter, Unit, UnitSegmenter

__all__ = [
    "DEFAULT_CURVE", "BudgetCurve", "BudgetSelector", "CannotSegment", "CompressionOutcome", "CompressionSettings",
    "Compressor", "ContentKind", "Excerpt", "InvalidScores", "LexicalScorer", "OmittedRange", "RecallDecision",
    "RecallGate", "RecallSource", "RequestFinder", "RequestSpec", "Rewriter", "Rewritten", "Scorer", "Segmenter",
    "Spread", "TokenizedText", "Unit", "UnitReps", "UnitSegmenter", "approx_line_tokens", "approx_tokens",
    "density", "detect_kind", "format_recall_block", "message_budget", "relevance_spread",
    "validate_scores",
]
