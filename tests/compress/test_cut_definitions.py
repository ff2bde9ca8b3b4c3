"""A definition longer than the cutter's largest unit is cut inside; when the part the budget chose leaves only a
small rest, the rest is served with it (before: a function's 39-token last unit, ranked 79th of 90, was dropped
while its first 728 tokens were kept, and the agent got the function without its end)."""

from __future__ import annotations

import numpy as np

from pflash_proxy.compress.named import definition_blocks
from pflash_proxy.compress.pipeline import CLOSE_SHARE, CompressionSettings, Compressor
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter


def small(k: int) -> str:
    return f"def helper_{k}(x):\n    y = x * {k} + {k * 7}\n    return y - {k}\n"


def long_function(body_lines: int, tail_lines: int) -> str:
    head = ["def plant_watering_schedule(garden, season):", '    """Water the beds by season."""']
    body = [f"    bed_{i} = garden.bed({i}).moisture() * season.factor + {i}" for i in range(body_lines)]
    tail = [f"    garden.finish(step={i}, note='closing the schedule for bed {i}')" for i in range(tail_lines)]
    return "\n".join(head + body + tail) + "\n"


class FirstPieceOnly:
    """Scores the first piece of the long function highest, its other pieces lowest of all."""

    name = "first-piece"

    def represent(self, tt, units):
        return tt, list(units)

    def score(self, reps, query):
        tt, units = reps
        s = np.full(len(units), 0.05)
        for i, u in enumerate(units):
            text = tt.range_text(u.start_line, u.end_line)
            if "def plant_watering_schedule" in text:
                s[i] = 1.0
            elif "garden." in text:
                s[i] = 0.0
        return s


def compress(text: str):
    tt = TokenizedText.from_text(text)
    settings = CompressionSettings(threshold=256, curve="1000:0.3 8000:0.3")
    request = RequestSpec("How are the beds watered?", 0, "tool-call")
    return tt, Compressor(settings, scorer=FirstPieceOnly()).compress(tt, request, tt.total_tokens, True, "tool", "1")


def file_with(fn: str) -> str:
    return "\n\n".join([small(k) for k in range(40)] + [fn] + [small(k) for k in range(40, 80)])


def test_the_small_rest_of_a_cut_function_is_served_with_the_part_chosen():
    fn = long_function(33, 2)
    tt, out = compress(file_with(fn))
    a = out.analysis
    blocks = definition_blocks(tt, a.units, 2 * UnitSegmenter().max_segment)
    mine = [b for b in blocks if any("def plant_watering_schedule" in tt.range_text(a.units[k].start_line,
                                                                                     a.units[k].end_line) for k in b)]
    assert len(mine) == 1 and len(mine[0]) >= 2  # the cutter did cut it
    assert out.mode == "compressed" and out.units_kept < out.units_in
    assert fn.rstrip("\n") in out.text


def test_a_large_rest_is_not_added():
    fn = long_function(20, 24)  # the rest is about 30 % of the function: more than CLOSE_SHARE
    tt, out = compress(file_with(fn))
    assert CLOSE_SHARE < 0.5
    assert out.mode == "compressed"
    assert "def plant_watering_schedule" in out.text and fn.rstrip("\n") not in out.text


def test_the_definition_lines_are_matched_once_per_message(monkeypatch):
    import pflash_proxy.compress.pipeline as pipeline_module
    from pflash_proxy.compress.named import definitions

    calls: list[int] = []

    def counted(tt):
        calls.append(len(tt.lines))
        return definitions(tt)
    monkeypatch.setattr(pipeline_module, "definitions", counted)
    tt, out = compress(file_with(long_function(33, 2)))
    assert len(calls) == 1, "named_units and definition_blocks share one pass over the lines"
    assert out.mode == "compressed" and "def plant_watering_schedule" in out.text
    a = out.analysis
    assert list(a.blocks) == definition_blocks(tt, a.units, 2 * UnitSegmenter().max_segment)  # the same blocks
