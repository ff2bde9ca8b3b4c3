"""ProbeSegmenter on crafted logits: threshold, snapping, min_segment merge, max_segment line-aligned split."""

from __future__ import annotations

import numpy as np

from pflash_proxy.drafter.segment import ProbeSegmenter, count_lines, token_lines, unit_token_spans

HI, LO = 5.0, -5.0  # sigmoid 0.993 / 0.007


def lines_of(tokens_per_line: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(tokens_per_line)), tokens_per_line)


def logits(n: int, at: list[int], value: float = HI) -> np.ndarray:
    z = np.full(n, LO, np.float32)
    z[at] = value
    return z


def check_cover(units, n_lines: int, n_tok: int) -> None:
    assert units[0].start_line == 0 and units[-1].end_line == n_lines
    assert all(a.end_line == b.start_line for a, b in zip(units, units[1:]))
    assert sum(u.tokens for u in units) == n_tok
    assert [u.index for u in units] == list(range(len(units)))


def test_threshold_decides_cuts() -> None:
    tl = lines_of([40] * 5)  # line starts at tokens 0, 40, 80, 120, 160
    z = logits(200, [40, 80, 120])
    z[80] = 1.3862  # sigmoid = 0.79999 < 0.8 -> no cut
    z[120] = 1.3864  # sigmoid = 0.80001 >= 0.8 -> cut
    seg = ProbeSegmenter(threshold=0.8, min_segment=32, max_segment=512)
    units = seg.units(z, np.full(200, LO), tl, 5)
    assert [(u.start_line, u.end_line) for u in units] == [(0, 1), (1, 3), (3, 5)]
    check_cover(units, 5, 200)


def test_cuts_snap_to_nearest_line_start() -> None:
    tl = lines_of([50, 50, 50])  # line starts 0, 50, 100
    seg = ProbeSegmenter(min_segment=1)
    assert seg.cut_tokens(logits(150, [60]), np.full(150, LO), tl).tolist() == [0, 50]
    assert seg.cut_tokens(logits(150, [90]), np.full(150, LO), tl).tolist() == [0, 100]
    assert seg.cut_tokens(logits(150, [75]), np.full(150, LO), tl).tolist() == [0, 50]  # tie -> earlier


def test_short_pieces_merge_forward_and_tail_merges_back() -> None:
    # lines of 10 tokens: a 10-token "doc comment" line at 100 followed by a function at 110
    tl = lines_of([10] * 30)
    seg = ProbeSegmenter(min_segment=32, max_segment=512)
    cuts = seg.cut_tokens(logits(300, [100, 110, 200, 290]), np.full(300, LO), tl)
    # 110 is 10 < 32 after 100 -> dropped (comment joins the function); 290 leaves a 10-token tail -> dropped
    assert cuts.tolist() == [0, 100, 200]
    units = seg.units(logits(300, [100, 110, 200, 290]), np.full(300, LO), tl, 30)
    assert all(u.tokens >= 32 for u in units)
    check_cover(units, 30, 300)


def test_oversize_splits_at_line_starts_preferring_subunits() -> None:
    tl = lines_of([20] * 60)  # 1200 tokens, one unit (no unit cuts)
    sub = logits(1200, [300, 700])  # sub-unit starts (line starts 300 and 700)
    seg = ProbeSegmenter(min_segment=32, max_segment=512)
    cuts = seg.cut_tokens(np.full(1200, LO), sub, tl)
    assert cuts.tolist() == [0, 300, 700]  # last sub-unit start within each 512 window
    cuts2 = seg.cut_tokens(np.full(1200, LO), np.full(1200, LO), tl)
    assert cuts2.tolist() == [0, 500, 1000]  # no sub-units: last line start within 512
    units = seg.units(np.full(1200, LO), np.full(1200, LO), tl, 60)
    assert max(u.tokens for u in units) <= 512
    check_cover(units, 60, 1200)


def test_subunit_mid_line_counts_for_its_line_and_giant_line_stays_whole() -> None:
    tl = lines_of([20] * 30 + [900] + [20] * 5)  # line 30 is one 900-token line
    sub = logits(tl.size, [205])  # fires on an indented token of line 10 (starts at 200)
    seg = ProbeSegmenter(min_segment=32, max_segment=512)
    cuts = seg.cut_tokens(np.full(tl.size, LO), sub, tl)
    assert cuts[:2].tolist() == [0, 200]
    assert 600 in cuts.tolist() and 1500 in cuts.tolist()  # the giant line [600,1500) is its own piece
    units = seg.units(np.full(tl.size, LO), sub, tl, 36)
    assert any(u.tokens == 900 and u.end_line - u.start_line == 1 for u in units)
    check_cover(units, 36, tl.size)


def test_token_lines_and_spans() -> None:
    text = "ab\ncd\n\nef\n"
    starts = np.array([0, 2, 3, 5, 7, 9])  # "ab" "\n" "cd" "\n\n" "ef" "\n"
    tl = token_lines(starts, text)
    assert tl.tolist() == [0, 0, 1, 1, 3, 3] and count_lines(text) == 4
    units = ProbeSegmenter(min_segment=1).units(logits(6, [2, 4]), np.full(6, LO), tl, 4)
    assert [(u.start_line, u.end_line, u.tokens) for u in units] == [(0, 1, 2), (1, 3, 2), (3, 4, 2)]
    s, e = unit_token_spans(tl, units)
    assert s.tolist() == [0, 2, 4] and e.tolist() == [2, 4, 6]
