"""The code-reads generator: gold spans as ``ast`` gives them, kinds in equal shares, split by package, described
questions that spell no identifier, the read shapes with their line numbers (no llama-server needed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from evals.code_reads import generator as g
from evals.code_reads.run import OPENCODE_FOOT, OPENCODE_HEAD, gold_block, render
from pflash_proxy.compress.gutter import find_gutter
from pflash_proxy.compress.text import split_lines

from .code_reads_site import PACKAGES, make_site

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return make_site(tmp_path_factory.mktemp("code-reads"))


@pytest.fixture(scope="module")
def cases(site):
    return g.generate(site, seed=3)


def _node(text: str, qualname: str) -> ast.FunctionDef:
    tree = ast.parse(text)
    cls, _, name = qualname.rpartition(".")
    body = tree.body
    if cls:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def test_gold_spans_are_the_definitions_as_ast_gives_them(site, cases):
    assert cases
    decorated = 0
    for c in cases:
        text = (site / c.path).read_text()
        node = _node(text, c.qualname)
        first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        assert c.span == (first, node.end_lineno), c.case_id
        lines = text.split("\n")
        assert lines[c.span[0] - 1].lstrip().startswith("@" if node.decorator_list else ("def ", "async def "))
        decorated += bool(node.decorator_list)
        # a multi-line decorator starts the span: its first line, not the def's
        if node.decorator_list and node.decorator_list[0].end_lineno != node.decorator_list[0].lineno:
            assert c.span[0] < node.lineno - 1
    assert decorated > 0


def test_files_and_packages_left_out(site, cases):
    paths = {c.path for c in cases}
    assert not any("/tests/" in p or "/_vendor/" in p or p.endswith("small.py") for p in paths)
    assert not any(c.package == "jinja2" for c in cases)  # the agent-read study of 19528cf read it
    assert {c.package for c in cases} == {f"{s}pkg" for s in PACKAGES}
    assert all(g.MIN_CHARS <= c.file_chars <= g.MAX_CHARS for c in cases)


def test_kinds_in_equal_shares_capped_per_package_and_deterministic(site, cases):
    kinds = [c.kind for c in cases]
    assert {k: kinds.count(k) for k in g.KINDS} == {k: len(cases) // 3 for k in g.KINDS}
    per_package = {p: sum(c.package == p for c in cases) for p in {c.package for c in cases}}
    assert max(per_package.values()) <= 3 * g.PER_KIND
    assert kinds[:3] == list(g.KINDS)  # interleaved: a --limit run keeps the shares
    assert [c.case_id for c in g.generate(site, seed=3)] == [c.case_id for c in cases]
    assert [c.case_id for c in g.generate(site, seed=4)] != [c.case_id for c in cases]
    qualified = [c for c in cases if c.kind == "qualified"]
    assert all(c.cls and c.question.count(f"{c.cls}.{c.name}") == 1 for c in qualified)
    assert any(c.shared and c.name.startswith("__") for c in qualified)  # dunders
    assert any(c.shared and not c.name.startswith("__") for c in qualified)  # a name two classes define
    assert all(re.search(rf"\b{re.escape(c.name)}\b", c.question) for c in cases if c.kind == "named")


def test_split_is_by_package(site, cases):
    splits: dict[str, set[str]] = {}
    for c in cases:
        splits.setdefault(c.package, set()).add(c.split)
        assert c.split == g.split_of(c.package)
    assert all(len(s) == 1 for s in splits.values())  # no package in both
    assert {s for v in splits.values() for s in v} == {"train", "test"}
    test = g.generate(site, seed=3, split="test")
    train = g.generate(site, seed=3, split="train")
    assert {c.package for c in test}.isdisjoint({c.package for c in train})
    assert len(test) + len(train) == len(cases)
    # the hash of the normalised name, not of the spelling or the machine
    assert g.split_of("Foo_Bar") == g.split_of("foo-bar") == g.split_of("foo.bar")


# ----------------------------------------------------------------------------------------------- leaks


def _parts(name: str) -> list[str]:
    out = []
    for piece in name.split("_"):
        out += [p.lower() for p in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", piece)]
    return out


def spelled(question: str, text: str, qualname: str) -> list[str]:
    """Written apart from the generator: every identifier of the function's AST (its own name, arguments,
    attributes, names, keywords), its class's name and the file's definition names that the question spells,
    as a word (case-insensitive, unsplit) or as its words in a row; and any word of the function's or its
    class's own name."""
    tree = ast.parse(text)
    fn = _node(text, qualname)
    cls = qualname.rpartition(".")[0]
    names = {cls} if cls else set()
    for n in ast.walk(fn):
        names.update(v for v in (getattr(n, "id", None), getattr(n, "attr", None), getattr(n, "arg", None),
                                 getattr(n, "name", None)) if isinstance(v, str))
    names |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                              ast.ClassDef))}
    tokens = re.findall(r"[a-z0-9_]+", question.lower())
    pieces = [p for t in tokens for p in t.split("_") if p]
    joined = " " + " ".join(pieces) + " "
    own = set(_parts(fn.name)) | set(_parts(cls))
    bad = {t for t in pieces if t in own}
    for name in names - {""}:
        low = name.lower()
        if low in tokens or low.strip("_") in tokens or "".join(_parts(name)) in tokens:
            bad.add(name)
        parts = _parts(name)
        if len(parts) > 1 and f" {' '.join(parts)} " in joined:
            bad.add(name)
    return sorted(bad)


def test_no_identifier_leaks_into_a_described_question(site, cases):
    described = [c for c in cases if c.kind == "described"]
    assert described
    for c in described:
        assert spelled(c.question, (site / c.path).read_text(), c.qualname) == [], c.question
    # the checker would catch a leak: the named and qualified questions all spell their function
    for c in cases:
        if c.kind != "described":
            assert spelled(c.question, (site / c.path).read_text(), c.qualname), c.question


def test_no_identifier_leaks_on_installed_packages():
    """The same check on real third-party code: the packages aiohttp brings with it, installed for the proxy."""
    site = g.site_packages()
    only = {"aiohttp", "multidict", "yarl", "attrs", "frozenlist", "aiosignal", "propcache", "diskcache",
            "prometheus-client"}
    cases = [c for c in g.generate(site, seed=0, only=only) if c.kind == "described"]
    assert len(cases) >= 6
    for c in cases:
        assert spelled(c.question, (site / c.path).read_text(), c.qualname) == [], (c.case_id, c.question)


# ----------------------------------------------------------------------------------------------- shapes


SRC = "import os\n\n\ndef f(a):\n    return a\n\n\nclass K:\n    pass\n"


@pytest.mark.parametrize("shape,form", [("claude", "N<TAB>"), ("opencode", "N: "), ("cat", None)])
def test_shapes_number_the_lines_as_the_clients_do(shape, form):
    out = render(SRC, shape, "/work/pkg/mod.py")
    lines = out.split("\n")
    if shape == "claude":
        assert lines[:4] == ["1\timport os", "2\t", "3\t", "4\tdef f(a):"] and len(lines) == 9
    elif shape == "opencode":
        assert lines[:4] == ["<path>/work/pkg/mod.py</path>", "<type>file</type>", "<content>", "1: import os"]
        assert lines[-3:] == ["", "(End of file - total 9 lines)", "</content>"]
        assert "5:     return a" in lines
    else:
        assert out == SRC
    g_ = find_gutter(split_lines(out))
    assert (g_.form if g_ is not None else None) == form  # the proxy reads the numbers the way it is printed
    block = gold_block(SRC, (4, 5), shape)
    assert block in out
    assert block.split("\n") == {"claude": ["4\tdef f(a):", "5\t    return a"],
                                 "opencode": ["4: def f(a):", "5:     return a"],
                                 "cat": ["def f(a):", "    return a"]}[shape]


def test_the_opencode_wrapper_is_the_one_the_gutter_tests_know():
    from tests.compress.test_gutter import FORMATS

    _, head, foot, _ = FORMATS["opencode"]
    assert OPENCODE_HEAD.format(path="/work/src/FILE") == head
    assert OPENCODE_FOOT.format(n="TOTAL") == foot
