"""``bench code-tasks``: tasks in users' words over installed packages' files, read as agents read them.

1. Cases: ``cases/code_tasks.json``, written by hand (bug reports, how/why questions, change requests; no
   identifier of the code in the text), each naming a file (relative to site-packages), its package and the
   qualified name of the definition the task needs (``gold``). With ``--mined`` (on by default), sentences from
   the packages' own documentation are added (``mine``): a sentence of a distribution's ``METADATA`` description
   (its README and, for many, its changelog) that names a function or method of one of the package's files
   (`` `name` `` or ``name()``) with the name replaced by "this" and the definition as its gold.
2. Gold span (``gold_span``): the definition whose qualified name (``Class.method`` or ``function``) is the gold,
   module level or in a module-level class, overload stubs skipped; its first decorator's line through
   ``end_lineno`` as ``ast`` gives it. A case whose file is missing or whose gold does not resolve to exactly one
   definition is skipped and listed.
3. Each case in each ``--shapes`` entry, as the client sends it: the task as the user's turn (sent first on its
   own: ``warm``, the agent's flow), then the assistant's narration with a read tool call and the read's result:
   ``claude`` (Anthropic Messages, Claude Code's ``N<TAB>line``), ``claude-arrow`` (older Claude Code: the number
   right-aligned in 6 columns then ``→``), ``opencode`` (chat completions, ``N: line`` in its wrapper), ``codex``
   (Responses, its shell tool's raw ``cat``). ``--variants cold`` sends the read without the task turn first.
4. Measured per read: the gold's lines, as the shape prints them, in one piece in what llama-server received
   (``--forward``) or would receive (``gold``); the mode; kept fraction (llama-server's counts); read size bucket
   by the message's tokens.
5. Split by package (``common.split_of``, about 60/40 of the cases; ``held-out-2``: tasks written later over
   packages in neither split, each case saying so, and the mined sentences of those packages with them;
   ``spent``: the splits already run, ``SPENT``, as one set to tune on, each read keeping its own split). Only
   ``--split``'s cases are sent, one package after the other in turn (``interleave``), so ``--limit N`` spans
   packages; ``--ids`` keeps the cases whose id matches one of its ids or globs (``select_ids``), before the limit.
6. Beside each read, ``bm25_keeps_gold``: whether an offline BM25 ranking of the file's definitions, filled
   greedily to 30 % of the file, would have kept the gold (the issue's diagnostic: what the pipeline loses that
   the ranking found).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import fnmatch
import json
import random
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from evals.code_reads.generator import site_packages
from evals.code_reads.run import lines_of
from evals import common
from pflash_proxy.bench.report import Table
from pflash_proxy.progress import Progress
from pflash_proxy.jsontypes import JSONObject

CASES = Path(__file__).resolve().parent / "cases" / "code_tasks.json"
# the held-out-3 tasks (split "held-out-3"), in a file of their own; read with CASES when present
HELD_OUT_3 = CASES.with_name("code_tasks_held_out_3.json")
# the held-out-4 tasks (split "held-out-4"), likewise; their packages are installed by scripts/eval-packages.sh
HELD_OUT_4 = CASES.with_name("code_tasks_held_out_4.json")
# the splits already run (dev tuned on; held-out, held-out-2 and held-out-3 each run once and so no longer held out):
# ``--split spent`` runs them as one, the set to tune on
SPENT = ("dev", "held-out", "held-out-2", "held-out-3")
SHAPES = ("claude", "claude-arrow", "opencode", "codex")
VARIANTS = ("warm", "cold")
BUCKETS = ((0, 4096, "<4K"), (4096, 8192, "4-8K"), (8192, 16384, "8-16K"), (16384, 1 << 40, ">=16K"))
OPENCODE_HEAD = "<path>{path}</path>\n<type>file</type>\n<content>\n"
OPENCODE_FOOT = "\n(End of file - total {n} lines)\n</content>"
WORKDIR = "/home/user/project/.venv/lib/python3.11/site-packages"
NARRATION = ("Let me look at {name} to find where this is handled.", "I'll read {name} first.",
             "I'll open {name} and trace the relevant code.", "Checking {name}.")
SYSTEM = {"claude": "You are Claude Code, Anthropic's official CLI for Claude.",
          "claude-arrow": "You are Claude Code, Anthropic's official CLI for Claude.",
          "opencode": "You are opencode, an interactive CLI tool that helps users with software engineering tasks.",
          "codex": "You are Codex, a coding agent running in a terminal."}
MINED_PER_PACKAGE = 4
_CODE_MARKS = ("```", ">>>", " = ", "print(", "@given", "def ", "import ", "$ ", "{", "}")  # a code sample, not prose
MIN_CHARS, MAX_CHARS = 13_000, 140_000  # about 4K-40K tokens of code


@dataclass
class Task:
    id: str
    package: str
    path: str
    gold: str
    kind: str  # bug, how, why, change; mined
    split: str
    task: str
    version: str = ""


def load_cases(path: Path = CASES) -> list[Task]:
    """The tasks of ``path``; for ``CASES``, with those of ``HELD_OUT_3`` and ``HELD_OUT_4`` when there."""
    paths = [Path(path)] + ([p for p in (HELD_OUT_3, HELD_OUT_4) if p.is_file()] if Path(path) == CASES else [])
    return [Task(**{k: c[k] for k in ("id", "package", "path", "gold", "kind", "split", "task")},
                 version=c.get("version", "")) for p in paths for c in json.loads(p.read_text())["cases"]]


def in_split(t: Task, split: str) -> bool:
    """Step 5: whether ``t`` is one of ``split``'s tasks (``spent``: of any split in ``SPENT``)."""
    return t.split in SPENT if split == "spent" else t.split == split


def definitions(text: str) -> dict[str, list[tuple[int, int]]]:
    """Qualified name → spans (1-based, inclusive, from the first decorator) of module-level functions and the
    methods of module-level classes; ``@overload`` stubs are left out."""
    out: dict[str, list[tuple[int, int]]] = {}

    def overload(n: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        return any((isinstance(d, ast.Name) and d.id == "overload")
                   or (isinstance(d, ast.Attribute) and d.attr == "overload") for d in n.decorator_list)

    def walk(body: list[ast.stmt], cls: str | None) -> None:
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not overload(n):
                start = n.decorator_list[0].lineno if n.decorator_list else n.lineno
                out.setdefault(f"{cls}.{n.name}" if cls else n.name, []).append((start, n.end_lineno or n.lineno))
            elif isinstance(n, ast.ClassDef) and cls is None:
                walk(n.body, n.name)

    walk(ast.parse(text).body, None)
    return out


def gold_span(text: str, gold: str) -> tuple[int, int] | None:
    """Step 2: the gold's span, or None unless exactly one definition has that qualified name."""
    spans = definitions(text).get(gold, [])
    return spans[0] if len(spans) == 1 else None


def _numbered(shape: str, n: int, line: str) -> str:
    if shape == "claude":
        return f"{n}\t{line}"
    if shape == "claude-arrow":
        return f"{n:>6}→{line}"
    if shape == "opencode":
        return f"{n}: {line}"
    return line


def render(text: str, shape: str, path: str) -> str:
    """Step 3: the file as the client's read tool returns it."""
    lines = lines_of(text)
    if shape == "codex":
        return text
    body = "\n".join(_numbered(shape, n, line) for n, line in enumerate(lines, 1))
    if shape == "opencode":
        return OPENCODE_HEAD.format(path=path) + body + "\n" + OPENCODE_FOOT.format(n=len(lines))
    return body


def gold_block(text: str, span: tuple[int, int], shape: str) -> str:
    lines = lines_of(text)[span[0] - 1:span[1]]
    return "\n".join(_numbered(shape, n, line) for n, line in enumerate(lines, span[0]))


def request(shape: str, task: str, path: str, tool_text: str | None, key: str, narration: str
            ) -> tuple[str, JSONObject, dict[str, str]]:
    """(route, body, headers) of one turn: the task alone (``tool_text`` None) or with the narration, the read
    tool call and its result."""
    if shape in ("claude", "claude-arrow"):
        msgs: list[JSONObject] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
        if tool_text is not None:
            msgs += [{"role": "assistant", "content": [
                {"type": "text", "text": narration},
                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": path}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                              "content": tool_text}]}]
        tools: list[JSONObject] = [{"name": "Read", "description": "Reads a file from the local filesystem.",
                                    "input_schema": {"type": "object", "properties": {
                                        "file_path": {"type": "string"}}, "required": ["file_path"]}}]
        return "/v1/messages", {
            "model": "gemma", "max_tokens": 1, "messages": msgs, "tools": tools,
            "metadata": {"user_id": json.dumps({"device_id": "bench", "account_uuid": "", "session_id": key})},
            "system": [{"type": "text", "text": SYSTEM[shape]}]}, {"X-Claude-Code-Session-Id": key}
    if shape == "opencode":
        msgs = [{"role": "system", "content": SYSTEM[shape]}, {"role": "user", "content": task}]
        if tool_text is not None:
            msgs += [{"role": "assistant", "content": narration, "tool_calls": [
                {"id": "call_01", "type": "function",
                 "function": {"name": "read", "arguments": json.dumps({"filePath": path})}}]},
                {"role": "tool", "tool_call_id": "call_01", "content": tool_text}]
        tools = [{"type": "function", "function": {"name": "read", "description": "Read a file.",
                                                   "parameters": {"type": "object", "properties": {
                                                       "filePath": {"type": "string"}}, "required": ["filePath"]}}}]
        return "/v1/chat/completions", {"model": "gemma", "max_tokens": 1, "messages": msgs, "tools": tools}, \
            {"x-session-affinity": key, "x-session-id": key}
    if shape != "codex":
        raise ValueError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")
    items: list[JSONObject] = [{"type": "message", "role": "developer",
                                "content": [{"type": "input_text", "text": SYSTEM[shape]}]},
                               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}]
    if tool_text is not None:
        items += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": narration}]},
                  {"type": "function_call", "call_id": "call_01", "name": "shell",
                   "arguments": json.dumps({"command": ["cat", path]})},
                  {"type": "function_call_output", "call_id": "call_01", "output": tool_text}]
    tools = [{"type": "function", "name": "shell", "description": "Runs a shell command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "array",
                                                                          "items": {"type": "string"}}},
                             "required": ["command"]}}]
    return "/v1/responses", {"model": "gemma", "max_output_tokens": 16, "input": items, "tools": tools,
                             "prompt_cache_key": key, "store": False}, {"session-id": key}


# ----------------------------------------------------------------------------------------------- mined


_TOKEN = re.compile(r"``[^`\n]+``|`[^`\n]+`|\b[A-Za-z_][\w.]*\(\)")  # a backticked name, or name()
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _mention(token: str) -> list[str]:
    """The names a token may refer to: ``a.B.c()`` → ``B.c``, ``c``."""
    m = _NAME.match(token.strip("`"))
    if m is None or m.end() < len(token.strip("`").removesuffix("()")):
        return []
    parts = m.group(0).split(".")
    return [".".join(parts[-2:]), parts[-1]] if len(parts) > 1 else [parts[-1]]


def _package_files(site: Path, dist: metadata.Distribution) -> list[str]:
    out = []
    for f in dist.files or ():
        p = str(f)
        if not p.endswith(".py") or p.startswith("..") or any(
                part in ("tests", "test", "_vendor", "vendor", "testing") for part in Path(p).parts):
            continue
        full = site / p
        try:
            size = full.stat().st_size
        except OSError:
            continue
        if MIN_CHARS <= size <= MAX_CHARS:
            out.append(p)
    return sorted(out)


def _properties(text: str) -> set[str]:
    """Qualified names of the properties (and their setters) of the module-level classes: attributes, not
    behaviour, so never a mined sentence's gold."""
    out = set()
    for cls in ast.parse(text).body:
        if isinstance(cls, ast.ClassDef):
            for n in cls.body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                        (isinstance(d, ast.Name) and d.id in ("property", "cached_property"))
                        or (isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter", "cached_property"))
                        for d in n.decorator_list):
                    out.add(f"{cls.name}.{n.name}")
    return out


def _distribution(site: Path, package: str) -> metadata.Distribution | None:
    """``package``'s distribution as installed in ``site`` (e.g. ``--site`` a ``pip --target`` directory), else
    as this interpreter finds it; None when neither has it."""
    found = next(iter(metadata.distributions(name=package, path=[str(site)])), None)
    if found is not None:
        return found
    try:
        return metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None


def mine(site: Path, packages: list[str], seed: int, split: str | None = None) -> list[Task]:
    """Step 1: sentences of each package's ``METADATA`` description that name one of its functions or methods
    (defined once, in a file of ``MIN_CHARS``-``MAX_CHARS``), the name replaced by "this"; up to
    ``MINED_PER_PACKAGE`` per package, in a seeded order; in ``split`` (default: the package's by hash)."""
    out: list[Task] = []
    for package in packages:
        dist = _distribution(site, package)
        if dist is None:
            continue
        raw = dist.read_text("METADATA") or ""
        desc = raw.split("\n\n", 1)[1] if "\n\n" in raw else ""  # the description follows the headers
        if not desc:
            continue
        owners: dict[str, list[tuple[str, str]]] = {}  # name as written → (path, qualname)
        for p in _package_files(site, dist):
            try:
                defs = definitions((site / p).read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            props = _properties((site / p).read_text(encoding="utf-8"))
            for q, spans in defs.items():
                if len(spans) != 1 or q.split(".")[-1].startswith("_") or q in props:
                    continue
                owners.setdefault(q, []).append((p, q))
                if "." in q:
                    owners.setdefault(q.split(".")[-1], []).append((p, q))
        found: list[Task] = []
        seen: set[str] = set()
        for raw in re.split(r"(?<=[.!?])\s+|\n\s*\n|\n\s*[-*] ", desc):
            sentence = " ".join(raw.split())
            if not 40 <= len(sentence) <= 300 or sentence in seen or any(c in sentence for c in _CODE_MARKS):
                continue
            for m in _TOKEN.finditer(sentence):
                hits = next((owners[n] for n in _mention(m.group(0)) if len(n) >= 4 and n in owners), [])
                if len(hits) != 1:
                    continue
                path, q = hits[0]
                text = (sentence[:m.start()] + "this" + sentence[m.end():]).strip()
                text = re.sub(r"\b[Tt]he this\b", "this", text).replace(".this", "this")
                if q.split(".")[-1] in text or len(text.split()) < 6:
                    continue
                seen.add(sentence)
                found.append(Task(f"{package}-mined-{len(found) + 1}", package, path, q, "mined",
                                  split or common.split_of(package), text, dist.version))
                break
        random.Random(f"{seed}-{package}").shuffle(found)
        out += found[:MINED_PER_PACKAGE]
    return out


# ----------------------------------------------------------------------------------------------- offline ranking

_WORD = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|[0-9]+")


def words(text: str) -> list[str]:
    """Lower-cased words, identifiers split at underscores and case changes (``parse_HTTPDate`` → parse, http,
    date)."""
    return [w.lower() for w in _WORD.findall(text) if len(w) > 1]


def bm25_keeps_gold(text: str, task: str, gold: tuple[int, int], share: float = 0.30) -> bool:
    """Step 6: an offline ranking of the file's definitions (module-level functions, methods of module-level
    classes) by plain BM25 (k1 1.5, b 0.75) of the task's words over each definition's split words, filled
    greedily (best first, skipping what does not fit) to ``share`` of the file's characters: is the gold
    among them? What the ranking alone would keep, beside what the proxy served."""
    import math

    lines = lines_of(text)
    spans = [s for ss in definitions(text).values() for s in ss]
    docs = [words("\n".join(lines[a - 1:b])) for a, b in spans]
    if not docs:
        return False
    n, avg = len(docs), sum(map(len, docs)) / len(docs) or 1.0
    df: Counter[str] = Counter(w for d in docs for w in set(d))
    query = set(words(task))
    scores = []
    for d in docs:
        tf = Counter(d)
        scores.append(sum(math.log(1 + (n - df[q] + 0.5) / (df[q] + 0.5)) * tf[q] * 2.5
                          / (tf[q] + 1.5 * (0.25 + 0.75 * len(d) / avg)) for q in query if tf[q]))
    budget = share * len(text)
    used, kept = 0, set()
    for i in sorted(range(n), key=lambda i: -scores[i]):
        size = sum(len(line) + 1 for line in lines[spans[i][0] - 1:spans[i][1]])
        if used + size <= budget:
            used += size
            kept.add(spans[i])
    return gold in kept


# ----------------------------------------------------------------------------------------------- run


def interleave(tasks: list[Task]) -> list[Task]:
    """One task of each package in turn (a package's own order kept), so a ``--limit`` run spans packages."""
    by: dict[str, list[Task]] = {}
    for t in tasks:
        by.setdefault(t.package, []).append(t)
    out: list[Task] = []
    while any(by.values()):
        for group in by.values():
            if group:
                out.append(group.pop(0))
    return out


def select_ids(tasks: list[Task], ids: str | None) -> list[Task]:
    """``--ids``: the tasks whose id matches one of the comma-separated ids or globs (``fnmatch``, case-sensitive);
    all of them when ``ids`` is empty. A pattern that matches no task is an error (a typo would otherwise measure
    nothing and say so only by a short table)."""
    pats = [p.strip() for p in (ids or "").split(",") if p.strip()]
    if not pats:
        return tasks
    unmatched = [p for p in pats if not any(fnmatch.fnmatchcase(t.id, p) for t in tasks)]
    if unmatched:
        raise ValueError(f"--ids: no case of this split matches {', '.join(unmatched)}")
    return [t for t in tasks if any(fnmatch.fnmatchcase(t.id, p) for p in pats)]


def bucket(tokens: int | None) -> str:
    for lo, hi, label in BUCKETS:
        if tokens is not None and lo <= tokens < hi:
            return label
    return "?"


async def _one(h: common.Harness, scorer: str, shape: str, variant: str, t: Task, text: str,
               span: tuple[int, int], seed: int) -> JSONObject:
    path = f"{WORKDIR}/{t.path}"
    key = f"code-tasks-{common.new_session()}"
    narration = random.Random(f"{seed}-{t.id}").choice(NARRATION).format(name=Path(t.path).name)
    tool_text = render(text, shape, path)
    if variant == "warm":
        route, body, headers = request(shape, t.task, path, None, key, narration)
        await h.send(scorer, route, body, headers)
    route, body, headers = request(shape, t.task, path, tool_text, key, narration)
    sent = await h.send(scorer, route, body, headers)
    served = sent.text
    return {"id": t.id, "package": t.package, "split": t.split, "kind": t.kind, "gold_name": t.gold,
            "scorer": scorer, "shape": shape, "variant": variant, "status": sent.status, "mode": sent.mode,
            "reason": sent.reason, "tokens_in": sent.tokens_in, "tokens_kept": sent.tokens_kept, "kept": sent.kept,
            "bucket": bucket(sent.tokens_in), "gold": gold_block(text, span, shape) in served,
            "gold_lines": span[1] - span[0] + 1, "checked_in": sent.checked_in,
            "bm25_at_30": bm25_keeps_gold(text, t.task, span),
            "gold_lines_kept": sum(line in served for line in gold_block(text, span, shape).split("\n") if line.strip())}


async def run(opts: argparse.Namespace) -> JSONObject:
    site = Path(opts.site) if getattr(opts, "site", None) else site_packages()
    t0, commit = time.perf_counter(), common.commit()  # the tree the run started from
    cases = load_cases(getattr(opts, "cases_file", None) or CASES)
    tasks = [t for t in cases if in_split(t, opts.split)]
    if opts.mined:  # each split's packages' sentences, in that split
        for split in (SPENT if opts.split == "spent" else (opts.split,)):
            tasks += mine(site, sorted({t.package for t in cases if t.split == split}), opts.seed, split)
    if opts.families:
        tasks = [t for t in tasks if t.kind in opts.families]
    tasks = select_ids(tasks, getattr(opts, "ids", None))
    tasks = interleave(tasks)
    if opts.limit:
        tasks = tasks[:opts.limit]
    ready: list[tuple[Task, str, tuple[int, int]]] = []
    skipped: dict[str, str] = {}
    for t in tasks:
        try:
            text = (site / t.path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            skipped[t.id] = f"cannot read {t.path}: {exc}"
            continue
        span = gold_span(text, t.gold)
        if span is None:
            skipped[t.id] = f"{t.gold} is not defined exactly once in {t.path}"
            continue
        ready.append((t, text, span))
    records: list[JSONObject] = []
    async with common.Harness(opts) as h:
        jobs = [(t, text, span, scorer, shape, variant) for t, text, span in ready for scorer in h.proxies
                for shape in opts.shapes for variant in opts.variants]
        bar = Progress(max(1, len(jobs)), "code-tasks")
        bar(0)
        gate = asyncio.Semaphore(max(1, opts.concurrency))

        async def one(i: int, job: tuple[Task, str, tuple[int, int], str, str, str]) -> tuple[int, JSONObject]:
            t, text, span, scorer, shape, variant = job
            async with gate:
                rec = await _one(h, scorer, shape, variant, t, text, span, opts.seed)
            bar.advance(f"{t.package} {scorer}")
            return i, rec

        try:
            done = await asyncio.gather(*(one(i, j) for i, j in enumerate(jobs)))
        finally:
            bar.close()
        records = [r for _, r in sorted(done, key=lambda x: x[0])]
        unavailable = dict(h.unavailable)
    versions = {}
    for t, _, _ in ready:
        dist = _distribution(site, t.package)
        versions[t.package] = dist.version if dist is not None else "?"
    return {"bench": "code-tasks", "commit": commit, "forward": bool(getattr(opts, "forward", False)),
            "split": opts.split, "seed": opts.seed,
            "threshold": opts.threshold, "site": str(site), "shapes": list(opts.shapes),
            "variants": list(opts.variants), "scorers": list(opts.scorers), "unavailable": unavailable,
            "mined": bool(opts.mined), "limit": opts.limit, "packages": versions, "skipped": skipped,
            "cases": [asdict(t) for t, _, _ in ready], "seconds": round(time.perf_counter() - t0, 1),
            "records": records}


# ----------------------------------------------------------------------------------------------- report


def _cells(rs: list[JSONObject]) -> list[object]:
    comp = [r for r in rs if r["mode"] == "compressed"]
    return [len(rs), common.pct(sum(bool(r["gold"]) for r in rs), len(rs)),
            common.median([float(r["kept"]) for r in rs]),  # type: ignore[arg-type]
            common.pct(len(rs) - len(comp), len(rs)),
            common.pct(sum(bool(r.get("bm25_at_30")) for r in rs), len(rs)) if "bm25_at_30" in rs[0] else None]


def tables(data: JSONObject) -> list[Table]:
    recs = common.objects(data["records"])
    out = []
    heads = ["scorer", "shape", "group", "reads", "gold whole", "median kept", "served whole",
             "offline BM25 keeps it (30 %)"]
    body: list[list[object]] = []
    for scorer in data["scorers"]:  # type: ignore[union-attr]
        for shape in data["shapes"]:  # type: ignore[union-attr]
            rs = [r for r in recs if r["scorer"] == scorer and r["shape"] == shape]
            if not rs:
                continue
            written = [r for r in rs if r["kind"] != "mined"]
            groups = [("all", rs), ("written (all but mined)", written),
                      ("written, reads >= 4K", [r for r in written if r["bucket"] != "<4K"])]
            groups += [(f"size {label}", [r for r in rs if r["bucket"] == label]) for _, _, label in BUCKETS]
            if data["split"] == "spent":  # each split's written reads of 4K tokens and more
                groups += [(f"split {s}, written >= 4K", [r for r in written if r["split"] == s and
                                                          r["bucket"] != "<4K"]) for s in SPENT]
            groups += [(f"kind {k}", [r for r in rs if r["kind"] == k])
                       for k in ("bug", "how", "why", "change", "mined")]
            groups += [(f"variant {v}", [r for r in rs if r["variant"] == v]) for v in data["variants"]]  # type: ignore[union-attr]
            for label, g in groups:
                if g:
                    body.append([scorer, shape, label] + _cells(g))
    out.append(Table(f"{data['split']} split: the needed definition whole in what llama-server would receive",
                     heads, body))
    modes = Counter(f"{r['scorer']} {r['mode']}" for r in recs)
    out.append(Table("Modes", ["scorer mode", "reads"], sorted(modes.items())))
    miss = [[r["scorer"], r["shape"], r["variant"], r["id"], r["kind"], r["bucket"], r["mode"], r["kept"],
             f"{r.get('gold_lines_kept', '?')}/{r['gold_lines']}"] for r in recs if not r["gold"]]
    out.append(Table(f"Gold not whole ({len(miss)} reads)",
                     ["scorer", "shape", "variant", "case", "kind", "size", "mode", "kept", "gold lines kept"], miss))
    pk = Counter(str(c["package"]) for c in common.objects(data["cases"]))
    out.append(Table("Packages (version installed, cases)", ["package", "version", "cases"],
                     [[p, data["packages"].get(p), n] for p, n in sorted(pk.items())]))  # type: ignore[union-attr]
    if data["skipped"]:
        out.append(Table("Skipped", ["case", "why"], sorted(data["skipped"].items())))  # type: ignore[union-attr]
    return out


def main(opts: argparse.Namespace) -> tuple[str, list[Path]]:
    opts.shapes = [s for s in (opts.shapes or "claude,claude-arrow,opencode,codex").split(",") if s] \
        if isinstance(opts.shapes, str) or opts.shapes is None else opts.shapes
    opts.variants = [v for v in (opts.variants or "warm").split(",") if v] \
        if isinstance(opts.variants, str) or opts.variants is None else opts.variants
    bad = [s for s in opts.shapes if s not in SHAPES] + [v for v in opts.variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown shape or variant {', '.join(bad)} (shapes: {', '.join(SHAPES)}; variants: "
                         f"{', '.join(VARIANTS)})")
    data = asyncio.run(run(opts))
    extra = ["--shapes", ",".join(opts.shapes), "--variants", ",".join(opts.variants)]
    if not opts.mined:
        extra.append("--no-mined")
    if opts.families:
        extra += ["--families", ",".join(opts.families)]
    if getattr(opts, "ids", None):
        extra += ["--ids", opts.ids]
    data["command"] = common.command_of("code-tasks", opts, extra)
    return report(data, Path(opts.out))


def report(data: JSONObject, out: Path) -> tuple[str, list[Path]]:
    """``code-tasks.md`` and ``code-tasks.json`` of a run (also ``--render``)."""
    cases = common.objects(data["cases"])
    kinds = Counter(str(c["kind"]) for c in cases)
    notes = [f"command: `{data.get('command')}`",
             f"commit {data['commit']}, split `{data['split']}`, threshold {data['threshold']}, "
             f"{len(cases)} cases ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}) from "
             f"{len(data['packages'])} packages of `{data['site']}`; run took {data['seconds']} s",  # type: ignore[arg-type]
             "each task sent as an agent sends it: the task as the user's turn (warm: first on its own), then the "
             "assistant's narration, a read tool call and the read's result in the client's shape, through the "
             "proxy's real routes, " + ("forwarded to llama-server (checked in the body it received)" if data.get("forward")
                                       else "stopped before the forward") + "; token counts are llama-server's (gemma)",
             "gold whole = the definition's lines (first decorator to end, from `ast`), as the shape prints them, "
             "in one piece in the forwarded body; kept = served message tokens / message tokens (1.0 "
             "when served whole); size = the read's tokens"]
    return common.write(out, "code-tasks", "Code tasks in users' words", data, tables(data), notes)
