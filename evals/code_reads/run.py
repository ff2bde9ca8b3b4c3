"""``bench code-reads``: each generated case read by an agent through the real proxy; is the function served whole?

1. Cases: ``generator.generate`` over the proxy's own site-packages (``--site``), ``--seed``, ``--split``, the
   first ``--limit``.
2. One llama-server (spawned like ``--spawn``, or ``--upstream``) for the token counts the proxy uses
   (``/tokenize`` with pieces, ``input_tokens``); nothing is prefilled. One in-process proxy per ``--scorers``
   entry (``runner.Proxy``: the product's stages, the scorer built by ``stages.scorers.build_scorer`` from the
   same settings ``serve`` would get), ending in a ``Recorder`` that keeps what would be forwarded and stops
   the request there (``DryRun``).
3. Each case in each ``SHAPES`` entry, as that client sends it (``request``): ``claude`` (Anthropic Messages,
   the Read tool's ``N<TAB>line``), ``opencode`` (chat completions, ``N: line`` inside its ``<path>…<content>``
   wrapper and "(End of file - total N lines)"), ``cat`` (Responses, Codex's shell tool, the raw file). The task
   is "Read FILE and answer: QUESTION"; the system prompt is one line and the only tool is the read tool, so the
   prompt's uncached part is the read itself, as in a session whose instructions are already cached.
   ``VARIANTS``: ``warm`` sends the task alone first (the session then holds a turn: a flat ranking is still
   compressed), ``cold`` sends the read without that turn (as after a restart: the flat gate applies).
4. Measured per read: the function's lines, as the shape prints them, in one piece in the forwarded tool
   result (``gold``); the mode and its reason; kept = the served message's tokens over the message's
   (llama-server's counts, 1.0 when served whole); served whole = any mode but ``compressed``.
5. ``report``: per split (test first: the headline), per scorer, variant and kind, per shape: function whole,
   median kept, served whole; the modes; the misses. ``report.md``, ``results.json`` and ``command.txt`` in
   ``--out``.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import argparse
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, NotRequired, TypedDict

import aiohttp

from pflash_proxy.bench.report import Table, markdown_table
from pflash_proxy.bench.runner import BENCH_HEADER, DryRun, LlamaProc, Proxy, bench_settings, new_id
from evals.code_reads.generator import KINDS, CodeCase, generate, read_source, site_packages
from pflash_proxy.progress import Progress
from pflash_proxy.contract import ProxyRequest, Stage
from pflash_proxy.jsontypes import JSONObject, JSONValue
from pflash_proxy.models import message_text

if TYPE_CHECKING:
    from pflash_proxy.config import Settings
    from pflash_proxy.stages.scorers import Scoring

SHAPES = ("claude", "opencode", "cat")
VARIANTS = ("warm", "cold")
OPENCODE_HEAD = "<path>{path}</path>\n<type>file</type>\n<content>\n"  # tests/compress/test_gutter.py
OPENCODE_FOOT = "\n(End of file - total {n} lines)\n</content>"
SYSTEM = {"claude": "You are Claude Code, a coding agent.", "opencode": "You are opencode, a coding agent.",
          "cat": "You are Codex, a coding agent."}
WORKDIR = "/work"


def lines_of(text: str) -> list[str]:
    """A file's lines as a read tool numbers them (no empty last line after a final newline)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def render(text: str, shape: str, path: str) -> str:
    """The file as the client's read tool returns it (step 3)."""
    lines = lines_of(text)
    if shape == "claude":
        return "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, 1))
    if shape == "opencode":
        body = "\n".join(f"{n}: {line}" for n, line in enumerate(lines, 1))
        return OPENCODE_HEAD.format(path=path) + body + "\n" + OPENCODE_FOOT.format(n=len(lines))
    if shape == "cat":
        return text
    raise ValueError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")


def gold_block(text: str, span: tuple[int, int], shape: str) -> str:
    """The function's lines (1-based inclusive ``span``) as ``shape`` prints them, joined by newlines."""
    lines = lines_of(text)[span[0] - 1:span[1]]
    if shape == "claude":
        return "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, span[0]))
    if shape == "opencode":
        return "\n".join(f"{n}: {line}" for n, line in enumerate(lines, span[0]))
    return "\n".join(lines)


def request(shape: str, case: CodeCase, tool_text: str, key: str, with_read: bool) -> tuple[str, JSONObject, dict[str, str]]:
    """(route, body, headers) of one turn: the task alone (``with_read`` False) or the task with the read."""
    path = f"{WORKDIR}/{case.path}"
    task = f"Read {case.path} and answer: {case.question}"
    if shape == "claude":
        msgs: list[JSONObject] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
        if with_read:
            msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "Read",
                                                        "input": {"file_path": path}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                                   "content": tool_text}]}]
        tools: list[JSONObject] = [{"name": "Read", "description": "Reads a file from the local filesystem.",
                  "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                                   "required": ["file_path"]}}]
        return "/v1/messages", {
            "model": "gemma", "max_tokens": 1, "messages": msgs, "tools": tools,
            "metadata": {"user_id": json.dumps({"device_id": "bench", "account_uuid": "", "session_id": key})},
            "system": [{"type": "text", "text": SYSTEM[shape]}]}, {}
    if shape == "opencode":
        msgs = [{"role": "system", "content": SYSTEM[shape]}, {"role": "user", "content": task}]
        if with_read:
            msgs += [{"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_01", "type": "function",
                 "function": {"name": "read", "arguments": json.dumps({"filePath": path})}}]},
                {"role": "tool", "tool_call_id": "call_01", "content": tool_text}]
        tools = [{"type": "function", "function": {"name": "read", "description": "Read a file.",
                                                  "parameters": {"type": "object", "properties": {
                                                      "filePath": {"type": "string"}}, "required": ["filePath"]}}}]
        return "/v1/chat/completions", {"model": "gemma", "max_tokens": 1, "messages": msgs, "tools": tools}, \
            {"x-session-affinity": key}
    items: list[JSONObject] = [{"type": "message", "role": "developer",
                          "content": [{"type": "input_text", "text": SYSTEM[shape]}]},
                         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}]
    if with_read:
        items += [{"type": "function_call", "call_id": "call_01", "name": "shell",
                   "arguments": json.dumps({"command": ["cat", path]})},
                  {"type": "function_call_output", "call_id": "call_01", "output": tool_text}]
    tools = [{"type": "function", "name": "shell", "description": "Runs a shell command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "array",
                                                                          "items": {"type": "string"}}},
                             "required": ["command"]}}]
    return "/v1/responses", {"model": "gemma", "max_output_tokens": 16, "input": items, "tools": tools,
                             "prompt_cache_key": key, "store": False}, {}


@dataclass
class Seen:
    messages: list[JSONObject]  # the conversation as the proxy would forward it (chat messages)
    fields: JSONObject  # the request's log fields


class CodeRead(TypedDict):
    """One read of one case through one scorer, shape and variant."""

    case_id: str
    split: str
    package: str
    kind: str
    shared: bool
    shape: str
    variant: str
    status: int
    mode: str
    gold: bool  # the function's lines arrived in one piece
    tokens_in: int | None
    tokens_kept: int | None
    budget: JSONValue
    kept: float
    units: list[JSONValue]  # [kept, in]
    gutter: JSONValue
    reason: JSONValue
    seconds: float
    pflash_ms: JSONValue
    scorer: NotRequired[str]


class PackageInfo(TypedDict):
    version: str
    split: str


class CodeReadsRun(TypedDict):
    """``run``'s result (``results.json``), the report's input."""

    bench: str
    seed: int
    split: str
    limit: int | None
    threshold: int
    site: str
    shapes: list[str]
    variants: list[str]
    scorers: list[str]
    unavailable: dict[str, str]
    drafter: str | None
    drafter_limit: int
    commit: str | None
    packages: dict[str, PackageInfo]
    cases: list[JSONObject]  # ``CodeCase.to_json``
    seconds: float
    records: list[CodeRead]


def _int(value: JSONValue) -> int | None:
    """A log field that counts something (tokens), or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Recorder(Stage):
    """Last stage: the conversation as it would be forwarded (any dialect), per ``X-Bench-Id``; never forwards."""

    name = "code-reads-recorder"

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}

    async def on_request(self, req: ProxyRequest) -> None:
        key = req.headers.get(BENCH_HEADER)
        if key:
            self.seen[key] = Seen([dict(m) for m in req.messages], dict(req.log_fields))
        raise DryRun("dry run: not forwarded")


def tool_text_of(messages: list[JSONObject]) -> str | None:
    texts = [message_text(m.get("content")) for m in messages if m.get("role") == "tool"]
    return texts[-1] if texts else None


def build(names: list[str], opts: argparse.Namespace, llama_url: str, work: Path,
          slot_dir: Path) -> dict[str, str | tuple[Settings, Scoring | None]]:
    """scorer name → a started ``Proxy``'s settings and scorer, or a string saying why it cannot run."""
    from pflash_proxy.stages.scorers import SCORERS, DrafterSetupError, build_scorer

    out: dict[str, str | tuple[Settings, Scoring | None]] = {}
    for name in names:
        entry = SCORERS.get(name)
        if entry is None:
            out[name] = f"unknown scorer {name!r} (one of {', '.join(SCORERS)})"
            continue
        extra: dict[str, object] = {}
        if entry.needs.drafter:
            if not getattr(opts, "drafter", None):
                out[name] = "unavailable: no drafter configured (--drafter GGUF)"
                continue
            extra = dict(scorer=name, drafter=Path(opts.drafter), drafter_ctx=32768, drafter_cache_mb=2048,
                         drafter_timeout_s=getattr(opts, "drafter_timeout", 1800.0))
        settings = bench_settings(llama_url, work / f"proxy-{name}", slot_dir, threshold=opts.threshold, **extra)
        try:
            scoring = build_scorer(settings) if entry.needs.drafter else None
        except DrafterSetupError as exc:
            out[name] = f"unavailable: {exc}"
            continue
        out[name] = (settings, scoring)
    return out


async def _read(http: aiohttp.ClientSession, proxy: Proxy, recorder: Recorder, shape: str, variant: str,
                case: CodeCase, text: str) -> CodeRead:
    tool_text = render(text, shape, f"{WORKDIR}/{case.path}")
    key = f"code-reads-{new_id()}"
    turns = [False, True] if variant == "warm" else [True]
    t0 = time.perf_counter()
    for with_read in turns:
        route, body, headers = request(shape, case, tool_text, key, with_read)
        bench_id = new_id()
        async with http.post(proxy.url + route, json=body, headers={**headers, BENCH_HEADER: bench_id}) as r:
            await r.read()
            status, h = r.status, dict(r.headers)
        seen = recorder.seen.pop(bench_id, None)
    served = tool_text_of(seen.messages) if seen is not None else None
    fields = seen.fields if seen is not None else {}
    mode = h.get("X-PFlash-Mode", "?")
    tokens_in = _int(fields.get("tokens_in"))
    kept_tokens = _int(fields.get("tokens_kept")) if mode == "compressed" else tokens_in
    reason = fields.get("pflash_reason") or ("below the threshold" if mode == "passthrough" else None)
    return {"case_id": case.case_id, "split": case.split, "package": case.package, "kind": case.kind,
            "shared": case.shared, "shape": shape, "variant": variant, "status": status, "mode": mode,
            "gold": served is not None and gold_block(text, case.span, shape) in served,
            "tokens_in": tokens_in, "tokens_kept": kept_tokens, "budget": fields.get("budget_tokens"),
            "kept": round(kept_tokens / tokens_in, 4) if tokens_in and kept_tokens is not None else 1.0,
            "units": [fields.get("units_kept"), fields.get("units_in")], "gutter": fields.get("gutter"),
            "reason": reason, "seconds": round(time.perf_counter() - t0, 3), "pflash_ms": fields.get("pflash_ms")}


async def run(opts: argparse.Namespace) -> CodeReadsRun:
    site = Path(opts.site) if getattr(opts, "site", None) else site_packages()
    t0 = time.perf_counter()
    cases = generate(site, opts.seed, split=opts.split)
    if opts.limit:
        cases = cases[:opts.limit]
    texts = {c.path: read_source(site, c) for c in cases}
    work = Path(opts.workdir)
    llama = LlamaProc(work / "llama", opts.upstream, opts.model, ctx_per_slot=8192,
                      parallel=max(2, getattr(opts, "concurrency", 1)))
    await llama.start()
    records: list[CodeRead] = []
    built: dict[str, str | tuple[Settings, Scoring | None]] = {}
    unavailable: dict[str, str] = {}
    try:
        built = build(opts.scorers, opts, llama.url, work, llama.slot_dir)
        unavailable = {k: v for k, v in built.items() if isinstance(v, str)}
        proxies: dict[str, tuple[Proxy, Recorder]] = {}
        for name, v in built.items():
            if isinstance(v, str):
                continue
            settings, scoring = v
            proxy = Proxy(settings, scorer=scoring.scorer if scoring is not None else None, dry_run=True)
            recorder = Recorder()
            proxy.recorder = recorder  # type: ignore[assignment]  # any dialect, and the served conversation
            proxies[name] = (await proxy.__aenter__(), recorder)
        limit = getattr(opts, "drafter_limit", 0)
        jobs = [(i, case, name, shape, variant) for i, case in enumerate(cases) for name in proxies
                if not (limit and name != "lexical" and i >= limit)
                for shape in opts.shapes for variant in opts.variants]
        bar = Progress(max(len(jobs), 1), "code-reads")
        bar(0)
        gate = asyncio.Semaphore(max(1, getattr(opts, "concurrency", 1)))

        async def one(job: tuple[int, CodeCase, str, str, str]) -> tuple[tuple[int, int, int, int], CodeRead]:
            i, case, name, shape, variant = job
            proxy, recorder = proxies[name]
            async with gate:
                rec = await _read(http, proxy, recorder, shape, variant, case, texts[case.path])
            rec["scorer"] = name
            bar.advance(f"{case.package} {name}")
            order = (i, list(proxies).index(name), list(opts.shapes).index(shape), list(opts.variants).index(variant))
            return order, rec

        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=3600)) as http:
                # reads of different sessions in flight together (the proxy queues them for its slots); the
                # records are put back in case, scorer, shape, variant order
                done = await asyncio.gather(*(one(j) for j in jobs))
                records += [rec for _, rec in sorted(done, key=lambda x: x[0])]
        finally:
            bar.close()
            for proxy, _ in proxies.values():
                await proxy.__aexit__(None, None, None)
    finally:
        for v in built.values():
            if not isinstance(v, str) and v[1] is not None:
                v[1].close()
        await llama.stop()
    versions: dict[str, PackageInfo] = {}
    for c in cases:
        versions[c.package] = {"version": c.version, "split": c.split}
    return {"bench": "code-reads", "seed": opts.seed, "split": opts.split, "limit": opts.limit,
            "threshold": opts.threshold, "site": str(site), "shapes": list(opts.shapes),
            "variants": list(opts.variants), "scorers": list(opts.scorers), "unavailable": unavailable,
            "drafter": str(opts.drafter) if getattr(opts, "drafter", None) else None,
            "drafter_limit": getattr(opts, "drafter_limit", 0), "commit": commit(),
            "packages": dict(sorted(versions.items())), "cases": [c.to_json() for c in cases],
            "seconds": round(time.perf_counter() - t0, 1), "records": records}


def commit() -> str | None:
    """The checkout's short HEAD, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------------------------- report


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "–"


def _cells(rs: list[CodeRead]) -> list[str]:
    if not rs:
        return ["–", "–", "–"]
    return [_pct(sum(r["gold"] for r in rs), len(rs)), f"{statistics.median(r['kept'] for r in rs):.3f}",
            _pct(sum(r["mode"] != "compressed" for r in rs), len(rs))]


def tables(data: CodeReadsRun) -> list[Table]:
    recs = data["records"]
    shapes = data["shapes"]
    heads = ["scorer", "variant", "kind"] + [h for s in shapes for h in (f"{s} whole", f"{s} kept",
                                                                       f"{s} served whole")]
    def kind_is(kind: str) -> Callable[[CodeRead], bool]:
        return lambda r: r["kind"] == kind

    groups: list[tuple[str, Callable[[CodeRead], bool]]] = [(k, kind_is(k)) for k in KINDS]
    groups.insert(2, ("qualified: dunder/shared", lambda r: r["kind"] == "qualified" and bool(r["shared"])))
    groups.append(("all", lambda r: True))
    out = []
    splits = [s for s in ("test", "train") if any(r["split"] == s for r in recs)]
    for split in splits:
        body: list[Sequence[object]] = []
        for scorer in data["scorers"]:
            if scorer in data["unavailable"]:
                body.append([scorer, "–", data["unavailable"][scorer]] + ["–"] * (3 * len(shapes)))
                continue
            for variant in data["variants"]:
                for label, pick in groups:
                    row: list[object] = [scorer, variant, label]
                    for shape in shapes:
                        row += _cells([r for r in recs if r["split"] == split and r["scorer"] == scorer
                                       and r["variant"] == variant and r["shape"] == shape and pick(r)])
                    body.append(row)
        n_cases = len({r["case_id"] for r in recs if r["split"] == split})
        n_pk = len({r["package"] for r in recs if r["split"] == split})
        title = (f"{split} split{' (headline)' if split == 'test' else ''}: {n_cases} cases from {n_pk} packages;"
                 " function whole / median kept fraction / served whole")
        out.append(Table(title, heads, body))
    modes = []
    for split in splits:
        for scorer in data["scorers"]:
            for variant in data["variants"]:
                rs = [r for r in recs if r["split"] == split and r["scorer"] == scorer and r["variant"] == variant]
                if rs:
                    c = Counter(r["mode"] for r in rs)
                    modes.append([split, scorer, variant, len(rs)] + [c.get(m, 0) for m in
                                                                      ("compressed", "full-flat", "passthrough",
                                                                       "full-error")]
                                 + [sum(v for m, v in c.items() if m not in ("compressed", "full-flat",
                                                                             "passthrough", "full-error"))])
    out.append(Table("Modes (reads per split, scorer and variant)",
                     ["split", "scorer", "variant", "reads", "compressed", "full-flat", "passthrough", "full-error",
                      "other"], modes))
    miss = [[r["split"], r["scorer"], r["variant"], r["shape"], r["kind"], r["case_id"], r["mode"], r["kept"],
             r["reason"] or ""] for r in recs if not r["gold"] and r["split"] == "test" and r["variant"] == "warm"]
    out.append(Table(f"Test split, warm: function not whole ({len(miss)} reads)",
                     ["split", "scorer", "variant", "shape", "kind", "case", "mode", "kept", "reason"], miss))
    pk = [[name, v["version"], v["split"], sum(c["package"] == name for c in data["cases"])]
          for name, v in data["packages"].items()]
    out.append(Table("Packages (version installed, split, cases)", ["package", "version", "split", "cases"], pk))
    return out


def report(data: CodeReadsRun, out_dir: Path, command: str) -> tuple[str, list[Path]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    kinds = Counter(c["kind"] for c in data["cases"])
    notes = [f"command: `{command}`",
             f"commit {data.get('commit') or '?'}, seed {data['seed']}, split `{data['split']}`, threshold "
             f"{data['threshold']}, {len(data['cases'])} cases ({', '.join(f'{k} {kinds[k]}' for k in KINDS)}) "
             f"from {len(data['packages'])} packages of `{data['site']}`",
             "each case read in each shape (claude `N<TAB>line`, opencode `N: line` in its wrapper, cat raw) through "
             "the proxy's real routes (Anthropic Messages, chat completions, Responses), stopped before the forward; "
             "token counts are llama-server's (gemma tokenizer); warm = the task sent first as its own turn, cold = "
             "the read without it",
             "whole = the function's lines (first decorator through the end of its body, from `ast`) in one piece in "
             "the forwarded tool result; kept = served message tokens / message tokens (1.0 when served whole); "
             "served whole = any mode but `compressed`",
             f"run took {data['seconds']} s"]
    if data.get("drafter_limit"):
        notes.append(f"drafter scorers ran on the first {data['drafter_limit']} cases of the split only (seeded "
                     f"order, kinds interleaved); lexical on all")
    md = "\n".join(["# Code reads at scale, split by package", ""] + [f"- {n}" for n in notes] + [""]
                   + [markdown_table(t) for t in tables(data)])
    paths = [out_dir / "report.md", out_dir / "results.json", out_dir / "command.txt"]
    paths[0].write_text(md)
    paths[1].write_text(json.dumps(data, indent=1))
    paths[2].write_text(command + "\n")
    return md, paths


# ----------------------------------------------------------------------------------------------- command line

THRESHOLD = 2048  # the proxy's agent-read setting the measurements in docs/results.md use
DEFAULT_OUT = "benchmarks/results"


def command_of(args: argparse.Namespace) -> str:
    """The command line that repeats this run (every option that matters, defaults spelled out)."""
    argv = ["python", "-m", "evals", "code-reads", "--split", args.split, "--seed", str(args.seed),
            "--threshold", str(args.threshold), "--scorers", ",".join(args.scorers),
            "--shapes", ",".join(args.shapes), "--variants", ",".join(args.variants)]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    if getattr(args, "drafter", None):
        argv += ["--drafter", str(args.drafter)]
    if getattr(args, "drafter_limit", 0):
        argv += ["--drafter-limit", str(args.drafter_limit)]
    if getattr(args, "site", None):
        argv += ["--site", str(args.site)]
    return shlex.join(argv + ["--out", str(args.out)])


def main(args: argparse.Namespace) -> int:
    import logging
    import shutil
    import tempfile

    from pflash_proxy.bench.runner import BenchError
    from pflash_proxy.llama.spawn import SpawnError

    if args.threshold is None:
        args.threshold = THRESHOLD
    if not args.scorers:
        args.scorers = "lexical,auto" if getattr(args, "drafter", None) else "lexical"
    args.scorers = [s for s in args.scorers.split(",") if s] if isinstance(args.scorers, str) else args.scorers
    args.shapes = [s for s in args.shapes.split(",") if s] if isinstance(args.shapes, str) else args.shapes
    args.variants = [s for s in args.variants.split(",") if s] if isinstance(args.variants, str) else args.variants
    bad = [s for s in args.shapes if s not in SHAPES] + [v for v in args.variants if v not in VARIANTS]
    if bad:
        print(f"evals: unknown shape or variant {', '.join(bad)} (shapes: {', '.join(SHAPES)}; "
              f"variants: {', '.join(VARIANTS)})", file=sys.stderr)
        return 2
    if str(args.out) == DEFAULT_OUT:
        args.out = Path(DEFAULT_OUT) / "code-reads"
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.workdir = Path(tempfile.mkdtemp(prefix="pflash-bench-code-reads-"))
    try:
        data = asyncio.run(run(args))
    except (BenchError, SpawnError) as exc:
        print(f"evals: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    md, paths = report(data, Path(args.out), command_of(args))
    print(md)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0
