"""The package's shape: no import cycle; the contract, the configuration and the engine seam at the bottom; no
lower package reaching up into the server; stages that talk through the request's typed fields, never importing
each other; an inspector that only reads; no stage probed for hooks it does not declare, the stage modules gone
from the package root, and llama-server's wire vocabulary kept to ``llama/`` (no module that does not spell it yet
may start to)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pflash_proxy

PACKAGE = Path(pflash_proxy.__file__).parent
LOWER = ("sessions", "compress", "drafter", "stages")  # packages that must not import the server


def _package_of(path: Path) -> str:
    """The package a module's relative imports start from: its own name for an ``__init__``, else its parent's."""
    parts = list(path.with_suffix("").parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == PACKAGE.name:
            parts = parts[i:]
            break
    return ".".join(parts[:-1])


def _from_module(node: ast.ImportFrom, path: Path) -> str | None:
    """The absolute module of ``from <module> import ...``: ``from .x import y`` in ``pflash_proxy/a/b.py`` is
    ``pflash_proxy.a.x``, ``from .. import y`` there is ``pflash_proxy``; ``None`` where it climbs above the top."""
    if node.level == 0:
        return node.module
    base = _package_of(path).split(".")
    if node.level - 1 >= len(base):
        return None
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(path: Path, *, runtime_only: bool = False) -> set[str]:
    """Every module ``path`` imports, relative imports as absolute names (lazy imports in functions included; with
    ``runtime_only``, not those under ``if TYPE_CHECKING:``)."""
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
        elif isinstance(node, ast.ImportFrom) and (module := _from_module(node, path)):
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The module of the package that an imported name lives in (``a.b.c`` → ``a.b`` when ``c`` is a name in it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _runtime_targets(path: Path) -> set[str]:
    """The package's modules ``path`` imports when it runs: ``from a.b import c`` is module ``a.b.c`` when there is
    one, else ``a.b`` (the name is defined there)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    out: set[str | None] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(_resolve(a.name) for a in node.names if a.name.startswith("pflash_proxy"))
        elif isinstance(node, ast.ImportFrom) and (module := _from_module(node, path)) \
                and module.startswith("pflash_proxy"):
            out.update(f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else _resolve(module)
                       for a in node.names)
    return {t for t in out if t is not None}


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports when it runs: at the top and inside functions (lazy imports
    included), not those under ``if TYPE_CHECKING:`` (annotations only: they never execute)."""
    return {name: _runtime_targets(path) - {name} for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycles():
    """No module reaches itself through what it imports, lazily or not; nor any top-level package
    (``cli`` → ``bench`` → ``cli``)."""
    graph = import_graph()
    assert cycles(graph) == [], "an import cycle: break it (a lazy import is still an import here)"

    def top(name: str) -> str:
        return ".".join(name.split(".")[:2])
    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        packages.setdefault(top(name), set()).update(top(t) for t in targets if top(t) != top(name))
    assert cycles(packages) == []


def test_the_session_layer_has_no_cycle_even_through_annotations():
    """``sessions/`` imports nothing that imports it back, counting the imports under ``if TYPE_CHECKING:`` too
    (``slots`` once named ``manager.SlotsPrefetch`` so; the index's backends import ``index.base``, never the
    package that picks them)."""
    session = {name: path for name, path in MODULES.items() if name.startswith("pflash_proxy.sessions")}
    graph = {name: {t for t in (_resolve(m) for m in _imports(path)) if t in session and t != name}
             for name, path in session.items()}
    assert cycles(graph) == []


def test_the_cycle_scan_sees_lazy_imports_and_skips_type_only_ones():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    # relative imports count, as the absolute module they name (``intent`` imports ``from .forms import ...``)
    assert "pflash_proxy.compress.forms" in graph["pflash_proxy.compress.intent"]
    # stages/__init__ imports its stages inside ``default_stages`` only
    assert "pflash_proxy.stages.sessions" in graph["pflash_proxy.stages"]
    # the contract names the session layer's types under ``if TYPE_CHECKING:`` only
    assert not any(t.startswith("pflash_proxy.sessions") for t in graph["pflash_proxy.contract"])


def test_the_import_scan_resolves_relative_imports(tmp_path):
    """``from .x import y`` is ``<the file's package>.x``, each dot above the first one package up; an
    ``__init__``'s package is its own."""
    package = tmp_path / "pflash_proxy" / "a"
    package.mkdir(parents=True)
    module = package / "b.py"
    module.write_text("import os\nfrom .c import d\nfrom .. import e\n"
                      "def f():\n    from ..g.h import i\n")
    assert _imports(module) == {"os", "pflash_proxy.a.c", "pflash_proxy.a.c.d", "pflash_proxy", "pflash_proxy.e",
                                "pflash_proxy.g.h", "pflash_proxy.g.h.i"}
    init = package / "__init__.py"
    init.write_text("from .b import f\nfrom . import c\n")
    assert _imports(init) == {"pflash_proxy.a.b", "pflash_proxy.a.b.f", "pflash_proxy.a", "pflash_proxy.a.c"}


LAB = PACKAGE.parent / "evals"  # the relevance lab: in the repository, not in the wheel


def test_the_package_never_imports_the_relevance_lab():
    """``evals/`` (the evals, the code-reads bench, their cases, the every-X classifier's trainer and dev data) is
    not installed: the lab imports the package, no module of the package imports the lab, lazily or not, and no
    package data is left of it."""
    assert (LAB / "__main__.py").is_file()
    found = {str(p.relative_to(PACKAGE)): sorted(n for n in _imports(p) if n.split(".")[0] == LAB.name)
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
    assert not (PACKAGE / "bench" / "evals").exists() and not (PACKAGE / "bench" / "code_reads").exists()
    assert [p.name for p in (PACKAGE / "bench").rglob("*.json")] == [], "the bench's data lives in evals/"
    assert [p.name for p in (PACKAGE / "compress").glob("*.json")] == ["intent.json"], \
        "compress/ ships the intent classifier's weights only; its training data lives in evals/"


def test_the_relevance_lab_scan_sees_lazy_imports(tmp_path):
    sample = tmp_path / "pflash_proxy" / "m.py"
    sample.parent.mkdir()
    sample.write_text("def f():\n    import evals.common\n    from evals import code_tasks\n")
    assert {"evals.common", "evals", "evals.code_tasks"} <= _imports(sample)


def test_no_lower_package_imports_the_server():
    offenders = [f"{p.relative_to(PACKAGE)}: {m}" for pkg in LOWER for p in sorted((PACKAGE / pkg).rglob("*.py"))
                 for m in sorted(_imports(p)) if m == "pflash_proxy.server" or m.startswith("pflash_proxy.server.")]
    assert offenders == []


# Modules that import nothing of the project (test_leaf_modules_import_nothing_of_the_project): any module, the
# contract too, may import them without pulling the project in.
LEAF_MODULES = {"pflash_proxy.headers"}


def test_leaf_modules_import_nothing_of_the_project():
    found = {leaf: sorted(m for m in _imports(MODULES[leaf]) if m.startswith("pflash_proxy")) for leaf in LEAF_MODULES}
    assert {k: v for k, v in found.items() if v} == {}, \
        "a module in LEAF_MODULES is imported by the contract and everything else: keep it free of the project"


def test_the_contract_imports_nothing_of_the_project_at_run_time():
    project = [m for m in _imports(PACKAGE / "contract.py", runtime_only=True)
               if m.startswith("pflash_proxy") and _resolve(m) not in LEAF_MODULES]
    assert project == [], ("the contract is what every stage and the server import: it must not pull the project in "
                           "at run time; name such types under `if TYPE_CHECKING:` (CONTRACT_ANNOTATIONS)")


# What the contract names in annotations only (``if TYPE_CHECKING:``): the types the stages hand each other. It may
# only shrink.
# the types the contract's annotations name: the sans-IO layers under it (``compress``: the recall source a
# compressed turn keeps) and the session service's turn and records
CONTRACT_ANNOTATIONS = {"pflash_proxy.compress", "pflash_proxy.dialects", "pflash_proxy.engine",
                        "pflash_proxy.jsontypes", "pflash_proxy.sessions.index", "pflash_proxy.sessions.service"}


def test_the_contract_names_no_stage_server_or_inspector_type():
    named = {_resolve(m) for m in _imports(PACKAGE / "contract.py") if m.startswith("pflash_proxy")} - LEAF_MODULES
    assert named <= CONTRACT_ANNOTATIONS, (sorted(named - CONTRACT_ANNOTATIONS), "the contract may name only the "
                                           "types the stages hand each other; this set may only shrink")


def test_the_request_carries_typed_fields_not_a_dict_of_names():
    """Stages hand each other what they found through typed fields (mitmproxy's typed hooks), not a string-keyed
    scratch dict; the request's fields are grouped by who writes them (the conversation, the stages' notes,
    another node serving it, the server's relay plumbing), and the request stays small."""
    from dataclasses import fields

    from pflash_proxy.contract import ProxyRequest, StageNotes

    names = {f.name for f in fields(ProxyRequest)}
    assert "state" not in names and {"dialogue", "notes", "forward", "relay"} <= names, \
        "stages hand each other typed parts of the request, not a scratch dict: keep ProxyRequest's parts grouped"
    # the session's turn lease in a shared index: the session service's Turn holds it
    assert {f.name for f in fields(StageNotes)} == {"session", "chain", "compression", "turn"}, \
        ("StageNotes is what one stage hands the later ones, each field set by one stage: for a new stage note, add "
         "it here and a comment naming its stage in contract.StageNotes; a field no stage sets any more goes")
    assert len(names) <= 17, (sorted(names), "ProxyRequest stays small: put a new field in the part that writes it "
                              "(dialogue, notes, forward, relay) rather than on the request itself")


def test_no_stage_module_imports_another():
    """A stage reads what another found from the request (``ProxyRequest.session``...), whose types the contract
    holds: no module of ``stages/`` that defines a stage imports another such module, not even for a type."""
    stages = {_module_name(p) for p in (PACKAGE / "stages").glob("*.py") if defines_a_stage(p)}
    assert {"pflash_proxy.stages.sessions", "pflash_proxy.stages.compress", "pflash_proxy.stages.savings"} <= stages, \
        "the scan no longer sees the known stages: defines_a_stage or the stages' layout changed"
    found = {name: sorted({t for m in _imports(MODULES[name]) if (t := _resolve(m)) in stages - {name}})
             for name in sorted(stages)}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_inspector_only_reads():
    """The inspector imports neither the stages nor ``llama/`` (not even for a type), and defines no stage: the
    traces it shows are built in ``sessions.traces`` and written by ``stages.savings``."""
    paths = sorted((PACKAGE / "inspector").rglob("*.py"))
    found = {str(p.relative_to(PACKAGE)): sorted(m for m in _imports(p)
                                                 if m.startswith(("pflash_proxy.stages", "pflash_proxy.llama")))
             for p in paths}
    assert {k: v for k, v in found.items() if v} == {}
    assert not [p for p in paths if defines_a_stage(p)]


def test_the_configuration_imports_only_the_compress_package_of_the_project():
    """``config`` sits under everything that reads settings: the scorer registry (``stages/``) and the rest above
    it check their own values; no import of a package above, lazy or not."""
    project = {m for m in _imports(PACKAGE / "config.py") if m.startswith("pflash_proxy")}
    above = {m for m in project if not m.startswith("pflash_proxy.compress")}
    assert above == set(), sorted(above)


def test_no_stage_is_probed_for_undeclared_hooks():
    hits = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "getattr(stage" in p.read_text()]
    assert hits == []


def test_the_stage_modules_left_the_package_root():
    assert not (PACKAGE / "compress_stage.py").exists() and not (PACKAGE / "drafter_setup.py").exists()
    assert {p.name for p in (PACKAGE / "stages").glob("*.py")} >= {"__init__.py", "sessions.py", "chains.py",
                                                                  "compress.py", "scorers.py"}
    assert (PACKAGE / "py.typed").is_file()


def test_the_engine_seam_imports_nothing_of_the_project_but_the_errors():
    """Not even for a type: the engine seam sits under everything that talks to a model."""
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        project = {m for m in _imports(path) if m.startswith("pflash_proxy")}
        above = {m for m in project if not m.startswith(("pflash_proxy.errors", "pflash_proxy.engine"))}
        assert above == set(), path


# llama-server's wire fields and routes, and the transport's helpers for its API: only ``llama/`` may use them.
WIRE = ("id_slot", "cache_n", "/slots", "/tokenize", "n_predict")
UPSTREAM_API = ("tokenize", "input_tokens", "slot_action", "slots", "props", "call")
# Modules that still use them, to move onto ``engine.Engine`` / ``engine.Slots``: an entry may only shrink.
NOT_YET_ON_THE_SEAM = {
}
# Stored names, not the wire: version 1 of the inspector's traces kept a turn's counts under llama-server's
# ``timings`` names; the trace codec renames them when it reads one (``sessions.traces.TRACE_NAMES_V1``), and
# nothing writes them.
STORED_NAMES = {"sessions/traces.py": {"cache_n"}}


# each field as a word of its own (not inside ``invalid_slot_id``), each route after a host or at a path's start
# (not inside ``HOME/slots``)
_WIRE_WORD = {w: re.compile((r"(?<![A-Za-z])" if w.startswith("/") else r"(?<!\w)") + re.escape(w) + r"(?!\w)")
              for w in WIRE}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def wire_spellings(path: Path) -> set[str]:
    """The wire fields ``path`` spells in code (strings other than docstrings, names, attributes, keywords), and
    the ``Upstream`` API helpers it calls (``<...>.upstream.<helper>``), as ``upstream.<helper>``."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.update(w for w in WIRE if _WIRE_WORD[w].search(node.value))
        elif isinstance(node, ast.Name) and node.id in WIRE:
            out.add(node.id)
        elif isinstance(node, ast.keyword) and node.arg in WIRE:
            out.add(node.arg)
        elif isinstance(node, ast.Attribute):
            if node.attr in WIRE:
                out.add(node.attr)
            owner = node.value
            named = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if named == "upstream" and node.attr in UPSTREAM_API:
                out.add(f"upstream.{node.attr}")
    return out


def test_no_module_outside_llama_starts_to_spell_llama_servers_wire_fields():
    found = {str(p.relative_to(PACKAGE)): wire_spellings(p) for p in sorted(PACKAGE.rglob("*.py"))
             if p.relative_to(PACKAGE).parts[0] != "llama"}
    allowed = {m: NOT_YET_ON_THE_SEAM.get(m, set()) | STORED_NAMES.get(m, set()) for m in found}
    grown = {m: sorted(w - allowed[m]) for m, w in found.items() if w - allowed[m]}
    assert grown == {}, "use pflash_proxy.engine (Engine, Slots) instead of llama-server's wire fields"
    assert not any(found[str(p.relative_to(PACKAGE))] for p in (PACKAGE / "engine").rglob("*.py"))


def test_the_wire_field_scan_sees_code_and_not_prose(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Mentions id_slot and /slots in prose."""\n# and cache_n in a comment\n'
                      "def f(req, self):\n"
                      '    """id_slot here too."""\n'
                      '    req.set_field("id_slot", 1)\n'
                      '    help = "default HOME/slots", "invalid_slot_id", "POST /slotsX"\n'
                      "    return self.upstream.tokenize(req), req.timings.cache_n\n")
    assert wire_spellings(sample) == {"id_slot", "cache_n", "upstream.tokenize"}
    routes = tmp_path / "routes.py"
    routes.write_text('URL = "http://127.0.0.1:8080/slots/0?action=erase"\n')
    assert wire_spellings(routes) == {"/slots"}


ISSUE_REFERENCE = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)


def issue_references(path: Path) -> list[str]:
    """``line: text`` of every comment and docstring of ``path`` that points at an issue by number."""
    source = path.read_text()
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    tree = ast.parse(source, str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return [f"{line}: {m.group(0)}" for line, text in found for m in ISSUE_REFERENCE.finditer(text)]


def test_no_comment_or_docstring_points_at_an_issue_number():
    """Comments and docstrings say what the code does and why, not which issue asked for it."""
    found = {str(p.relative_to(PACKAGE)): refs for p in sorted(PACKAGE.rglob("*.py")) if (refs := issue_references(p))}
    assert found == {}


def test_the_issue_reference_scan_sees_comments_and_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Fixed in issue 12."""\nx = "issue 3 in a plain string"  # see Issue #4\n'
                      "def f():\n"
                      '    """as issues 5 and 6 asked"""\n')
    assert issue_references(sample) == ["2: Issue #4", "1: issue 12", "4: issues 5"]


def defines_a_stage(path: Path) -> bool:
    """Whether ``path`` defines a subclass of ``Stage``."""
    return any(isinstance(n, ast.ClassDef) and any(
        (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "") == "Stage"
        for b in n.bases) for n in ast.walk(ast.parse(path.read_text(), str(path))))


def stage_modules() -> list[Path]:
    """Every module of ``stages/`` and every other module that defines a ``Stage`` (the bench's recorders)."""
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.parent == PACKAGE / "stages" or defines_a_stage(p)]


# stage modules whose worker threads run their own CPU work, never an index call (the compressor)
COMPUTE_IN_A_THREAD = {"stages/compress.py"}


def test_the_stages_call_the_session_service_only():
    """No stage reaches behind the service: its scheduler, table, index, cluster node, snapshots or isolation (nor
    the manager that once stood between), and none but those that compute in a worker thread chooses one: the
    session service decides where an index call runs."""
    internals = {"manager", "scheduler", "store", "table", "cluster", "snapshots", "isolation", "watch"}
    modules = {str(p.relative_to(PACKAGE)): p for p in stage_modules()}
    assert {"stages/sessions.py", "stages/chains.py", "stages/compress.py", "stages/savings.py"} <= set(modules), \
        "the scan no longer sees the known stage modules: stage_modules() or the stages' layout changed"
    for name, path in modules.items():
        reached = {n.attr for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Attribute)}
        threads = set() if name in COMPUTE_IN_A_THREAD else {"run_in_executor", "to_thread"}
        assert reached & (internals | threads) == set(), (name, "call the session service (its public methods); a "
                                                          "stage that runs its own CPU work in a thread goes in "
                                                          "COMPUTE_IN_A_THREAD")


def test_the_session_layer_depends_on_the_engine_protocol_only():
    """No module of ``sessions/`` nor the session stages imports ``llama/`` (but its install hint for extras): the
    engine behind them is whatever ``engine.Engine`` the caller hands the session service."""
    paths = [*sorted((PACKAGE / "sessions").rglob("*.py")), PACKAGE / "stages/sessions.py", PACKAGE / "stages/chains.py"]
    for path in paths:
        llama = {m for m in _imports(path) if m.startswith("pflash_proxy.llama")} - {
            "pflash_proxy.llama.extras", "pflash_proxy.llama.extras.install_hint"}
        assert llama == set(), path


# Tests use the session service's public face. A *reach-through* is an attribute access in ``tests/`` that leaves it:
# ``E.name`` where ``E`` is a session service and ``name`` is not one of ``SessionService``'s public names (those its
# class defines without a leading underscore: instance attributes never are), or any ``.manager`` (the manager that
# once stood behind the service). ``E`` is a session service when it is a call of ``session_service``,
# ``SessionService`` or a function annotated ``-> SessionService``; a name or ``self.x`` assigned one (aliases of
# aliases too, within the file); a parameter annotated ``SessionService``; or an attribute that a class of the tests
# declares ``: SessionService`` (``Proxy.service``). A chain counts once, where it leaves the face
# (``svc._scheduler.watch._monitor`` is one). A helper that returns what it reached (``def scheduler(app): return
# session_service(app)._scheduler``) leaks it: every access to what its calls return counts as well, and so does
# every access to a name assigned one. Accesses to a test's own collaborators (an index it injected through the
# constructor, the app's engine) are not reach-throughs. At most ``REACH_THROUGHS_MAX``.
REACH_THROUGHS_MAX = 10
SERVICE_TYPE = "SessionService"
SERVICE_MAKERS = {"session_service", "SessionService"}


def _annotation(node: ast.expr | None) -> str:
    return ast.unparse(node).strip("'\"").split("[")[0].split(".")[-1] if node is not None else ""


def service_reach_throughs(root: Path, public: set[str]) -> list[str]:
    """``path:line: expression`` of each reach-through in the ``*.py`` files under ``root`` (the rule above)."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}
    makers, attrs = set(SERVICE_MAKERS), set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _annotation(node.returns) == SERVICE_TYPE:
                makers.add(node.name)
            elif isinstance(node, ast.ClassDef):
                attrs.update(n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                             and isinstance(n.target, ast.Name) and _annotation(n.annotation) == SERVICE_TYPE)
    leaks: set[str] = set()  # helpers that return what they reached (their callers' accesses count too)
    found: list[str] = []
    for _ in range(3):
        scans = [_FileScan(public, makers, attrs, leaks, tree) for tree in trees.values()]
        leaking = set().union(*(scan.leaking for scan in scans))
        found = [f"{path.relative_to(root.parent)}:{line}: {expr}"
                 for path, scan in zip(trees, scans) for line, expr in scan.found()]
        if leaking <= leaks:
            break
        leaks |= leaking
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


class _FileScan:
    """One file of ``service_reach_throughs``: what holds a service or something reached inside one."""

    def __init__(self, public: set[str], makers: set[str], attrs: set[str], leaks: set[str], tree: ast.Module):
        self.public, self.makers, self.attrs, self.leaks, self.tree = public, makers, attrs, leaks, tree
        self.bound: dict[str, str] = {}  # names and ``self.x`` -> "service" | "inside"
        self.leaking: set[str] = set()  # functions here that return something reached inside a service
        for _ in range(3):  # to a fixed point: aliases of aliases
            for node in ast.walk(tree):
                self._bind(node)

    def _bind(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.bound.update((a.arg, "service") for a in node.args.args + node.args.kwonlyargs
                              if _annotation(a.annotation) == SERVICE_TYPE)
            if any(isinstance(r, ast.Return) and self.kind(r.value) == "inside" for r in ast.walk(node)):
                self.leaking.add(node.name)
        elif isinstance(node, ast.Assign) and (k := self.kind(node.value)):
            self.bound.update((ast.unparse(t), k) for t in node.targets if isinstance(t, (ast.Name, ast.Attribute)))
        elif isinstance(node, ast.AnnAssign) and _annotation(node.annotation) == SERVICE_TYPE:
            self.bound[ast.unparse(node.target)] = "service"

    def kind(self, e: ast.expr | None) -> str:
        """``service``, ``inside`` (reached through one, or returned by a helper that did) or ``""``."""
        if isinstance(e, ast.Await):
            return self.kind(e.value)
        if isinstance(e, ast.Call):
            f = e.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            return "service" if name in self.makers else "inside" if name in self.leaks else ""
        if isinstance(e, (ast.Name, ast.Attribute)) and ast.unparse(e) in self.bound:
            return self.bound[ast.unparse(e)]
        if isinstance(e, ast.Attribute):
            if e.attr in self.attrs:
                return "service"
            return "inside" if self.reaches(e) or self.kind(e.value) == "inside" else ""
        return ""

    def reaches(self, e: ast.Attribute) -> bool:
        return e.attr == "manager" or (self.kind(e.value) == "service" and e.attr not in self.public)

    def found(self) -> list[tuple[int, str]]:
        """An access that leaves the face, or any access to what a helper reached and returned; a chain counts
        once (the accesses after a reach-through in one expression are not counted again)."""
        def counted(n: ast.Attribute) -> bool:
            if self.reaches(n):
                return True
            chained = isinstance(n.value, ast.Attribute) and ast.unparse(n.value) not in self.bound
            return self.kind(n.value) == "inside" and not chained
        return [(n.lineno, ast.unparse(n)) for n in ast.walk(self.tree) if isinstance(n, ast.Attribute) and counted(n)]


def _service_public_names() -> set[str]:
    from pflash_proxy.sessions.service import SessionService

    return {name for name in vars(SessionService) if not name.startswith("_")}


def test_the_tests_reach_into_the_session_service_at_most_ten_times():
    found = service_reach_throughs(Path(__file__).parent, _service_public_names())
    assert len(found) <= REACH_THROUGHS_MAX, ("\n".join(found) + "\nuse SessionService's public methods in tests "
                                              "(add one if a test needs it); REACH_THROUGHS_MAX may only go down")


def test_the_reach_through_scan_sees_services_by_call_alias_annotation_and_declared_field(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_sample.py").write_text(
        "from dataclasses import dataclass\n"
        "@dataclass\nclass Proxy:\n    service: SessionService\n"
        "def make() -> SessionService: ...\n"
        "async def test_a(app, p: Proxy, svc: SessionService):\n"
        "    s = session_service(app)\n    alias = s\n"
        "    s.view(); alias.stats(); await s.find_and_lease()\n"  # public: not counted
        "    alias._scheduler.watch._monitor.cancel()\n"  # one chain, counted once
        "    p.service._snapshots\n    svc._index\n    make()._cluster\n"
        "    SessionService(1, 2)._seeds\n    old.manager.table\n"
        "    index = SessionStore()\n    index._writing(1)\n"  # the test's own index: not counted
        "    table = scheduler(app).table\n    table.slots\n"  # a helper's leak: each use counts
        "def scheduler(app):\n    return session_service(app)._scheduler\n")
    found = service_reach_throughs(tests, {"view", "stats", "find_and_lease"})
    assert [f.split(": ", 1)[1] for f in found] == [
        "alias._scheduler", "p.service._snapshots", "svc._index", "make()._cluster", "SessionService(1, 2)._seeds",
        "old.manager", "scheduler(app).table", "table.slots", "session_service(app)._scheduler"], found


# The transport (``llama.upstream``: ``Upstream``, its header helpers) belongs to ``llama/`` and to the server that
# relays clients' requests through it; every other package reads the engine through ``engine.Engine``.
TRANSPORT_USERS = ("llama", "server")


def _transport_uses(path: Path) -> set[str]:
    """``llama.upstream`` imports of ``path`` (lazy and ``TYPE_CHECKING`` ones included) and the name ``Upstream``
    in its code (annotations included; docstrings and comments are prose)."""
    tree = ast.parse(path.read_text(), str(path))
    out = {m for m in _imports(path) if m.startswith("pflash_proxy.llama.upstream")}
    out.update("Upstream" for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == "Upstream")
    return out


def test_no_module_outside_llama_and_the_server_depends_on_the_transport():
    found = {str(p.relative_to(PACKAGE)): sorted(uses) for p in sorted(PACKAGE.rglob("*.py"))
             if p.relative_to(PACKAGE).parts[0] not in TRANSPORT_USERS and (uses := _transport_uses(p))}
    assert found == {}, "read the engine through pflash_proxy.engine.Engine, not llama.upstream.Upstream"


def test_the_transport_scan_sees_imports_and_annotations(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Upstream in prose."""\nfrom typing import TYPE_CHECKING\n'
                      "if TYPE_CHECKING:\n    from pflash_proxy.llama.upstream import Upstream\n"
                      'def f(u: Upstream) -> None:\n    """Upstream here too."""\n')
    assert _transport_uses(sample) == {"pflash_proxy.llama.upstream", "pflash_proxy.llama.upstream.Upstream",
                                       "Upstream"}
    sample.write_text('"""Upstream in prose only."""\nx = 1  # Upstream in a comment\n')
    assert _transport_uses(sample) == set()


def test_the_inspector_is_handed_the_engine_not_the_transport():
    from dataclasses import fields

    from pflash_proxy.inspector.data import InspectorViews

    assert [f.name for f in fields(InspectorViews)] == ["engine", "sessions", "stats", "settled"], \
        ("the inspector reads only these views (no transport, no session service internals): a new read-only view "
         "goes here and in InspectorViews with a comment saying what it reads; never llama.upstream")


# ``Any`` in the package, counted as ``git grep -wo Any -- pflash_proxy`` counts it (the word, in code, comments and
# strings alike): at most a third of the 461 the engine seam started from. It may only shrink; lower the bound
# when it does.
ANY_BOUND = 110
_ANY = re.compile(r"(?<![A-Za-z0-9_])Any(?![A-Za-z0-9_])")


def any_count(paths: list[Path]) -> int:
    return sum(len(_ANY.findall(p.read_text())) for p in paths)


def test_the_package_spells_any_no_more_than_its_bound():
    found = {str(p.relative_to(PACKAGE)): n for p in sorted(PACKAGE.rglob("*.py")) if (n := any_count([p]))}
    assert sum(found.values()) <= ANY_BOUND, (sorted(found.items(), key=lambda kv: -kv[1])[:10], "type it (a "
                                              "TypedDict, jsontypes' JSON types, a Protocol) instead of Any")


def test_the_any_count_matches_git_grep_words(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import Any  # Any\nAnyStr, Anything, MyAny, any_, x: dict[str, Any]\n"
                      "'Any'\n_Any = Any\n")
    assert any_count([sample]) == 5


# Where ``ProxyRequest.log_fields`` may be read: the access log line (``server/routes.py``) and the bench's recorders,
# which keep a copy of each request's log fields beside its messages. What a stage hands another, or the metrics
# read, is a typed field of the request (``session``, ``compression``, ``turn``...).
LOG_FIELD_READERS = {"server/routes.py", "bench/runner.py"}


def log_field_reads(path: Path) -> list[int]:
    """The lines where ``path`` reads a request's ``log_fields`` (anything but ``x.log_fields[k] = v`` and
    ``x.log_fields.update(...)``)."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr == "log_fields"):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store):
            continue
        if isinstance(parent, ast.Attribute) and parent.attr == "update" \
                and isinstance(parents.get(id(parent)), ast.Call):
            continue
        lines.append(node.lineno)
    return sorted(lines)


def test_the_log_fields_are_written_by_the_stages_and_read_by_the_log_line_only():
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py")) if (lines := log_field_reads(p))}
    assert set(found) <= LOG_FIELD_READERS, ({k: v for k, v in found.items() if k not in LOG_FIELD_READERS},
                                              "log_fields are for the access log: hand another stage (or the "
                                              "metrics) a typed field of the request instead")


def test_the_log_field_scan_tells_writes_from_reads(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('req.log_fields["a"] = 1\nreq.log_fields.update({"b": 2})\nx = req.log_fields["a"]\n'
                      'fields = req.log_fields\nif "a" in req.log_fields:\n    pass\n')
    assert log_field_reads(sample) == [3, 4, 5]
