"""``bench every-x``: requests for every match, in many wordings, against pointed requests, over code files.

1. Wordings: ``cases/every_x.json``: ``every`` (asks for all matches: scope ``name``, every reference to a name;
   scope ``file``, the whole file) and ``pointed`` (about one definition), each split by its wording.
2. Files: the files of ``cases/code_tasks.json`` whose package is in the same split (``held-out-2``, the second
   held-out wordings: the held-out files). Per file a name (seeded):
   a function or method defined once whose bare name occurs on 3-15 other lines of the file.
3. Each wording of the split over the next file in turn (``{name}`` filled in), in two variants: ``paste`` (one
   user message: the request then the file, or the file then the request, alternating) and ``read`` (Claude
   Code's flow: the request as its own turn, then the narration, a Read call and its ``N<TAB>line`` result).
4. Measured: an ``every`` request is satisfied when served whole, or (scope ``name``) compressed with every line
   that names the name kept; a ``pointed`` request is expected to be compressed (``still compressed``).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import random
import re
import time
from collections import Counter
from pathlib import Path

from evals.code_reads.generator import site_packages
from evals.code_reads.run import lines_of
from evals import code_tasks, common
from pflash_proxy.bench.report import Table
from pflash_proxy.progress import Progress
from pflash_proxy.jsontypes import JSONObject

WORDINGS = Path(__file__).resolve().parent / "cases" / "every_x.json"
VARIANTS = ("paste", "read")


def load_wordings(split: str) -> list[JSONObject]:
    """The split's wordings, ``every`` and ``pointed`` alternating (so ``--limit`` keeps both kinds)."""
    data = json.loads(WORDINGS.read_text())
    every = [{**w, "kind": "every"} for w in data["every"] if w["split"] == split]
    pointed = [{**w, "kind": "pointed"} for w in data["pointed"] if w["split"] == split]
    out: list[JSONObject] = []
    for i in range(max(len(every), len(pointed))):
        out += every[i:i + 1] + pointed[i:i + 1]
    return out


def pick_name(text: str, seed: int, path: str) -> str | None:
    """Step 2: a function or method name defined once, named on 3-15 other lines of the file."""
    defs = code_tasks.definitions(text)
    bare = Counter(q.split(".")[-1] for q in defs)
    lines = text.split("\n")
    cands = []
    for q, spans in defs.items():
        name = q.split(".")[-1]
        if bare[name] != 1 or len(spans) != 1 or name.startswith("__") or len(name) < 4:
            continue
        pat = re.compile(rf"\b{re.escape(name)}\b")
        uses = sum(1 for i, line in enumerate(lines, 1) if pat.search(line) and i != spans[0][0]
                   and not line.lstrip().startswith(("def ", "async def ")))
        if 3 <= uses <= 15:
            cands.append(name)
    if not cands:
        return None
    return random.Random(f"{seed}-{path}").choice(sorted(cands))


def match_lines(text: str, name: str) -> list[int]:
    pat = re.compile(rf"\b{re.escape(name)}\b")
    return [i for i, line in enumerate(lines_of(text), 1) if pat.search(line)]


async def run(opts: argparse.Namespace) -> JSONObject:
    site = Path(opts.site) if getattr(opts, "site", None) else site_packages()
    t0, commit = time.perf_counter(), common.commit()  # the tree the run started from
    wordings = load_wordings(opts.split)
    files_split = "held-out" if opts.split.startswith("held-out") else opts.split  # held-out-2: new wordings
    paths = sorted({t.path for t in code_tasks.load_cases() if t.split == files_split})
    files: list[tuple[str, str, str]] = []
    for p in paths:
        try:
            text = (site / p).read_text(encoding="utf-8")
            ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        name = pick_name(text, opts.seed, p)
        if name is not None:
            files.append((p, text, name))
    if not files:
        raise ValueError(f"no usable files for the {opts.split} split under {site}")
    variants = [v for v in (opts.variants or "paste,read").split(",") if v] if isinstance(
        opts.variants, str) or opts.variants is None else list(opts.variants)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variant {', '.join(bad)} (one of {', '.join(VARIANTS)})")
    opts.variants = variants
    jobs = [(i, w, files[i % len(files)], v) for i, w in enumerate(wordings) for v in variants]
    if opts.limit:
        jobs = jobs[:opts.limit]
    records: list[JSONObject] = []
    async with common.Harness(opts) as h:
        bar = Progress(max(1, len(jobs) * len(h.proxies)), "every-x")
        bar(0)
        try:
            for i, w, (path, text, name), variant in jobs:
                request = str(w["wording"]).format(name=name)
                for scorer in h.proxies:
                    key = f"every-x-{common.new_session()}"
                    if variant == "paste":
                        msg = f"{request}\n\n{text}" if i % 2 == 0 else f"{text}\n\n{request}"
                        sent = await h.chat(scorer, [{"role": "user", "content": msg}], key)
                        served = sent.text
                        wanted = [lines_of(text)[n - 1] for n in match_lines(text, name)]
                    else:
                        full = f"{code_tasks.WORKDIR}/{path}"
                        tool_text = code_tasks.render(text, "claude", full)
                        narration = f"I'll read {Path(path).name}."
                        route, body, headers = code_tasks.request("claude", request, full, None, key, narration)
                        await h.send(scorer, route, body, headers)
                        route, body, headers = code_tasks.request("claude", request, full, tool_text, key, narration)
                        sent = await h.send(scorer, route, body, headers)
                        served = sent.text
                        lines = lines_of(text)
                        wanted = [f"{n}\t{lines[n - 1]}" for n in match_lines(text, name)]
                    every_kept = all(x in served for x in wanted)
                    whole = sent.mode != "compressed"
                    ok = (whole or (w["scope"] == "name" and every_kept)) if w["kind"] == "every" else not whole
                    records.append({"kind": w["kind"], "scope": w["scope"], "wording": w["wording"],
                                    "path": path, "name": name, "variant": variant, "scorer": scorer,
                                    "status": sent.status, "mode": sent.mode, "reason": sent.reason,
                                    "tokens_in": sent.tokens_in, "kept_fraction": sent.kept,
                                    "matches": len(wanted), "every_match_kept": every_kept, "ok": ok,
                                    "checked_in": sent.checked_in})
                    bar.advance(f"{w['kind']} {scorer}")
        finally:
            bar.close()
        unavailable = dict(h.unavailable)
    return {"bench": "every-x", "commit": commit, "forward": bool(getattr(opts, "forward", False)),
            "split": opts.split, "seed": opts.seed,
            "threshold": opts.threshold, "variants": variants, "scorers": list(opts.scorers),
            "unavailable": unavailable, "limit": opts.limit, "files": [[p, n] for p, _, n in files],
            "seconds": round(time.perf_counter() - t0, 1), "records": records}


def tables(data: JSONObject) -> list[Table]:
    recs = common.objects(data["records"])
    body = []
    for scorer in data["scorers"]:  # type: ignore[union-attr]
        for variant in data["variants"]:  # type: ignore[union-attr]
            for kind, scope in (("every", "name"), ("every", "file"), ("every", None), ("pointed", None)):
                rs = [r for r in recs if r["scorer"] == scorer and r["variant"] == variant and r["kind"] == kind
                      and (scope is None or r["scope"] == scope)]
                if not rs:
                    continue
                whole = sum(r["mode"] != "compressed" for r in rs)
                label = f"{kind} ({scope or 'all'})" if kind == "every" else kind
                body.append([scorer, variant, label, len(rs), common.pct(whole, len(rs)),
                             common.pct(sum(bool(r["every_match_kept"]) for r in rs), len(rs)),
                             common.pct(sum(bool(r["ok"]) for r in rs), len(rs))])
    out = [Table("Every-X requests served whole (or every match kept) vs pointed requests still compressed",
                 ["scorer", "variant", "requests", "n", "served whole", "every match kept",
                  "ok (every: whole or all matches; pointed: compressed)"], body)]
    miss = [[r["scorer"], r["variant"], r["kind"], r["wording"], r["mode"], r["kept_fraction"]]
            for r in recs if not r["ok"]]
    out.append(Table(f"Not ok ({len(miss)})", ["scorer", "variant", "kind", "wording", "mode", "kept"], miss))
    return out


def main(opts: argparse.Namespace) -> tuple[str, list[Path]]:
    data = asyncio.run(run(opts))
    data["command"] = common.command_of("every-x", opts, ["--variants", ",".join(opts.variants)])
    return report(data, Path(opts.out))


def report(data: JSONObject, out: Path) -> tuple[str, list[Path]]:
    """``every-x.md`` and ``every-x.json`` of a run (also ``--render``)."""
    notes = [f"command: `{data.get('command')}`",
             f"commit {data['commit']}, split `{data['split']}` (by wording), threshold {data['threshold']}, "
             f"{len(data['files'])} files of the split's code-task packages; run took {data['seconds']} s",  # type: ignore[arg-type]
             "paste = one user message (request and file, alternating order); read = Claude Code's flow (the "
             "request as its own turn, then the Read result); through the proxy's real routes, "
             + ("forwarded to llama-server (checked in the body it received)" if data.get("forward")
                else "stopped before the forward")]
    return common.write(out, "every-x", "Every-X requests vs pointed requests", data, tables(data), notes)
