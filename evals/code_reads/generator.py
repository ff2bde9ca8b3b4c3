"""Code-read cases generated from the third-party packages installed beside the proxy, split by package.

Nothing is written by hand, so nothing can be tuned case by case: the functions, their gold spans and the
questions all come from the installed sources and a seed.

1. ``packages(site)``: every distribution installed in ``site`` (a site-packages directory), sorted by name,
   without ``EXCLUDED`` (the packages the agent-read study of 19528cf read, and the proxy itself); its ``.py`` files
   from its ``RECORD``, left out: files outside ``site``, tests, vendored copies of other packages (``_vendor``,
   ``vendored``, ``extern``: the same code would sit in both splits), files not of ``MIN_CHARS``-``MAX_CHARS``
   characters, not UTF-8, with ``\\r``, or that ``ast`` cannot parse.
2. ``functions(text)``: the module-level functions and the methods of module-level classes. Gold span: the
   first decorator's line (else the ``def`` line) through ``end_lineno``, 1-based inclusive, as ``ast`` gives
   it. Kept: ``MIN_LINES``-``MAX_LINES`` lines and at most ``MAX_SHARE`` of the file's characters (a function
   longer than a budget could hold tells nothing), not ``@overload``, not a property setter/deleter, and a
   qualified name defined once in the file.
3. Per package (``select``), with its own ``random.Random`` seeded by ``seed`` and the package name: its files
   in a seeded order, parsed until the pool holds ``POOL`` functions from at least ``POOL_FILES`` files, the
   pool shuffled; up to ``PER_KIND`` cases of each kind, taken one kind after the other in turn, at most
   ``PER_FILE`` per file, each function at most once:
   - *qualified*: methods, a dunder or a name several classes of the file define (``shared``) alternating with
     the others, so that about half are shared where the package has them;
   - *described*: functions for which ``questions.described`` finds a question that leaks no identifier;
   - *named*: functions whose bare name the file defines once.
4. The kinds get equal shares: each kind is cut to the smallest kind's count, taking the last pick of the
   package that has the most of that kind first.
5. Split by package: ``split_of(package)`` is ``test`` when the first byte of the SHA-256 of the normalised
   name is even, else ``train`` (stable across machines and versions).
6. Order: within each kind, cases are shuffled by the seed; the kinds are interleaved (named, qualified,
   described, named, ...), so a ``--limit`` run keeps the shares.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import sysconfig
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from itertools import zip_longest
from importlib import metadata
from pathlib import Path
from typing import Iterator

from . import questions as q

__all__ = ["CodeCase", "EXCLUDED", "KINDS", "Function", "SourceFile", "functions", "generate", "packages",
           "site_packages", "split_of"]

# the agent-read study (benchmarks/agent_reads/cases.py at 19528cf) read jinja2, numpy, pydantic and pytest (``_pytest``); none of them here
AGENT_READS = ("jinja2", "numpy", "pydantic", "pytest")
EXCLUDED = frozenset(AGENT_READS + ("pflash-proxy",))
KINDS = ("named", "qualified", "described")
MIN_CHARS, MAX_CHARS = 8_000, 80_000
MIN_LINES, MAX_LINES = 4, 80
MAX_SHARE = 0.2
PER_KIND = 3
PER_FILE = 3
POOL, POOL_FILES = 120, 6  # step 3: files are parsed (in seeded order) until the pool holds this many
_SKIP_DIRS = frozenset(("tests", "test", "testing", "_vendor", "vendor", "vendored", "_vendored", "extern",
                        "_extern", "__pycache__"))


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def site_packages() -> Path:
    """The site-packages directory of the running interpreter (the proxy's virtual environment)."""
    return Path(sysconfig.get_paths()["purelib"])


def split_of(package: str) -> str:
    """Step 5."""
    return "test" if hashlib.sha256(normalise(package).encode()).digest()[0] % 2 == 0 else "train"


@dataclass(frozen=True)
class SourceFile:
    package: str
    version: str
    path: str  # relative to site-packages, "/"-separated
    text: str


@dataclass(frozen=True)
class Function:
    name: str
    cls: str | None
    span: tuple[int, int]  # 1-based inclusive: first decorator line .. last body line
    node: ast.AST
    cls_node: ast.ClassDef | None

    @property
    def qualname(self) -> str:
        return f"{self.cls}.{self.name}" if self.cls else self.name


@dataclass(frozen=True)
class CodeCase:
    case_id: str
    package: str
    version: str
    split: str
    path: str
    qualname: str
    name: str
    cls: str | None
    kind: str
    question: str
    span: tuple[int, int]
    file_chars: int
    shared: bool  # a dunder, or a method name several classes of the file define


    def to_json(self) -> dict:
        return asdict(self)


def packages(site: Path, exclude: frozenset[str] = EXCLUDED, only: set[str] | None = None
             ) -> dict[str, list[SourceFile]]:
    """Step 1: package name → its usable source files (sorted by path); packages without any are left out."""
    site = Path(site).resolve()
    seen: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions(path=[str(site)]):
        name = dist.metadata["Name"]
        if not name or normalise(name) in {normalise(e) for e in exclude}:
            continue
        if only is not None and normalise(name) not in {normalise(o) for o in only}:
            continue
        seen.setdefault(normalise(name), dist)
    out: dict[str, list[SourceFile]] = {}
    for key in sorted(seen):
        dist = seen[key]
        files = []
        for f in sorted({str(p) for p in dist.files or ()}):
            parts = f.split("/")
            if not f.endswith(".py") or ".." in parts or any(p in _SKIP_DIRS for p in parts[:-1]) \
                    or parts[-1].startswith("test_") or parts[0].endswith((".dist-info", ".egg-info")):
                continue
            path = site / f
            try:
                size = path.stat().st_size
                if size < MIN_CHARS or size > 4 * MAX_CHARS:
                    continue
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if not MIN_CHARS <= len(text) <= MAX_CHARS or "\r" in text:
                continue
            files.append(SourceFile(dist.metadata["Name"], dist.version, f, text))
        if files:
            out[dist.metadata["Name"]] = files
    return out


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return first, node.end_lineno or node.lineno


def _skipped_decorator(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in node.decorator_list:
        text = ast.unparse(d)
        if text.endswith("overload") or text.endswith((".setter", ".deleter")):
            return True
    return False


def functions(text: str, tree: ast.Module | None = None) -> list[Function]:
    """Step 2: the kept functions and methods of one file, in file order."""
    tree = tree or ast.parse(text)
    n_lines = len(text.split("\n"))
    found: list[Function] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(Function(node.name, None, _span(node), node, None))
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append(Function(sub.name, node.name, _span(sub), sub, node))
    counts = Counter(f.qualname for f in found)
    lines = text.split("\n")
    out = []
    for f in found:
        a, b = f.span
        size = sum(len(line) + 1 for line in lines[a - 1:b])
        if counts[f.qualname] > 1 or not MIN_LINES <= b - a + 1 <= MAX_LINES or size > MAX_SHARE * len(text) \
                or b > n_lines or _skipped_decorator(f.node):  # type: ignore[arg-type]
            continue
        out.append(f)
    return out


def _bare_counts(tree: ast.Module) -> Counter[str]:
    return Counter(n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _method_counts(tree: ast.Module) -> Counter[str]:
    return Counter(sub.name for node in tree.body if isinstance(node, ast.ClassDef) for sub in node.body
                   if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _shared(f: Function, methods: Counter[str]) -> bool:
    return f.cls is not None and ((f.name.startswith("__") and f.name.endswith("__")) or methods[f.name] > 1)


def select(files: list[SourceFile], seed: int) -> list[tuple[str, SourceFile, Function, str, bool]]:  # noqa: C901
    """Step 3: (kind, file, function, question) for one package."""
    package = files[0].package
    rng = random.Random(f"{seed}:{normalise(package)}")
    pool: list[tuple[SourceFile, Function, ast.Module, Counter[str], Counter[str]]] = []
    file_order = list(files)
    rng.shuffle(file_order)
    parsed = 0
    for sf in file_order:
        if len(pool) >= POOL and parsed >= POOL_FILES:
            break  # enough to choose from: a large package's other files are never parsed
        parsed += 1
        try:
            tree = ast.parse(sf.text)
        except (SyntaxError, ValueError):
            continue
        bare, methods = _bare_counts(tree), _method_counts(tree)
        pool += [(sf, f, tree, bare, methods) for f in functions(sf.text, tree)]
    rng.shuffle(pool)
    used: set[tuple[str, str]] = set()
    per_file: Counter[str] = Counter()
    picks: list[tuple[str, SourceFile, Function, str, bool]] = []
    shared = {(sf.path, f.qualname) for sf, f, _, _, m in pool if _shared(f, m)}

    def free(sf: SourceFile, f: Function) -> bool:
        return (sf.path, f.qualname) not in used and per_file[sf.path] < PER_FILE

    def take(kind: str, sf: SourceFile, f: Function, question: str) -> None:
        used.add((sf.path, f.qualname))
        per_file[sf.path] += 1
        picks.append((kind, sf, f, question, (sf.path, f.qualname) in shared))

    # qualified: dunders and names several classes define alternate with other methods (about half each)
    in_classes = [(sf, f) for sf, f, _, _, _ in pool if f.cls is not None]
    special = [(sf, f) for sf, f, _, _, m in pool if f.cls is not None and _shared(f, m)]
    plain = [x for x in in_classes if x not in special]
    order = [x for pair in zip_longest(special, plain) for x in pair if x is not None]

    def qualified_kind() -> Iterator[tuple[SourceFile, Function, str]]:
        for sf, f in order:
            if free(sf, f):
                yield sf, f, q.qualified(q.Target(f.name, f.cls), rng)

    def described_kind() -> Iterator[tuple[SourceFile, Function, str]]:
        for sf, f, tree, _, _ in pool:
            if free(sf, f):
                question = q.described(q.Target(f.name, f.cls), f.node, f.cls_node, tree, rng)
                if question is not None:
                    yield sf, f, question

    def named_kind() -> Iterator[tuple[SourceFile, Function, str]]:
        for sf, f, _, bare, _ in pool:
            if free(sf, f) and bare[f.name] == 1:
                yield sf, f, q.named(q.Target(f.name, f.cls), rng)

    # one of each kind in turn, so that a package with few files shares them out between the kinds
    kinds = {"qualified": qualified_kind(), "described": described_kind(), "named": named_kind()}
    for _ in range(PER_KIND):
        for kind, it in kinds.items():
            got = next(it, None)
            if got is not None:
                take(kind, *got)
    return picks


def generate(site: Path | None = None, seed: int = 0, *, exclude: frozenset[str] = EXCLUDED,
             only: set[str] | None = None, split: str = "all") -> list[CodeCase]:
    """Steps 1-6: the cases (``split``: ``test``, ``train`` or ``all``)."""
    site = Path(site) if site is not None else site_packages()
    by_kind: dict[str, list[tuple[str, SourceFile, Function, str, bool]]] = defaultdict(list)
    for name, files in packages(site, exclude, only).items():
        for kind, sf, f, question, shared in select(files, seed):
            by_kind[kind].append((name, sf, f, question, shared))
    share = min((len(by_kind[k]) for k in KINDS), default=0)
    for kind in KINDS:  # step 4
        picks = by_kind[kind]
        while len(picks) > share:
            counts = Counter(p[0] for p in picks)
            top = max(sorted(counts), key=lambda k: counts[k])
            last = max(i for i, p in enumerate(picks) if p[0] == top)
            picks.pop(last)
    ordered: dict[str, list[CodeCase]] = {}
    for kind in KINDS:
        cases = [CodeCase(f"{normalise(name)}:{sf.path}:{f.qualname}:{kind}", name, sf.version, split_of(name),
                          sf.path, f.qualname, f.name, f.cls, kind, question, f.span, len(sf.text), shared)
                 for name, sf, f, question, shared in by_kind[kind]]
        random.Random(f"{seed}:order:{kind}").shuffle(cases)
        ordered[kind] = [c for c in cases if split == "all" or c.split == split]
    out: list[CodeCase] = []
    for i in range(max((len(v) for v in ordered.values()), default=0)):  # step 6
        out += [ordered[k][i] for k in KINDS if i < len(ordered[k])]
    return out


def read_source(site: Path, case: CodeCase) -> str:
    return (Path(site) / case.path).read_text(encoding="utf-8")
