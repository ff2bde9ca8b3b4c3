"""The unit that defines a name the question spells out is always kept (agents asking about one function)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from bisect import bisect_right

import numpy as np
import pytest

from pflash_proxy.compress.named import _block_end, definitions, named_definitions, named_units, owners
from pflash_proxy.compress.pipeline import NAMED_SHARE, CompressionSettings, Compressor, named_keep
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
    assert len(named_units(classes, cunits, "what is Node1?")) == 1


# --- names that several classes define -------------------------------------------------------------------------

class HideLines:
    """Scores 0 for every unit overlapping ``lines`` (0-based), 1 elsewhere: only a name can keep those."""

    name = "hide"

    def __init__(self, lines):
        self.lines = set(lines)

    def represent(self, tt, units):
        return type("Reps", (), {"n_units": len(units), "units": units})()

    def score(self, reps, request):
        return np.array([0.0 if self.lines & set(range(u.start_line, u.end_line)) else 1.0 for u in reps.units])


def _method_lines(src: str, owner: str, name: str) -> tuple[int, int]:
    """0-based [first, end) lines of ``owner.name`` in ``src`` (decorators included), from ``ast``."""
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner)
    fn = next(n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)
    return min([fn.lineno] + [d.lineno for d in fn.decorator_list]) - 1, fn.end_lineno


def _served_whole(out, tt, first: int, end: int) -> bool:
    return "".join(tt.lines[first:end]) in out.text


def _compress(tt, question, scorer, ratio=0.2):
    comp = Compressor(CompressionSettings(threshold=256, curve=f"1000:{ratio} 100000:{ratio}"), scorer=scorer)
    return comp.compress(tt, RequestSpec(question, 0, "tool-call"), tt.total_tokens, True, "tool", "1")


@pytest.mark.parametrize("question", [
    "What does {o}.__setitem__ do?", "Explain `{o}::__setitem__`.", "Where is {o}#__setitem__ used?",
    "Walk me through the `__setitem__` method of `{o}`.", "What does {o}'s __setitem__ do with the key?"])
@pytest.mark.parametrize("owner", ["OrderedDict", "ChainMap", "UserDict", "UserList"])
def test_qualified_dunder_is_kept_whatever_other_classes_define_it(python_source, owner, question):
    """collections defines ``__setitem__`` in four classes: the one the question qualifies is served whole."""
    tt = TokenizedText.from_text(python_source)
    first, end = _method_lines(python_source, owner, "__setitem__")
    out = _compress(tt, question.format(o=owner), HideLines(range(first, end)))
    if "used?" in question and out.mode == "full-flat":  # asks for every use: whole, or with every match
        assert out.text == tt.text and "every match" in out.reason  # (issue 48; its name is in 4 classes' units)
        return
    assert out.mode == "compressed" and out.units_kept < out.units_in
    assert _served_whole(out, tt, first, end)
    starts = [u.start_line for u in out.analysis.units]
    assert bisect_right(starts, first) - 1 in out.analysis.named  # kept because it is named, not by chance
    others = [_method_lines(python_source, o, "__setitem__") for o in ("OrderedDict", "ChainMap", "UserDict",
                                                                       "UserList") if o != owner]
    for a, _ in others:  # the other classes' __setitem__ are not named
        assert bisect_right(starts, a) - 1 not in out.analysis.named


PARSERS = '''"""Message framing for a small line protocol: requests go out, responses come back."""

import json


class ProtocolError(Exception):
    """A frame that cannot be read."""


class RequestParser:
    """Reads the frames a client sends: a verb, headers, then a JSON body."""

    def __init__(self, max_size=65536):
        self.max_size = max_size
        self.headers = {}

    def __setitem__(self, name, value):
        if not name.isidentifier():
            raise ProtocolError(f"bad request header {name!r}")
        self.headers[name.lower()] = value

    def parse_message(self, frame):
        verb, _, rest = frame.partition(" ")
        if verb not in ("GET", "PUT", "DELETE"):
            raise ProtocolError(f"unknown verb {verb!r}")
        head, _, body = rest.partition("\\n\\n")
        for line in head.splitlines():
            key, _, value = line.partition(":")
            self[key.strip()] = value.strip()
        return verb, json.loads(body or "null")


class ResponseParser:
    """Reads the frames a server sends back: a status code, headers, then a chunked body."""

    def __init__(self, max_size=65536):
        self.max_size = max_size
        self.headers = {}

    def __setitem__(self, name, value):
        if name.lower() == "content-length" and int(value) > self.max_size:
            raise ProtocolError("response too large")
        self.headers[name.lower()] = value

    def parse_message(self, frame):
        status, _, rest = frame.partition(" ")
        head, _, body = rest.partition("\\n\\n")
        for line in head.splitlines():
            key, _, value = line.partition(":")
            self[key.strip()] = value.strip()
        chunks = []
        while body:
            size, _, body = body.partition("\\r\\n")
            n = int(size, 16)
            if n == 0:
                break
            chunks.append(body[:n])
            body = body[n + 2:]
        return int(status), "".join(chunks)
'''


def _parsers(filler: int = 40) -> str:
    """PARSERS followed by ``filler`` helper functions, so there is something to leave out."""
    helpers = "".join(f"\n\ndef helper_{i}(frame, limit={i}):\n    \"\"\"Trim frame {i}.\"\"\"\n"
                      f"    parts = frame.split(\",\")[:limit]\n    return \",\".join(p.strip() for p in parts)\n"
                      for i in range(filler))
    return PARSERS + helpers


@pytest.mark.parametrize("question, owner", [
    ("What does ResponseParser.parse_message return?", "ResponseParser"),
    ("What does RequestParser.__setitem__ check?", "RequestParser"),
    ("How does parse_message of the response parser read a chunked body?", "ResponseParser"),
    ("Which verbs does the request parser's parse_message accept?", "RequestParser"),
    ("What does __setitem__ do in ResponseParser?", "ResponseParser"),
])
def test_two_classes_the_question_points_to_one(question, owner):
    """Two parsers define ``__setitem__`` and ``parse_message``: the qualified one or the one the other words point
    to is named, the other is not."""
    src = _parsers()
    tt = TokenizedText.from_text(src)
    name = "parse_message" if "parse_message" in question else "__setitem__"
    first, end = _method_lines(src, owner, name)
    other = "RequestParser" if owner == "ResponseParser" else "ResponseParser"
    o_first, o_end = _method_lines(src, other, name)
    units = UnitSegmenter(1, 512).segment(tt)
    starts = [u.start_line for u in units]
    found = named_definitions(tt, units, question)
    assert bisect_right(starts, first) - 1 in found.named
    assert bisect_right(starts, o_first) - 1 not in found.named and not found.optional
    out = _compress(tt, question, HideLines(range(first, end)))
    assert out.mode == "compressed" and _served_whole(out, tt, first, end)


def test_a_name_several_classes_define_keeps_them_all_within_the_named_share(python_source):
    """"What does __setitem__ do?" says no class: every definition is kept while they fit the named share."""
    tt = TokenizedText.from_text(python_source)
    spans = [_method_lines(python_source, o, "__setitem__") for o in ("OrderedDict", "ChainMap", "UserDict",
                                                                       "UserList")]
    hidden = [k for a, b in spans for k in range(a, b)]
    out = _compress(tt, "What does __setitem__ do?", HideLines(hidden), ratio=0.3)
    assert out.mode == "compressed" and out.units_kept < out.units_in
    assert all(_served_whole(out, tt, a, b) for a, b in spans)
    assert not out.analysis.named and len(out.analysis.named_optional) == 4
    # a budget whose named share holds none of them keeps none (the scorer's own choice decides)
    toks = np.array([u.tokens for u in out.analysis.units])
    dens = np.zeros(len(toks))
    smallest = min(int(toks[list(d)].sum()) for d in out.analysis.named_optional)
    assert named_keep(frozenset(), out.analysis.named_optional, toks, dens, int(smallest / NAMED_SHARE) - 1) == set()
    assert len(named_keep(frozenset(), out.analysis.named_optional, toks, dens, 10 ** 6)) >= 4


def test_owners_from_indentation_receivers_and_impl_blocks():
    go = TokenizedText.from_text("type Store struct {\n\titems map[string]int\n}\n\n"
                                 "func (s *Store) Pop(key string) int {\n\treturn s.items[key]\n}\n\n"
                                 "func (q Queue) Pop() int {\n\treturn 0\n}\n")
    assert {go.lines[i].split("(")[1].split(")")[0]: o for i, o in owners(go.lines, definitions(go)).items()} == {
        "s *Store": "Store", "q Queue": "Queue"}
    rust = TokenizedText.from_text("struct Store;\n\nimpl Store {\n    fn pop(&mut self) {}\n}\n\n"
                                   "impl Drop for Queue {\n    fn pop(&mut self) {}\n}\n")
    own = owners(rust.lines, definitions(rust))
    assert sorted(own.values()) == ["Queue", "Store"]
    units = UnitSegmenter(1, 512).segment(rust)
    found = named_definitions(rust, units, "What does Store::pop do?")
    lines = {k for u in units if u.index in found.named for k in range(u.start_line, u.end_line)}
    assert 3 in lines and 7 not in lines  # Store's pop, not Queue's


def test_a_named_method_keeps_its_decorators():
    src = ("class Store:\n" + "".join(f"    def helper_{i}(self):\n        return {i}\n\n" for i in range(30))
           + "    @property\n    @functools.cache\n    def json_path(self) -> str:\n        path = '$'\n"
           + "        return path\n" + "".join(f"\n    def other_{i}(self):\n        return {i}\n" for i in range(30)))
    tt = TokenizedText.from_text(src)
    units = UnitSegmenter(32, 64).segment(tt)  # small units: the decorators end the unit before the def line's
    found = named_definitions(tt, units, "In Store.json_path, what happens step by step?")
    lines = {k for u in units if u.index in found.named for k in range(u.start_line, u.end_line)}
    at = next(i for i, line in enumerate(tt.lines) if "@property" in line)
    assert {at, at + 1, at + 2, at + 4} <= lines


def test_a_comment_at_column_0_inside_a_method_does_not_end_it():
    """pexpect's pxssh.__init__ has commented-out lines at column 0 in its body: the method runs past them."""
    src = ("class pxssh (spawn):\n" + "".join(f"    def helper_{i}(self):\n        return {i}\n\n" for i in range(20))
           + "    def __init__ (self, timeout=30):\n        self.opts = ('-o a'\n                + ' -o b')\n"
           + "# Disabling host key checking, makes you vulnerable to MITM attacks.\n"
           + "#                + \" -o 'StrictHostKeyChecking=no'\"\n"
           + "        self.force_password = False\n        self.debug_command_string = False\n\n"
           + "# a section comment before the next method\n"
           + "".join(f"    def other_{i}(self):\n        return {i}\n\n" for i in range(20)))
    tt = TokenizedText.from_text(src)
    units = UnitSegmenter(8, 40).segment(tt)
    found = named_definitions(tt, units, "How does pxssh.__init__ work, and what does it return?")
    lines = {k for u in units if u.index in found.named for k in range(u.start_line, u.end_line)}
    end = next(i for i, line in enumerate(tt.lines) if "debug_command_string" in line)
    assert end in lines
    start = next(i for i, line in enumerate(tt.lines) if "def __init__" in line)
    assert _block_end(tt.lines, start) == end + 1  # nor does the section comment after it belong to it
