"""Documents with known structure, made from text that ships with the machine.

Every ``Doc`` is a text plus the lines where a unit, a container and a sub-unit start; these are the labels of
the segment probe. The kinds follow what the proxy meets:

1. **code**: Python source of the standard library's *packages* (``email``, ``asyncio``, ``json``, ...); the
   bench builds its code and agent cases from the top-level modules (``Lib/*.py``) and never reads packages
   below 70K tokens, so training and bench text do not overlap. ``ast`` gives the units: each top-level
   ``def``/``class`` (with its decorators and the comment lines right above it) is a unit, a run of other
   top-level statements is one unit; a class is a container and its methods are sub-units. Function and
   method docstrings are removed (they become questions, ``tasks.py``), so evidence and question share less.
2. **prose**: sections of the packages' docstrings under a heading; a heading starts a container, each
   paragraph a unit, each sentence-initial line a sub-unit.
3. **log**: service log records (one line, or a line with an indented traceback); every record is a unit.
4. **jsonl**: one JSON record per line; every record is a unit.
5. **diff**: ``difflib.unified_diff`` of a package file against a mutated copy; a file header is a container,
   each hunk a unit.

All randomness comes from the ``random.Random`` passed in, so a seed gives the same corpus.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import json
import os
import random
import re
import sysconfig
from dataclasses import dataclass, field
from functools import lru_cache

SKIP_PACKAGES = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "site-packages", "__pycache__",
                 "ensurepip", "venv", "pydoc_data"}


@dataclass
class Doc:
    kind: str
    source: str  # where the text came from (a path, or a generator name); the held-out split hashes it
    lines: list[str]
    units: list[int]  # sorted line indices where a unit starts (always holds 0)
    containers: list[int] = field(default_factory=list)
    subunits: list[int] = field(default_factory=list)
    functions: list[tuple[str, str, int]] = field(default_factory=list)  # (name, docstring summary, line)
    sections: list[tuple[str, int]] = field(default_factory=list)  # (heading, line)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def unit_of(self, line: int) -> int:
        """Index of the unit holding ``line``."""
        import bisect
        return bisect.bisect_right(self.units, line) - 1


@lru_cache(maxsize=1)
def package_files() -> tuple[tuple[str, str], ...]:
    """(path shown to the model, source) of every stdlib package module that parses, sorted by path."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for name in sorted(os.listdir(root)):
        top = os.path.join(root, name)
        if name in SKIP_PACKAGES or name.startswith(("config-", "_")) or not os.path.isdir(top):
            continue
        for here, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_PACKAGES)
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                path = os.path.join(here, f)
                try:
                    with open(path, encoding="utf-8") as fh:
                        src = fh.read()
                    ast.parse(src)
                except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                    continue
                if 2000 <= len(src):
                    out.append(("Lib/" + os.path.relpath(path, root), src))
    return tuple(out)


def summary(doc: str) -> str:
    """First sentence of a docstring, one line."""
    first = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", first)
    return (m.group(1) if m else first).strip()


def _docstring_lines(node: ast.AST) -> set[int]:
    """0-based source lines of the docstrings of every function/method inside ``node`` (not the class's own)."""
    drop: set[int] = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.body:
            first = sub.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str) and len(sub.body) > 1:
                drop.update(range(first.lineno - 1, first.end_lineno or first.lineno))
    return drop


def code_doc(path: str, src: str, rng: random.Random, max_chars: int) -> Doc | None:
    """A window of top-level statements of one module (step 1), docstrings of functions removed."""
    tree = ast.parse(src)
    lines = src.split("\n")
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) else tree.body
    if len(body) < 4:
        return None
    starts = []
    for node in body:
        s = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while s > 0 and lines[s - 1].lstrip().startswith("#"):
            s -= 1
        starts.append(s)
    first = rng.randrange(0, max(1, len(body) - 3))
    out: list[str] = []
    units: list[int] = []
    containers: list[int] = []
    subunits: list[int] = []
    functions: list[tuple[str, str, int]] = []
    prev_plain = False
    for i in range(first, len(body)):
        node = body[i]
        a = starts[i]
        b = starts[i + 1] if i + 1 < len(body) else len(lines)
        seg = list(range(a, b))
        is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if out and sum(len(lines[j]) + 1 for j in seg) + sum(len(x) + 1 for x in out) > max_chars:
            break
        drop = _docstring_lines(node)
        here = len(out)
        while seg and not lines[seg[0]].strip():  # blank lines before a unit belong to the previous one
            out.append(lines[seg.pop(0)])
            here += 1
        if is_def or not prev_plain:
            units.append(here)
        prev_plain = not is_def
        own = starts[i]
        for j in seg:
            if j in drop:
                continue
            if j == own and isinstance(node, ast.ClassDef):
                containers.append(len(out))
            out.append(lines[j])
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    s = min([sub.lineno] + [d.lineno for d in sub.decorator_list]) - 1
                    idx = here + len([j for j in seg if j < s and j not in drop])
                    subunits.append(idx)
        for sub in ([node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                    [s for s in getattr(node, "body", []) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]):
            ds = ast.get_docstring(sub)
            if ds and len(sub.body) > 1 and len(summary(ds)) >= 20:
                line = here + len([j for j in seg if j < sub.lineno - 1 and j not in drop])
                functions.append((sub.name, summary(ds), line))
    if len(units) < 4:
        return None
    units = sorted(set([0] + units))
    return Doc("code", path, out, units, containers, sorted(set(subunits) - set(units)), functions)


# ------------------------------------------------------------------------------------------------ prose
@lru_cache(maxsize=1)
def package_sections() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(heading, paragraphs) from module and class docstrings of the packages, one per documented object."""
    out = []
    for path, src in package_files():
        mod = path[4:-3].replace("/", ".").removesuffix(".__init__")
        tree = ast.parse(src)
        for node in [tree] + [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]:
            ds = ast.get_docstring(node)
            if not ds:
                continue
            paras = tuple(" ".join(p.split()) for p in re.split(r"\n\s*\n", ds)
                          if len(p) > 80 and not re.search(r"^\s*(>>>|\.\.\.|[-*+|=])", p, re.M))
            if paras:
                name = mod if isinstance(node, ast.Module) else f"{mod}.{node.name}"
                out.append((name, paras))
    return tuple(out)


def wrap(text: str, width: int) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width) or [""]


def prose_doc(rng: random.Random, max_chars: int) -> Doc:
    """Sections of documentation prose under headings (step 2)."""
    secs = package_sections()
    lines: list[str] = []
    units: list[int] = []
    containers: list[int] = []
    subunits: list[int] = []
    sections: list[tuple[str, int]] = []
    style = rng.choice(["md", "rst", "plain"])
    width = rng.choice([72, 88, 100, 10_000])
    while sum(len(x) + 1 for x in lines) < max_chars:
        name, paras = secs[rng.randrange(len(secs))]
        heading = name.split(".")[-1].replace("_", " ").strip() or name
        title = f"{heading} ({name})" if rng.random() < 0.5 else heading
        if lines:
            lines.append("")
        start = len(lines)
        containers.append(start)
        units.append(start)
        sections.append((title, start))
        if style == "md":
            lines.append("#" * rng.choice([1, 2, 3]) + " " + title)
        elif style == "rst":
            lines += [title, rng.choice("=-~") * len(title)]
        else:
            lines.append(title + ":")
        for k, p in enumerate(paras[:4]):
            lines.append("")
            if k > 0:
                units.append(len(lines))
            for w in wrap(p, width):
                if re.match(r"[A-Z]", w) and lines[-1].rstrip().endswith("."):
                    subunits.append(len(lines))
                lines.append(w)
    return Doc("prose", "prose", lines, sorted(set(units)), containers, sorted(set(subunits) - set(units)),
               sections=sections)


# ------------------------------------------------------------------------------------------------ logs
COMPONENTS = ["scheduler", "billing", "gateway", "indexer", "auth", "mailer", "storage", "cache", "worker-3",
              "ingest", "reports", "search"]
EVENTS = ["request served in {ms} ms", "connection pool at {n}/64", "retrying upload of chunk {n}",
          "job {n} finished", "cache miss for key user:{n}", "heartbeat ok", "token refreshed for client {n}",
          "queued {n} messages", "slow query took {ms} ms", "rotated log file", "checkpoint {n} written"]


def log_record(rng: random.Random, t: int, message: str | None = None, level: str | None = None) -> list[str]:
    h, m, s = (t // 3600) % 24, (t // 60) % 60, t % 60
    level = level or rng.choice(["INFO"] * 6 + ["DEBUG"] * 2 + ["WARN", "ERROR"])
    msg = message or rng.choice(EVENTS).format(ms=rng.randint(3, 9000), n=rng.randint(1, 99999))
    out = [f"2026-11-{rng.randint(1, 28):02d} {h:02d}:{m:02d}:{s:02d},{rng.randint(0, 999):03d} {level:5s} "
           f"[{rng.choice(COMPONENTS)}] {msg}"]
    if level == "ERROR" and rng.random() < 0.5:
        out.append("Traceback (most recent call last):")
        for _ in range(rng.randint(1, 4)):
            fn = rng.choice(package_files())[0]
            out += [f'  File "/usr/lib/python3/{fn[4:]}", line {rng.randint(10, 900)}, in '
                    f"{rng.choice(['run', 'handle', '_send', 'get', 'parse', 'flush'])}",
                    f"    {rng.choice(['return self._call()', 'data = sock.recv(n)', 'raise', 'self.flush()'])}"]
        out.append(rng.choice(["TimeoutError: timed out", "ValueError: bad header", "OSError: [Errno 28] No space"]))
    return out


def log_doc(rng: random.Random, max_chars: int) -> Doc:
    lines: list[str] = []
    units: list[int] = []
    t = rng.randint(0, 86_000)
    while sum(len(x) + 1 for x in lines) < max_chars:
        units.append(len(lines))
        lines += log_record(rng, t)
        t += rng.randint(0, 30)
    return Doc("log", "log", lines, units)


def jsonl_doc(rng: random.Random, max_chars: int) -> Doc:
    lines: list[str] = []
    i = rng.randint(1, 10_000)
    while sum(len(x) + 1 for x in lines) < max_chars:
        rec = {"id": i, "user": f"u{rng.randint(1, 999)}", "event": rng.choice(["login", "purchase", "refund",
                                                                                 "view", "logout"]),
               "amount": round(rng.random() * 300, 2), "ok": rng.random() < 0.9}
        lines.append(json.dumps(rec))
        i += 1
    return Doc("jsonl", "jsonl", lines, list(range(len(lines))))


# ------------------------------------------------------------------------------------------------ diffs
def _mutate(lines: list[str], rng: random.Random) -> list[str]:
    out = list(lines)
    for _ in range(rng.randint(2, 6)):
        j = rng.randrange(len(out))
        r = rng.random()
        if r < 0.4:
            out[j] = out[j].replace("self", "this", 1) + "  # changed"
        elif r < 0.7:
            del out[j:j + rng.randint(1, 4)]
        else:
            out.insert(j, " " * (len(out[j]) - len(out[j].lstrip())) + f"log.debug('checkpoint {rng.randint(1, 99)}')")
    return out


def diff_doc(rng: random.Random, max_chars: int) -> Doc:
    lines: list[str] = []
    units: list[int] = []
    containers: list[int] = []
    files = package_files()
    while sum(len(x) + 1 for x in lines) < max_chars:
        path, src = files[rng.randrange(len(files))]
        old = src.split("\n")
        new = _mutate(old, rng)
        body = list(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", lineterm="", n=3))
        if not body:
            continue
        containers.append(len(lines))
        units.append(len(lines))
        lines.append(f"diff --git a/{path} b/{path}")
        for k, ln in enumerate(body):
            if ln.startswith("@@") and k > 2:
                units.append(len(lines))
            lines.append(ln)
    return Doc("diff", "diff", lines, sorted(set(units)), containers)
