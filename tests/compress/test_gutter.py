"""Line-numbered tool output (issue 25, item 2): agents' file reads are cut and scored behind the numbers,
and served with them."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

import pflash_proxy
from pflash_proxy.compress.gutter import bare_text, find_gutter
from pflash_proxy.compress.kinds import ContentKind
from pflash_proxy.compress.pipeline import Compressor
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.rewrite import MARKER_RE
from pflash_proxy.compress.text import TokenizedText

JS_FILE = Path(pflash_proxy.__file__).parent / "inspector" / "static" / "session.js"  # a real JS source file


def _claude(n: int, line: str) -> str:  # Claude Code Read, cat -n
    return f"{n:>6}\t{line}"


# how each client numbers a file's lines (and wraps the whole), and the gutter form the proxy reports
FORMATS = {
    "claude-code": (_claude, "", "", "N<TAB>"),
    "claude-code-2.1": (lambda n, s: f"{n}\t{s}", "", "", "N<TAB>"),
    "claude-code-arrow": (lambda n, s: f"{n:>6}→{s}", "", "", "N→"),
    "arrow-tab": (lambda n, s: f"{n:>6}→\t{s}", "", "", "N→<TAB>"),
    "cat-n": (_claude, "", "", "N<TAB>"),
    "opencode": (lambda n, s: f"{n}: {s}", "<path>/work/src/FILE</path>\n<type>file</type>\n<content>\n",
                 "\n(End of file - total TOTAL lines)\n</content>", "N: "),
    "opencode-old": (lambda n, s: f"{n:05d}| {s}", "<file>\n", "\n(End of file - total TOTAL lines)\n</file>",
                     "N| "),
    "grep-n": (lambda n, s: f"{n}:{s}", "", "", "N:"),
    "grep-n-file": (lambda n, s: f"src/FILE:{n}:{s}", "", "", "file:N:"),
}


def numbered(src: str, fmt: str) -> tuple[str, int]:
    """``src`` as the client shows it, and the number of wrapper lines before the first numbered line."""
    number, head, foot, _ = FORMATS[fmt]
    lines = src.splitlines(keepends=True)
    body = "".join(number(i + 1, ln) for i, ln in enumerate(lines))
    return head + body + foot.replace("TOTAL", str(len(lines))), head.count("\n")


def difflib_head() -> str:
    """The first ~29K characters of the installed difflib.py (up to ``class Differ``): a real Read with a limit."""
    src = Path(difflib.__file__).read_text(encoding="utf-8")
    return src[:re.search(r"^class Differ\b", src, re.M).start()]


def function_lines(src: str, name: str, prefix: str = "def ") -> tuple[int, int]:
    """0-based [first, last] lines of a top-level definition, trailing blank lines left out."""
    lines = src.splitlines()
    a = next(i for i, ln in enumerate(lines) if ln.startswith(prefix + name))
    b = next(i for i in range(a + 1, len(lines)) if lines[i][:1] not in ("", " ", "\t", ")", "}"))
    while not lines[b - 1].strip():
        b -= 1
    return a, b - 1


def compress(text: str, question: str):
    tt = TokenizedText.from_text(text)
    return tt, Compressor().compress(tt, RequestSpec(question, 0, "tool-call"), tt.total_tokens, False, "tool")


def served_lines_verbatim(tt: TokenizedText, out) -> None:
    """Every served line but the note and markers is the original line, in order, number included."""
    body = out.text.split("\n", 1)[1].splitlines(keepends=True)
    kept = [ln for ln in body if not re.match(MARKER_RE, ln.rstrip("\n"))]
    omitted = set(out.recall.omitted)
    want = [ln for u in out.analysis.units if u.index not in omitted for ln in tt.lines[u.start_line:u.end_line]]
    assert [k.rstrip("\n") for k in kept] == [w.rstrip("\n") for w in want]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_numbered_python_file_is_cut_and_kept_like_the_plain_file(fmt):
    src = difflib_head()
    assert 20_000 <= len(src) <= 40_000
    q = "In difflib's get_close_matches, what happens when n is 0 or negative?"
    _, raw = compress(src, q)
    text, head = numbered(src, fmt)
    tt, out = compress(text, q)
    assert out.mode == "compressed" and out.gutter == FORMATS[fmt][3]
    units = out.analysis.units
    assert {u.kind for u in units} == {ContentKind.CODE}
    # the same units as the plain file, line for line (shifted by the wrapper's header lines)
    shift = [(u.start_line - head, u.end_line - head) for u in units]
    plain = [(u.start_line, u.end_line) for u in raw.analysis.units]
    assert shift[1:-1] == plain[1:-1] and shift[0][1] == plain[0][1] and shift[-1][0] == plain[-1][0]
    # the unit counts are the numbered lines' tokens (what is served)
    assert sum(u.tokens for u in units) == tt.total_tokens
    # the asked-about function is served whole, with its line numbers
    a, b = function_lines(src, "get_close_matches")
    func = "".join(tt.lines[head + a:head + b + 1])
    assert 'raise ValueError("n must be > 0: %r" % (n,))' in func and func in out.text
    assert FORMATS[fmt][0](a + 1, "def get_close_matches(") in out.text
    served_lines_verbatim(tt, out)


@pytest.mark.parametrize("fmt", ["claude-code", "opencode"])
def test_numbered_js_file_is_cut_and_kept_like_the_plain_file(fmt):
    src = JS_FILE.read_text(encoding="utf-8")
    q = "In linesBlock, how are the lines inside the request span marked?"
    _, raw = compress(src, q)
    text, head = numbered(src, fmt)
    tt, out = compress(text, q)
    assert out.mode == "compressed" and out.gutter == FORMATS[fmt][3]
    assert {u.kind for u in out.analysis.units} == {ContentKind.CODE}
    assert [(u.start_line - head, u.end_line - head) for u in out.analysis.units][1:-1] == \
        [(u.start_line, u.end_line) for u in raw.analysis.units][1:-1]
    a, b = function_lines(src, "linesBlock", "function ")
    func = "".join(tt.lines[head + a:head + b + 1])
    assert "const inReq" in func and func in out.text
    served_lines_verbatim(tt, out)


def test_without_the_gutter_claude_code_read_looks_like_records():
    """What the gutter fixes: with the numbers in, the file reads as tab-separated records."""
    from pflash_proxy.compress.kinds import detect_kind
    text, _ = numbered(difflib_head(), "claude-code")
    assert detect_kind(text) == ContentKind.RECORDS
    g = find_gutter(TokenizedText.from_text(text).lines)
    assert detect_kind(bare_text(TokenizedText.from_text(text), g).text) == ContentKind.CODE


def test_bare_text_keeps_lines_one_for_one():
    src = difflib_head()
    text, head = numbered(src, "opencode")
    tt = TokenizedText.from_text(text)
    g = find_gutter(tt.lines)
    bare = bare_text(tt, g)
    assert len(bare.lines) == len(tt.lines) and bare.line_tokens == tt.line_tokens
    assert "".join(bare.lines[head:head + src.count("\n")]) == src  # the file itself, byte for byte
    assert g.prefix[:head] == (0,) * head and g.numbered == src.count("\n")
    content = bare_text(tt, g, content_tokens=True)  # counts of the text behind the numbers
    assert content.line_tokens == TokenizedText.from_text(content.text).line_tokens


NOT_GUTTERS = {
    "numbered list": "".join(f"{i}. Item number {i} of the list\n   with a second line\n" for i in range(1, 40)),
    "numbered list, colon": "".join(f"{i}: step {i}, then\n   more about step {i}\n" for i in range(1, 40)),
    "log with times": "".join(f"12:{i // 6:02d}:{i * 7 % 60:02d} INFO worker {i % 3} done\n" for i in range(80)),
    "log with dates": "".join(f"2024-05-{1 + i // 40:02d} 10:00:{i % 60:02d} GET /x {i}\n" for i in range(80)),
    "tsv with an id column": "".join(f"{i}\tuser{i}\t{i * 37 % 100}\tactive\n" for i in range(1, 80)),
    "numbers out of order": "".join(f"{(i * 37) % 101}: value {i}\n" for i in range(80)),
    "grep -rn across files": "".join(f"src/mod{i}/worker.py:{10 + i}:    user{i} = step(worker)\n" for i in range(60)),
}


@pytest.mark.parametrize("name", sorted(NOT_GUTTERS))
def test_numbers_that_are_not_a_gutter_are_kept(name):
    text = NOT_GUTTERS[name]
    tt = TokenizedText.from_text(text)
    assert find_gutter(tt.lines) is None
    out = Compressor().compress(tt, RequestSpec("worker 2 user5 step 7", 0, "tool-call"), tt.total_tokens, True,
                                "tool")
    assert out.gutter is None


def test_gutter_tolerates_a_wrapper_but_not_unnumbered_lines_inside():
    src = "".join(f"    x{i} = {i}\n" for i in range(60))
    text, _ = numbered(src, "opencode")
    assert find_gutter(TokenizedText.from_text(text).lines).form == "N: "
    lines = text.splitlines(keepends=True)
    broken = "".join(lines[:20] + ["an unnumbered line\n"] * 3 + lines[20:])
    assert find_gutter(TokenizedText.from_text(broken).lines) is None
    # grep -n -C: "--" between groups, numbers rising with gaps, context lines with "-"
    grep = "".join(f"{i}{':' if i % 5 == 0 else '-'}{'    ' if i % 3 else ''}y = f({i})\n"
                   + ("--\n" if i % 10 == 9 else "") for i in range(3, 300, 2))
    g = find_gutter(TokenizedText.from_text(grep).lines)
    assert g is not None and g.form == "N:"


_TOY = re.compile(r"\d| ?[A-Za-z_]+| ?[^\w\s]| +|\t|\n")


def toy_tokens(line: str) -> int:
    """A tokenizer like gemma's in the ways that matter here: digits one by one, a word or a punctuation mark
    takes the space before it, runs of spaces are one token."""
    return len(_TOY.findall(line))


@pytest.mark.parametrize("fmt", ["claude-code", "opencode", "grep-n"])
def test_units_match_the_plain_file_with_a_digit_splitting_tokenizer(fmt):
    """Counted by a tokenizer (not the byte estimate), the numbers cost 3-5 tokens a line; the segmenter sizes
    units by what is behind them, so the numbered file is cut where the plain one is."""
    src = difflib_head()
    plain = TokenizedText.from_text(src, [toy_tokens(ln) for ln in TokenizedText.from_text(src).lines])
    text, head = numbered(src, fmt)
    lines = TokenizedText.from_text(text).lines
    tt = TokenizedText.from_text(text, [toy_tokens(ln) for ln in lines])
    g = find_gutter(tt.lines)
    content = bare_text(tt, g, content_tokens=True)
    assert content.line_tokens[head:head + len(plain.lines)] == plain.line_tokens
    q = "In difflib's get_close_matches, what happens when n is 0 or negative?"
    raw = Compressor().compress(plain, RequestSpec(q, 0, "tool-call"), plain.total_tokens, False, "tool")
    out = Compressor().compress(tt, RequestSpec(q, 0, "tool-call"), tt.total_tokens, False, "tool")
    assert [(u.start_line - head, u.end_line - head) for u in out.analysis.units][1:-1] == \
        [(u.start_line, u.end_line) for u in raw.analysis.units][1:-1]
    assert sum(u.tokens for u in out.analysis.units) == tt.total_tokens > 1.2 * plain.total_tokens
