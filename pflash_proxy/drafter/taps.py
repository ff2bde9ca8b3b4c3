"""The drafter's probe taps and the glue to the compression interfaces (``Segmenter``, ``Scorer``).

1. ``ProbeTaps.draft(text)`` tokenizes a message with the drafter, maps every drafter token to the message's
   line (``segment.token_lines`` on the pieces' byte offsets) and runs ONE pass that yields the tap of block K
   for every token. The pass uses a session key (sha1 of the text unless given), so the drafter keeps its KV
   state for follow-ups; the taps of the last few messages are memoised here (``keep`` entries), so the
   segmenter and the scorer share one pass.
2. ``DrafterSegmenter.segment(tt, kind)`` (``Segmenter`` protocol): segment probe forward on the taps ->
   ``ProbeSegmenter`` units; their token counts are taken from ``tt`` (the upstream tokenizer's exact counts).
   Fewer than two units -> ``CannotSegment`` (the message is served whole).
3. ``make_reps``: the scorers' ``UnitReps`` (``compress.scores``, its stored format) in the current version.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from pflash_proxy.compress.scores import REPS_VERSION, UnitReps
from pflash_proxy.compress.units import CannotSegment

from .probes import SegmentProbe
from .runtime import Drafter, DrafterError
from .segment import ProbeSegmenter, count_lines, token_lines

if TYPE_CHECKING:
    from pflash_proxy.compress.kinds import ContentKind
    from pflash_proxy.compress.text import TokenizedText
    from pflash_proxy.compress.units import Unit


def make_reps(scorer: str, unit_tokens: Sequence[int], payload: Any) -> UnitReps:
    arr = np.asarray(unit_tokens, dtype=np.int64)
    return UnitReps(scorer=scorer, n_units=len(arr), unit_tokens=arr, payload=payload, version=REPS_VERSION)


@dataclass(frozen=True)
class DraftedText:
    text: str
    session: str
    tokens: np.ndarray  # drafter token ids, no BOS
    token_line: np.ndarray  # line of each token
    n_lines: int
    tap: np.ndarray  # (tokens, d) float32


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class ProbeTaps:
    """Owns the per-message drafter pass shared by the probe segmenter and the head/attention scorers."""

    def __init__(self, drafter: Drafter, tap_block: int, keep: int = 2) -> None:
        if not 0 <= tap_block < drafter.n_layer - 1:
            raise DrafterError(f"tap block {tap_block} does not fit a {drafter.n_layer}-block drafter")
        self.drafter, self.tap_block, self.keep = drafter, tap_block, keep
        self._memo: OrderedDict[str, DraftedText] = OrderedDict()

    def tokens(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        toks = self.drafter.tokenize(text)
        return toks, token_lines(self.drafter.token_starts(text, toks), text)

    def draft(self, text: str, session: str | None = None) -> DraftedText:
        key = session or text_key(text)
        hit = self._memo.get(key)
        if hit is not None and hit.text == text:
            self._memo.move_to_end(key)
            return hit
        toks, tl = self.tokens(text)
        self.drafter.forget(key)  # a memo miss means a cold pass: the tap of every token is needed
        r = self.drafter.trace(toks, session=key, taps=(self.tap_block,))
        d = DraftedText(text, key, toks, tl, count_lines(text), r.taps[self.tap_block])
        self._memo[key] = d
        while len(self._memo) > self.keep:
            self._memo.popitem(last=False)
        return d


class DrafterSegmenter:
    """``Segmenter`` protocol on top of the segment probe."""

    name = "probe"

    def __init__(self, taps: ProbeTaps, probe: SegmentProbe) -> None:
        if probe.meta.tap_block != taps.tap_block or probe.meta.d != taps.drafter.n_embd:
            raise DrafterError(f"segment probe reads block {probe.meta.tap_block} width {probe.meta.d}, drafter "
                               f"taps block {taps.tap_block} width {taps.drafter.n_embd}")
        self.taps, self.probe = taps, probe
        self.segmenter = ProbeSegmenter.from_probe(probe)

    @property
    def max_segment(self) -> int:
        """The probe's largest unit, in tokens (``Segmenter``)."""
        return self.segmenter.max_segment

    def segment(self, tt: TokenizedText, kind: ContentKind | None = None) -> list[Unit]:
        from .segment import make_unit
        d = self.taps.draft(tt.text)
        logits = self.probe.forward(d.tap)
        raw = self.segmenter.units(logits.unit, logits.subunit, d.token_line, len(tt.lines))
        off = np.asarray(tt.token_offsets)
        units = [make_unit(u.index, u.start_line, u.end_line, int(off[u.end_line] - off[u.start_line]),
                           kind if kind is not None else u.kind) for u in raw]
        if len(units) < 2:
            raise CannotSegment(f"segment probe found one unit in {len(tt.lines)} lines")
        return units
