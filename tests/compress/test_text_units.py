from __future__ import annotations

import ast
import inspect
import json
import textwrap

import pytest

from pflash_proxy.compress.kinds import ContentKind, detect_kind
from pflash_proxy.compress.text import TokenizedText, approx_line_tokens, split_lines
from pflash_proxy.compress.units import CannotSegment, Segmenter, UnitSegmenter

from .corpus import prose_paragraphs


def test_tokenized_text_roundtrip_and_totals():
    text = "alpha\nbeta gamma\n\nlast line without newline"
    tt = TokenizedText.from_text(text)
    assert "".join(tt.lines) == text
    assert tt.lines[-1] == "last line without newline"
    assert tt.line_tokens == approx_line_tokens(tt.lines)
    assert tt.total_tokens == sum(tt.line_tokens)
    assert tt.range_tokens(0, 2) == tt.line_tokens[0] + tt.line_tokens[1]
    with pytest.raises(ValueError):
        TokenizedText(text, tt.lines, tt.line_tokens[:-1])
    with pytest.raises(ValueError):
        TokenizedText(text + "x", tt.lines, tt.line_tokens)


def test_approx_line_tokens_rules():
    assert approx_line_tokens(["", "a", "abcd", "abcde", "é" * 2]) == [0, 1, 1, 2, 1]
    assert split_lines("a\n\nb\n") == ["a\n", "\n", "b\n"]


@pytest.mark.parametrize("mod", [json.decoder, textwrap])
def test_detect_code(mod):
    assert detect_kind(inspect.getsource(mod)) is ContentKind.CODE


def test_detect_other_kinds():
    prose = "\n\n".join(prose_paragraphs(12))
    assert detect_kind(prose) is ContentKind.PROSE
    jl = "\n".join(json.dumps({"id": i, "event": "login", "user": f"u{i}"}) for i in range(40))
    assert detect_kind(jl) is ContentKind.RECORDS
    chat = "\n".join(f"{'Alice' if i % 2 else 'Bob'}: point number {i} about the plan" for i in range(30))
    assert detect_kind(chat) is ContentKind.CHAT
    import difflib
    a = inspect.getsource(json.decoder).splitlines(True)
    b = [ln.replace("end", "stop") for ln in a]
    assert detect_kind("".join(difflib.unified_diff(a, b, "a/x.py", "b/x.py"))) is ContentKind.DIFF


def _def_spans(src: str) -> list[tuple[int, int]]:
    """0-based [start, end) line spans of top-level defs/classes including decorators."""
    tree = ast.parse(src)
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            out.append((start, node.end_lineno))
    return out


@pytest.mark.parametrize("modname", ["json.decoder", "textwrap", "collections", "functools"])
def test_code_units_never_cut_inside_a_definition(modname):
    import importlib
    src = inspect.getsource(importlib.import_module(modname))
    tt = TokenizedText.from_text(src)
    seg = UnitSegmenter()
    units = seg.segment(tt, ContentKind.CODE)
    starts = {u.start_line for u in units}
    checked = 0
    for a, b in _def_spans(src):
        if tt.range_tokens(a, b) <= seg.max_segment:
            inner = [s for s in starts if a < s < b]
            assert not inner, f"{modname}: unit starts inside lines {a + 1}-{b}: {inner}"
            checked += 1
    assert checked >= 3
    # every unit is whole lines that tile the message, and starts at a top-level or split line
    assert units[0].start_line == 0 and units[-1].end_line == len(tt.lines)
    for u, v in zip(units, units[1:]):
        assert u.end_line == v.start_line
    # a unit starting indented must be a split piece of an oversize definition
    big = [(a, b) for a, b in _def_spans(src) if tt.range_tokens(a, b) > seg.max_segment]
    for u in units:
        line = tt.lines[u.start_line]
        if line[:1].isspace() and line.strip():
            assert any(a < u.start_line < b for a, b in big), (u, line)


def test_leading_comments_and_decorators_group_with_definition():
    src = ("import os\n\n\n" + "# helper that does a thing with a fairly long explanatory comment here\n"
           "@decorator(option=True)\n" + "def f(x):\n" + "".join(f"    y{i} = x + {i}\n" for i in range(12))
           + "\n\nclass K:\n" + "".join(f"    a{i} = {i}\n" for i in range(12)))
    tt = TokenizedText.from_text(src)
    units = UnitSegmenter(min_segment=8).segment(tt, ContentKind.CODE)
    lines = [tt.lines[u.start_line] for u in units]
    f_unit = next(u for u in units if any(tt.lines[i].startswith("def f") for i in range(u.start_line, u.end_line)))
    assert "# helper" in "".join(tt.lines[f_unit.start_line:f_unit.end_line])
    assert "@decorator" in "".join(tt.lines[f_unit.start_line:f_unit.end_line])
    assert not any(ln.startswith("@") or ln.startswith("def f") for ln in lines)


def test_bracket_and_string_continuations_are_not_cuts():
    src = ("CONFIG = dict(\n" + "".join(f"key{i}={i},\n" for i in range(20)) + ")\n\n"
           'DOC = """\n' + "".join(f"text line {i} at column zero\n" for i in range(20)) + '"""\n\n'
           "def g():\n    return 1\n")
    tt = TokenizedText.from_text(src)
    units = UnitSegmenter(min_segment=4).segment(tt, ContentKind.CODE)
    starts = [tt.lines[u.start_line] for u in units]
    assert not any(s.startswith("key") or s.startswith("text line") for s in starts)
    assert len(units) >= 3


def _functions_src(prefix: str, n: int = 6, doc: str = "") -> str:
    body = "".join(f"    y{j} = x + {j}\n" for j in range(8)) + "    return y0\n\n"
    return "".join(f"def {prefix}{i}(x):\n{doc}{body}" for i in range(n))


def _first_lines(tt: TokenizedText, units) -> list[str]:
    """Each unit's first non-blank line (blank lines above a definition go with it, as leaders)."""
    return [next((ln for ln in tt.lines[u.start_line:u.end_line] if ln.strip()), "") for u in units]


def test_a_stray_bracket_in_a_prose_preamble_does_not_swallow_the_code_below():
    # the code family's own preamble: its `#` reads as a comment, which hides the `)` of the parenthesis, so the
    # bracket depth stayed 1 to the end and the whole message had one cut candidate (line 0): units were then cut
    # by size alone, and a four-line function ended up inside another file's function
    src = ("I'm reading these files (each starts with a `# ===== path =====` header line).\n\n```python\n"
           + "# ===== a.py =====\n" + _functions_src("alpha") + "# ===== b.py =====\n" + _functions_src("beta")
           + "```\n\nWhich function returns y0? Give its name.\n")
    tt = TokenizedText.from_text(src)
    starts = _first_lines(tt, UnitSegmenter(min_segment=8).segment(tt, ContentKind.CODE))
    defs = [ln for ln in tt.lines if ln.startswith("def ")]
    # every function starts its own unit: alpha0 goes with the fence, beta0 with its file's header comment
    assert [ln for ln in starts if ln.startswith("def ")] == [d for d in defs if not d.startswith(("def alpha0",
                                                                                                    "def beta0"))]
    assert "```python\n" in starts and "# ===== b.py =====\n" in starts, starts


def test_a_docstring_opened_with_a_backslash_newline_is_one_literal():
    # '"""\\' + newline: the escape takes the newline; missed, the quotes paired wrongly with later ones and the
    # functions after it were "inside a string", with no cut candidates
    src = ('def f():\n    print("""\\\n    Thanks to everyone; see www.example.org.""")\n\n'
           + _functions_src("gamma", doc='    """Add."""\n'))
    tt = TokenizedText.from_text(src)
    starts = _first_lines(tt, UnitSegmenter(min_segment=8).segment(tt, ContentKind.CODE))
    assert [ln for ln in starts if ln.startswith("def gamma")] == [ln for ln in tt.lines if ln.startswith("def gamma")]


def _js_functions(prefix: str, n: int = 6) -> str:
    body = "".join(f"  const y{j} = x + {j};\n" for j in range(8)) + "  return y0;\n}\n\n"
    return "".join(f"function {prefix}{i}(x) {{\n{body}" for i in range(n))


@pytest.mark.parametrize("stray", [
    "const OPEN = /[(]/g;\n",  # a regex literal: the literal pass cannot tell it from a division
    "const parts = line.split(/\\(/);\n",
])
def test_a_stray_bracket_in_c_like_code_does_not_swallow_the_functions_below(stray):
    # C-like code had resync points only at fences: one unmatched bracket outside a literal left every later line
    # "inside brackets", one cut candidate for the whole file. A column-0 declaration or closing brace restarts
    # the depth, as a column-0 `def` does for Python
    src = "// util.js\n" + stray + _js_functions("alpha") + "export function last(x) {\n  return x;\n}\n"
    tt = TokenizedText.from_text(src)
    starts = _first_lines(tt, UnitSegmenter(min_segment=8).segment(tt, ContentKind.CODE))
    assert starts == ["// util.js\n"] + [ln for ln in tt.lines if ln.startswith(("function ", "export "))]


@pytest.mark.parametrize("lang", ["js", "go", "rust", ""])
def test_a_fenced_c_like_file_is_cut_at_its_functions(lang):
    # the fence's backticks opened a JS template literal that ran to the closing fence: the whole fenced file was
    # "inside a string" and the paste had no cut points but the prose around it
    src = f"Here is my file:\n\n```{lang}\n" + _js_functions("alpha") + "```\n\nWhich function returns y0?\n"
    tt = TokenizedText.from_text(src)
    starts = _first_lines(tt, UnitSegmenter(min_segment=8).segment(tt, ContentKind.CODE))
    defs = [ln for ln in tt.lines if ln.startswith("function ")]
    assert [ln for ln in starts if ln.startswith("function ")][-5:] == defs[1:]  # alpha0 may go with the fence


def test_a_fence_inside_a_docstring_stays_inside_it():
    src = ('"""Usage:\n\n```\nimport m\n```\n"""\n\n' + _functions_src("delta"))
    tt = TokenizedText.from_text(src)
    starts = _first_lines(tt, UnitSegmenter(min_segment=8).segment(tt, ContentKind.CODE))
    assert [ln for ln in starts if ln.startswith("def ")] == [ln for ln in tt.lines if ln.startswith("def ")]
    assert "import m\n" not in starts


def test_a_column_zero_brace_inside_a_template_literal_is_not_a_resync_point():
    src = ("const page = `\n<style>\n}\n</style>\n`;\n" + _js_functions("beta", 3))
    tt = TokenizedText.from_text(src)
    starts = _first_lines(tt, UnitSegmenter(min_segment=8).segment(tt, ContentKind.CODE))
    assert "}\n" not in starts and "<style>\n" not in starts


def test_min_segment_merges_forward_and_last_backward():
    text = "\n\n".join(["short one"] * 3 + [prose_paragraphs(1)[0]] * 2 + ["tiny"]) + "\n"
    tt = TokenizedText.from_text(text)
    units = UnitSegmenter(min_segment=32, max_segment=512).segment(tt, ContentKind.PROSE)
    assert all(u.tokens >= 32 for u in units)
    assert units[0].start_line == 0
    assert "short one" in "".join(tt.lines[units[0].start_line:units[0].end_line])
    assert "tiny" in "".join(tt.lines[units[-1].start_line:units[-1].end_line])
    assert units[-1].tokens > tt.range_tokens(len(tt.lines) - 1, len(tt.lines))


def test_max_segment_splits_at_line_starts():
    body = "".join(f"{p}\n" for p in prose_paragraphs(30))  # one paragraph, many lines
    tt = TokenizedText.from_text(body + "\nAnother paragraph to make two.\n")
    seg = UnitSegmenter(min_segment=32, max_segment=200)
    units = seg.segment(tt, ContentKind.PROSE)
    assert max(u.tokens for u in units) <= 200
    assert sum(u.tokens for u in units) == tt.total_tokens


def test_records_continuations_join_record():
    lines = []
    for i in range(30):
        lines.append(f"2024-05-01 10:00:{i:02d} ERROR worker {i} failed with a long message about disks")
        if i % 5 == 0:
            lines += ["  Traceback (most recent call last):", '    File "x.py", line 3, in f']
    tt = TokenizedText.from_text("\n".join(lines) + "\n")
    units = UnitSegmenter(min_segment=1).segment(tt, ContentKind.RECORDS)
    assert len(units) == 30
    assert all(tt.lines[u.start_line].startswith("2024") for u in units)


def test_chat_and_diff_units():
    turns = []
    for i in range(10):
        turns.append(f"User: question {i} about the migration plan and its risks?\n")
        turns.append(f"Assistant: answer {i}, first line.\nsecond line of answer {i}.\n")
    tt = TokenizedText.from_text("".join(turns))
    units = UnitSegmenter(min_segment=1).segment(tt, ContentKind.CHAT)
    assert len(units) == 20
    assert all(tt.lines[u.start_line].split(":")[0] in ("User", "Assistant") for u in units)
    import difflib
    a = inspect.getsource(json.decoder).splitlines(True)
    b = [ln.replace("end", "stop") for ln in a]
    d = "".join(difflib.unified_diff(a, b, "a/x.py", "b/x.py"))
    tt = TokenizedText.from_text(d)
    units = UnitSegmenter(min_segment=1, max_segment=4096).segment(tt, ContentKind.DIFF)
    assert tt.lines[units[0].start_line].startswith("--- ")
    assert all(tt.lines[u.start_line].startswith("@@") for u in units[1:])
    assert tt.lines[units[0].start_line + 2].startswith("@@")


def test_cannot_segment():
    seg = UnitSegmenter(min_segment=32, max_segment=512)
    with pytest.raises(CannotSegment, match="alone"):
        seg.segment(TokenizedText.from_text("word " * 3000 + "\nsmall\n"))
    with pytest.raises(CannotSegment, match="one unit"):
        seg.segment(TokenizedText.from_text("just one short paragraph\n"))
    assert isinstance(seg, Segmenter)
