"""The unit that defines a name the question spells out is always kept (agents asking about one function)."""

from __future__ import annotations

import inspect
import textwrap

import numpy as np

from pflash_proxy.compress.named import named_units
from pflash_proxy.compress.pipeline import CompressionSettings, Compressor
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter


class BlindScorer:
    """Scores every unit 1 but the one that defines ``indent`` (0): only a pin can keep that one."""

    name = "blind"

    def represent(self, tt, units):
        return type("Reps", (), {"n_units": len(units), "tt": tt, "units": units})()

    def score(self, reps, request):
        return np.array([0.0 if any(reps.tt.lines[k].startswith("def indent(") for k in range(u.start_line, u.end_line))
                         else 1.0 for u in reps.units])


def source() -> TokenizedText:
    return TokenizedText.from_text(inspect.getsource(textwrap))


def test_named_function_is_kept_whatever_its_score():
    tt = source()
    request = RequestSpec("Read textwrap.py and tell me what indent does with the predicate argument.", 0, "tool-call")
    comp = Compressor(CompressionSettings(threshold=256, curve="1000:0.2 4000:0.2"), scorer=BlindScorer())
    out = comp.compress(tt, request, tt.total_tokens, True, "tool", "1")
    assert out.mode == "compressed" and out.units_kept < out.units_in
    body = inspect.getsource(textwrap.indent)
    assert body.strip() in out.text
    indent_unit = next(i for i, u in enumerate(out.analysis.units)
                       if any(tt.lines[k].startswith("def indent(") for k in range(u.start_line, u.end_line)))
    assert indent_unit in out.analysis.named and indent_unit not in out.analysis.pinned  # kept, not by its score
    unnamed = comp.compress(tt, RequestSpec("What does the prefix argument do?", 0, "tool-call"), tt.total_tokens,
                            True, "tool", "1")
    assert indent_unit not in unnamed.analysis.named


def test_common_or_many_names_pin_nothing():
    tt = source()
    units = UnitSegmenter(32, 512).segment(tt)

    def defining(name):
        return {i for i, u in enumerate(units) if any(tt.lines[k].lstrip().startswith(f"def {name}(")
                                                      for k in range(u.start_line, u.end_line))}

    assert defining("fill") <= named_units(tt, units, "what does fill do?")  # the method and the function
    assert named_units(tt, units, "compare wrap, fill, shorten, dedent and indent") == set()  # a list, not one
    assert named_units(tt, units, "what does the module do?") == set()
    classes = TokenizedText.from_text("".join(
        f"class Node{i}:\n    def __init__(self):\n        self.x = {i}\n\n" for i in range(3)))
    cunits = UnitSegmenter(1, 512).segment(classes)
    assert named_units(classes, cunits, "what does __init__ do?") == set()  # defined 3 times: names nothing
    assert len(named_units(classes, cunits, "what is Node1?")) == 1
