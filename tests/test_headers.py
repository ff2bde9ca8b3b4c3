"""The ``X-PFlash-*`` headers are public API: ``pflash_proxy.headers`` names each one, docs/reference.md's table lists
exactly those, and the code spells them through the module's constants, not as string literals."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pflash_proxy import headers

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pflash_proxy"
# stages/sessions.py is being rewritten on another branch; it moves to the constants when that lands
NOT_YET_CONVERTED: set[str] = set()


def test_all_names_every_header_constant_once():
    constants = {name: value for name, value in vars(headers).items() if name.endswith("_HEADER")}
    assert sorted(headers.ALL) == sorted(constants.values()), "a new header: add its constant to headers.ALL"
    assert len(set(headers.ALL)) == len(headers.ALL)
    assert all(h.startswith(headers.PREFIX) for h in headers.ALL)


def _doc_table() -> list[str]:
    text = (ROOT / "docs" / "reference.md").read_text()
    block = text[text.index("| Header | On | Says |"):].split("\n\n", 1)[0]
    return [m.group(1) for line in block.splitlines()[2:] if (m := re.match(r"\| `([^`]+)` \|", line))]


def test_the_reference_table_lists_exactly_the_modules_headers():
    rows = _doc_table()
    assert len(rows) == len(set(rows)), "a header listed twice in docs/reference.md"
    assert sorted(rows) == sorted(headers.ALL), \
        "docs/reference.md's headers table and pflash_proxy/headers.py disagree: a header added or removed in one"


def _literal_headers(path: Path, root: Path = PACKAGE) -> list[str]:
    """The string literals in ``path`` that are a header name of ours or its prefix (docstrings and prose aside)."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted(f"{path.relative_to(root)}:{node.lineno}: {node.value}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and re.fullmatch(r"x-pflash(-[\w-]*)?", node.value, re.IGNORECASE))


def test_the_code_names_headers_through_the_module():
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) if p != PACKAGE / "headers.py"
             and str(p.relative_to(PACKAGE)) not in NOT_YET_CONVERTED for hit in _literal_headers(p)]
    assert found == [], "spell an X-PFlash-* header with pflash_proxy.headers' constant (add one there if it is new)"


def test_the_literal_scan_finds_a_header_name(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text('"""Sets ``X-PFlash-Mode``."""\nh = {"X-PFlash-Mode": 1}\nprefix = "x-pflash"\n'
                      'prose = "X-PFlash-Mode says"\n')
    assert _literal_headers(sample, tmp_path) == ["m.py:2: X-PFlash-Mode", "m.py:3: x-pflash"]
