"""Omission markers in code name the definitions they hide, so an agent re-reads that range, not the file."""

from __future__ import annotations

import ast
import re

import numpy as np

from pflash_proxy.compress.gutter import find_gutter
from pflash_proxy.compress.named import definitions, outline
from pflash_proxy.compress.pipeline import NAMES_SHARE, CompressionSettings, Compressor
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.rewrite import MARKER_RE, MAX_NOTE_NAMES, Rewriter, names_in
from pflash_proxy.compress.text import TokenizedText, approx_tokens
from pflash_proxy.compress.units import UnitSegmenter


class Only:
    """Scores 1 for the units overlapping ``lines`` (0-based), 0 elsewhere."""

    name = "only"

    def __init__(self, lines):
        self.lines = set(lines)

    def represent(self, tt, units):
        return type("Reps", (), {"n_units": len(units), "units": units})()

    def score(self, reps, request):
        return np.array([1.0 if self.lines & set(range(u.start_line, u.end_line)) else 0.0 for u in reps.units])


def _markers(text):
    return [m for line in text.split("\n") if (m := re.match(MARKER_RE, line))]


def test_names_in_groups_by_owner_and_bounds_the_names():
    ol = [(1, "class Store", None), (3, "__setitem__", "Store"), (9, "setdefault", "Store"), (14, "pop", "Store"),
          (20, "helper", None), (30, "other", None), (40, "class Queue", None), (41, "put", "Queue")]
    starts = [d[0] for d in ol]
    assert names_in(ol, starts, 0, 19) == "class Store: __setitem__, setdefault, pop"
    assert names_in(ol, starts, 5, 35) == "Store: setdefault, pop; helper, other"  # the class line is shown
    assert names_in(ol, starts, 15, 19) == ""
    many = [(k, f"f{k}", None) for k in range(MAX_NOTE_NAMES + 7)]
    text = names_in(many, [d[0] for d in many], 0, 100)
    assert text.endswith(", … +7 more") and text.count(",") == MAX_NOTE_NAMES - 1 + 1


def test_outline_leaves_out_functions_nested_in_functions():
    tt = TokenizedText.from_text("class A:\n    def m(self):\n        def inner():\n            pass\n\n"
                                 "def top():\n    def local():\n        pass\n")
    assert [(i, n, o) for i, n, o in outline(tt.lines, definitions(tt))] == [
        (0, "class A", None), (1, "m", "A"), (5, "top", None)]


def test_markers_in_a_compressed_file_name_what_they_hide(python_source):
    """Rewriting with the class line of ChainMap kept: its hidden methods are named under "ChainMap:", and a
    hidden class by its own line."""
    tt = TokenizedText.from_text(python_source)
    tree = ast.parse(python_source)
    chain = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ChainMap")
    units = UnitSegmenter(1, 64).segment(tt)
    kept = [u.index for u in units if u.start_line <= chain.lineno - 1 < u.end_line]
    out = Rewriter().rewrite(tt, units, kept, "tool", "1", outline(tt.lines, definitions(tt)))
    marks = _markers(out.text)
    methods = sorted((f.lineno, f.name) for f in chain.body if isinstance(f, ast.FunctionDef))
    after = next(m for m in marks if int(m.group(1)) > chain.lineno)
    assert f"ChainMap: {methods[0][1]}" in after.group(3) or any(
        f"ChainMap: {n}" in after.group(3) for ln, n in methods if ln >= int(after.group(1)))
    ordered = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OrderedDict")
    hiding = next(m for m in marks if int(m.group(1)) <= ordered.lineno <= int(m.group(2) or m.group(1)))
    assert "class OrderedDict" in hiding.group(3) and hiding.group(3).endswith("more")  # bounded
    assert "__reversed__" not in hiding.group(3)  # too many to name: the file-level definitions come first


def test_the_names_stay_within_their_share_of_the_budget(python_source):
    tt = TokenizedText.from_text(python_source)
    comp = Compressor(CompressionSettings(threshold=256, curve="1000:0.2 100000:0.2"), scorer=Only(range(0, 5)))
    out = comp.compress(tt, RequestSpec("what does this module export?", 0, "tool-call"), tt.total_tokens, True,
                        "tool", "1")
    assert out.mode == "compressed"
    names = [m.group(3) for m in _markers(out.text) if m.group(3)]
    assert names and sum(approx_tokens(f" — {n}") for n in names) <= NAMES_SHARE * out.budget_tokens
    longest = max(_markers(out.text), key=lambda m: int(m.group(2) or m.group(1)) - int(m.group(1)))
    assert longest.group(3)  # the longest omission is named first


def test_markers_name_definitions_behind_a_line_number_gutter(python_source):
    lines = python_source.rstrip("\n").split("\n")
    numbered = "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, 1)) + "\n"
    tt = TokenizedText.from_text(numbered)
    assert find_gutter(tt.lines) is not None
    comp = Compressor(CompressionSettings(threshold=256, curve="1000:0.1 100000:0.1"), scorer=Only(range(0, 5)))
    out = comp.compress(tt, RequestSpec("what does this module export?", 0, "tool-call"), tt.total_tokens, True,
                        "tool", "1")
    assert out.mode == "compressed"
    marks = _markers(out.text)
    assert any(m.group(3) for m in marks)
    defined = {}  # name -> the 1-based lines that define it
    for node in ast.walk(ast.parse(python_source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.setdefault(node.name, []).append(node.lineno)
    for m in marks:  # every name a marker gives is defined inside the lines it hides
        if not m.group(3):
            continue
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        for part in m.group(3).split("; "):
            head, _, names = part.rpartition(": ")
            for name in [n for n in names.split(", ") if not n.startswith("…")]:
                assert any(a <= ln <= b for ln in defined[name.split(" ")[-1]]), (name, a, b)
