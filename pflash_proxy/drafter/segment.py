"""Turn the segment probe's per-token logits into whole, line-granular units.

Inputs: ``unit`` and ``subunit`` logits (one per drafter token), ``token_line`` (the 0-based line holding each
token's first byte, non-decreasing) and the number of lines. Settings come from the probe file: ``threshold``
(0.8), ``min_segment`` (32 tokens), ``max_segment`` (512 tokens), ``oversize_split`` (``line_aligned``).

1. Line starts: a token starts a line when its line differs from the previous token's. Only these tokens can
   start a unit (a line whose start falls inside a multi-line token, e.g. a ``"\n\n"`` token, stays with the
   line before it). The first token always starts a unit, at line 0.
2. Candidates: every token with ``sigmoid(unit) >= threshold``.
3. Snap: each candidate moves to the nearest line-start token (ties to the earlier one), because every unit
   is made of whole lines. This is what the card asks for chat and tool messages; since ``Unit`` is
   line-granular it is applied to every message kind.
4. Merge forward: walking left to right, a cut closer than ``min_segment`` tokens to the previous kept cut is
   dropped, so the short piece before it joins what follows (a doc comment groups with its function). A final
   piece shorter than ``min_segment`` cannot merge forward and joins the unit before it.
5. Oversize split (``line_aligned``): a unit longer than ``max_segment`` tokens is cut greedily from its start
   ``cur``: among line starts ``c`` with ``cur < c <= cur + max_segment`` (preferring ``c - cur >= min_segment``
   and, after that, at least ``min_segment`` tokens left in the unit) take the last line holding a sub-unit
   start (``max sigmoid(subunit)`` over the line's tokens ``>= threshold``), else the last line start. A single
   line longer than ``max_segment`` cannot be split and stays one over-long piece.
6. Emit ``Unit(index, start_line, end_line, tokens, kind)`` with ``end_line`` exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .nn import sigmoid

if TYPE_CHECKING:
    from pflash_proxy.compress.units import Unit

    from .probes import SegmentProbe


@dataclass(frozen=True)
class ProbeUnit:
    """Stand-in with exactly the fields of ``pflash_proxy.compress.units.Unit`` (used when that is absent)."""
    index: int
    start_line: int
    end_line: int
    tokens: int
    kind: str


def make_unit(index: int, start_line: int, end_line: int, tokens: int, kind: Any) -> Any:
    """Build the pipeline's ``Unit`` if importable, else a ``ProbeUnit`` with the same fields (``kind``: a
    ``ContentKind``, or a probe's own label such as ``"probe"``, which ``Unit`` stores as given)."""
    try:
        from pflash_proxy.compress.units import Unit
        return Unit(index=index, start_line=start_line, end_line=end_line, tokens=tokens, kind=kind)
    except (ImportError, TypeError):
        return ProbeUnit(index, start_line, end_line, tokens, kind)


def token_lines(token_starts: np.ndarray, text: bytes | str) -> np.ndarray:
    """Line index of each token from the byte (or char) offset where it starts in ``text``."""
    buf = np.frombuffer(text.encode() if isinstance(text, str) else text, dtype=np.uint8)
    line_starts = np.concatenate(([0], np.flatnonzero(buf == 10) + 1))
    return (np.searchsorted(line_starts, np.asarray(token_starts), side="right") - 1).astype(np.int64)


def count_lines(text: bytes | str) -> int:
    """Lines as ``str.splitlines`` sees them for ``\\n`` text (a trailing newline opens no new line)."""
    b = text.encode() if isinstance(text, str) else text
    return b.count(b"\n") + (0 if b.endswith(b"\n") or not b else 1)


@dataclass
class ProbeSegmenter:
    threshold: float = 0.8
    min_segment: int = 32
    max_segment: int = 512
    kind: str = "probe"

    @classmethod
    def from_probe(cls, probe: SegmentProbe, kind: str = "probe") -> "ProbeSegmenter":
        return cls(probe.threshold, probe.min_segment, probe.max_segment, kind)

    def cut_tokens(self, unit_logits: np.ndarray, subunit_logits: np.ndarray,
                   token_line: np.ndarray) -> np.ndarray:
        """Steps 1-5: sorted token indices where units start (first is 0)."""
        token_line = np.asarray(token_line, dtype=np.int64)
        n = token_line.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        ls_tok = np.flatnonzero(np.r_[True, token_line[1:] != token_line[:-1]])  # step 1
        cand = np.flatnonzero(sigmoid(unit_logits) >= self.threshold)  # step 2
        idx = np.searchsorted(ls_tok, cand, side="right") - 1  # step 3: previous line start
        prev = ls_tok[idx]
        nxt = ls_tok[np.minimum(idx + 1, ls_tok.size - 1)]
        has_next = idx + 1 < ls_tok.size
        snapped = np.where(has_next & (nxt - cand < cand - prev), nxt, prev)
        cuts = np.unique(np.r_[0, snapped])
        kept = [0]  # step 4
        for c in cuts[1:].tolist():
            if c - kept[-1] >= self.min_segment:
                kept.append(c)
        if len(kept) > 1 and n - kept[-1] < self.min_segment:
            kept.pop()
        sub_line = self._line_max(sigmoid(subunit_logits), ls_tok) >= self.threshold
        out: list[int] = []
        bounds = kept + [n]
        for s, e in zip(bounds[:-1], bounds[1:]):  # step 5
            out.extend(self._split(s, e, ls_tok, sub_line))
        return np.asarray(out, dtype=np.int64)

    @staticmethod
    def _line_max(p: np.ndarray, ls_tok: np.ndarray) -> np.ndarray:
        """Max of ``p`` over each line's tokens, indexed like ``ls_tok``."""
        return np.maximum.reduceat(np.asarray(p, dtype=np.float32), ls_tok) if ls_tok.size else np.zeros(0)

    def _split(self, s: int, e: int, ls_tok: np.ndarray, sub_line: np.ndarray) -> list[int]:
        cuts = [s]
        cur = s
        while e - cur > self.max_segment:
            lo = np.searchsorted(ls_tok, cur + 1, side="left")
            hi = np.searchsorted(ls_tok, cur + self.max_segment, side="right")
            ok = np.arange(lo, hi)
            ok = ok[ls_tok[ok] < e]
            if ok.size == 0:  # the line at ``cur`` alone exceeds max_segment: it stays one piece
                if hi >= ls_tok.size or ls_tok[hi] >= e:
                    break
                cur = int(ls_tok[hi])
                cuts.append(cur)
                continue
            for rule in ("far", "room"):  # prefer pieces and remainders of at least min_segment tokens
                keep = (ls_tok[ok] - cur if rule == "far" else e - ls_tok[ok]) >= self.min_segment
                ok = ok[keep] if keep.any() else ok
            subs = ok[sub_line[ok]]
            cur = int(ls_tok[(subs if subs.size else ok)[-1]])
            cuts.append(cur)
        return cuts

    def units(self, unit_logits: np.ndarray, subunit_logits: np.ndarray, token_line: np.ndarray,
              n_lines: int | None = None) -> list[Unit | ProbeUnit]:
        """Steps 1-6: line-granular units covering lines ``[0, n_lines)``."""
        token_line = np.asarray(token_line, dtype=np.int64)
        n = token_line.shape[0]
        total = int(n_lines if n_lines is not None else (token_line[-1] + 1 if n else 0))
        if n == 0:
            return [make_unit(0, 0, total, 0, self.kind)] if total else []
        cuts = self.cut_tokens(unit_logits, subunit_logits, token_line)
        starts = token_line[cuts].copy()
        starts[0] = 0
        ends = np.r_[starts[1:], total]
        toks = np.diff(np.r_[cuts, n])
        return [make_unit(i, int(a), int(b), int(t), self.kind)
                for i, (a, b, t) in enumerate(zip(starts.tolist(), ends.tolist(), toks.tolist()))]


def unit_token_spans(token_line: np.ndarray, units: Sequence[Unit | ProbeUnit]) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges ``[start, end)`` of line-granular units (tokens whose first byte is in the unit's lines)."""
    token_line = np.asarray(token_line, dtype=np.int64)
    sl = np.asarray([u.start_line for u in units], dtype=np.int64)
    el = np.asarray([u.end_line for u in units], dtype=np.int64)
    return np.searchsorted(token_line, sl, "left"), np.searchsorted(token_line, el, "left")
