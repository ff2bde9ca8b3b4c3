"""The package's shape (issue 27): the contract at the bottom, no lower package reaching up into the server, no
stage probed for hooks it does not declare, the stage modules gone from the package root."""

from __future__ import annotations

import ast
from pathlib import Path

import pflash_proxy

PACKAGE = Path(pflash_proxy.__file__).parent
LOWER = ("sessions", "compress", "drafter", "stages")  # packages that must not import the server


def _imports(path: Path, *, runtime_only: bool = False) -> set[str]:
    """Every module ``path`` imports (lazy imports in functions included; with ``runtime_only``, not those under
    ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for n in ast.walk(node))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_no_lower_package_imports_the_server():
    offenders = [f"{p.relative_to(PACKAGE)}: {m}" for pkg in LOWER for p in sorted((PACKAGE / pkg).rglob("*.py"))
                 for m in sorted(_imports(p)) if m == "pflash_proxy.server" or m.startswith("pflash_proxy.server.")]
    assert offenders == []


def test_the_contract_imports_nothing_of_the_project_at_run_time():
    project = [m for m in _imports(PACKAGE / "contract.py", runtime_only=True) if m.startswith("pflash_proxy")]
    assert project == []


def test_no_stage_is_probed_for_undeclared_hooks():
    hits = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "getattr(stage" in p.read_text()]
    assert hits == []


def test_the_stage_modules_left_the_package_root():
    assert not (PACKAGE / "compress_stage.py").exists() and not (PACKAGE / "drafter_setup.py").exists()
    assert {p.name for p in (PACKAGE / "stages").glob("*.py")} >= {"__init__.py", "sessions.py", "chains.py",
                                                                  "compress.py", "scorers.py"}
    assert (PACKAGE / "py.typed").is_file()
