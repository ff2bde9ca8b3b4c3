"""In-process drafter and the three GGUF probes (segment probe, request probe, scorer head).

Importing this package does not import llama-cpp-python; ``runtime.Drafter`` does, when constructed.
See ``docs/probes.md`` for the file formats and the tap.
"""

from .probes import (SEED_DRAFTER_SHA256, SEED_TAP_BLOCK, ProbeError, ProbeFileError, ProbeMismatch,
                     load_request_probe, load_scorer_head, load_segment_probe)
from .segment import ProbeSegmenter

__all__ = ["SEED_DRAFTER_SHA256", "SEED_TAP_BLOCK", "ProbeError", "ProbeFileError", "ProbeMismatch",
           "ProbeSegmenter", "load_request_probe", "load_scorer_head", "load_segment_probe"]
