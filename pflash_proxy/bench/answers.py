"""``bench answers``: does the model still answer right when PFlash shortened the prompt?

1. Cases from ``generate`` (``--quick``: two short-answer families at 4K); multi-turn cases ask their first
   question only.
2. Two in-process proxies on one upstream (spawned gemma-3-270m, or ``--upstream`` for a capable model): PFlash
   on and PFlash off.  Each case goes to both, non-streaming, temperature 0, ``--max-tokens`` tokens; every
   request is salted at the start so neither arm reuses the other's prefix cache.
3. Grading is exact match: every expected answer string (the magic number, the name, each variable, each
   record ID) must occur in the reply as a whole word, case-insensitively.
4. The report gives answered-right per length for full vs PFlash and lists every case where they differ.
   With gemma-3-270m accuracy is near zero for both arms: that is the model, and the report says so.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Literal, TypedDict

from pflash_proxy.bench.cases import Case
from pflash_proxy.bench.arms import two_arms
from pflash_proxy.bench.report import Table, Written, pct, write_report
from pflash_proxy.bench.runner import Proxy, chat, new_id, salted
from pflash_proxy.bench.sizing import sized_cases
from pflash_proxy.headers import MODE_HEADER
from pflash_proxy.progress import Progress
from pflash_proxy.jsontypes import JSONValue


class ArmAnswer(TypedDict):
    """What one arm answered for a case."""

    reply: str
    right: bool
    mode: str
    status: int
    prompt_tokens: int | None


class _Case(TypedDict):
    case_id: str
    family: str
    length: int
    case_tokens: JSONValue
    expected: list[str]
    negative_control: bool


class AnswerRow(_Case, total=False):
    """One case, both arms (``full``, ``pflash``: set once each arm has answered)."""

    full: ArmAnswer
    pflash: ArmAnswer


class AnswersRun(TypedDict):
    """``run``'s result, the report's input (``answers.json``)."""

    bench: str
    quick: bool
    lengths: list[int]
    threshold: int
    scorer: str
    upstream: str
    max_tokens: int
    seconds: float
    results: list[AnswerRow]

QUICK_FAMILIES = ("ruler_single", "multiturn")


def expected(case: Case) -> list[str]:
    return [case.answer] if isinstance(case.answer, str) else list(case.answer)


def correct(reply: str, answers: list[str]) -> bool:
    text = " ".join(reply.lower().split())
    return bool(answers) and all(re.search(r"(?<![\w-])" + re.escape(" ".join(a.lower().split())) + r"(?![\w-])",
                                           text) for a in answers)


async def run(opts: argparse.Namespace) -> AnswersRun:
    families = opts.families or (QUICK_FAMILIES if opts.quick else None)
    t0 = time.perf_counter()
    results: list[AnswerRow] = []
    async with two_arms(opts, ctx_factor=1.0) as a:
        scorer_name = a.scorer_name
        cases = await sized_cases(a.count, families, opts.lengths, opts.per_family, opts.seed, a.cap)
        bar = Progress(2 * len(cases), "answers")  # one step per case and arm
        bar(0)
        for case in cases:
            row: AnswerRow = {"case_id": case.case_id, "family": case.family, "length": case.target_tokens,
                              "case_tokens": case.meta["real_tokens"],
                              "expected": expected(case), "negative_control": case.negative_control}
            arms: tuple[tuple[Literal["full", "pflash"], Proxy], ...] = (("full", a.full), ("pflash", a.pflash))
            for arm, proxy in arms:
                res = await chat(a.http, proxy.url, salted(case.messages, new_id()), stream=False,
                                 max_tokens=opts.max_tokens)
                row[arm] = {"reply": res.text, "right": correct(res.text, row["expected"]),
                            "mode": res.headers.get(MODE_HEADER, "off"), "status": res.status,
                            "prompt_tokens": res.prompt_n}
                bar.advance(f"{case.case_id} {arm}")
            results.append(row)
            if opts.verbose:
                bar.write(f"  {case.case_id}: full {row['full']['right']} pflash {row['pflash']['right']}")
        bar.close()
    return {"bench": "answers", "quick": opts.quick, "lengths": list(opts.lengths), "threshold": opts.threshold,
            "scorer": scorer_name, "upstream": opts.upstream or "spawned gemma-3-270m (CPU)",
            "max_tokens": opts.max_tokens, "seconds": round(time.perf_counter() - t0, 1), "results": results}


def tables(data: AnswersRun) -> list[Table]:
    res = data["results"]
    summary = []
    for n in data["lengths"]:
        for label, neg in (("main", False), ("negative control", True)):
            sel = [r for r in res if r["length"] == n and r["negative_control"] == neg]
            if not sel:
                continue
            summary.append([f"{n // 1024}K", label, len(sel), pct(sum(r["full"]["right"] for r in sel), len(sel)),
                            pct(sum(r["pflash"]["right"] for r in sel), len(sel)),
                            sum(r["full"]["right"] != r["pflash"]["right"] for r in sel)])
    differ = [[r["case_id"], r["pflash"]["mode"], ", ".join(r["expected"])[:60], r["full"]["right"],
               r["full"]["reply"][:80], r["pflash"]["right"], r["pflash"]["reply"][:80]]
              for r in res if r["full"]["right"] != r["pflash"]["right"]]
    every = [[r["case_id"], r["pflash"]["mode"], r["full"]["prompt_tokens"], r["pflash"]["prompt_tokens"],
              r["full"]["right"], r["pflash"]["right"]] for r in res]
    return [Table("Answered right (exact match), full prefill vs PFlash",
                  ["length", "cases", "n", "full", "pflash", "differ"], summary),
            Table("Cases where the two arms differ",
                  ["case", "pflash mode", "expected", "full right", "full reply", "pflash right", "pflash reply"],
                  differ or [["(none)", "", "", "", "", "", ""]]),
            Table("Every case", ["case", "pflash mode", "full prompt tok", "pflash prompt tok", "full right",
                                 "pflash right"], every)]


def report(data: AnswersRun, out_dir: Path, opts: argparse.Namespace | None = None) -> Written:
    notes = [f"upstream: {data['upstream']}; scorer {data['scorer']}; threshold {data['threshold']}; "
             f"max_tokens {data['max_tokens']}, temperature 0; run took {data['seconds']} s",
             "exact match: every expected string must occur in the reply as a whole word (case-insensitive)",
             "gemma-3-270m answers almost none of these even with the full prompt; run with --upstream pointing "
             "at a capable model to compare full vs PFlash answers meaningfully"]
    return write_report(out_dir, "answers", "PFlash answers: full prefill vs PFlash", data, tables(data), notes)
