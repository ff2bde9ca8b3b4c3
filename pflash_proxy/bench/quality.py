"""``bench quality``: how much of the gold evidence reaches the upstream, PFlash vs baselines at the same budget.

1. Cases: ``generate``'s (default every family at 16K and 32K; ``--quick``: 2K and 4K, a subset of families,
   threshold 1024), each sized to its length in llama-server's own tokens (``sizing.sized_cases``; not capped
   at a slot: nothing is forwarded, and the proxy admits prompts up to ``--max-prompt-tokens``).
2. One llama-server (spawned like ``--spawn``, or ``--upstream``) gives the exact token counts PFlash uses
   (``Engine.count_prompt`` / ``pieces``).  One proxy per available scorer, in dry-run mode: each case goes through
   the real chat route (sessions → PFlash → commit) and is stopped just before the forward; the recorder keeps
   the messages the upstream would receive.  No prefill and no generation (the TTFT bench forwards for real).
3. Budget: the estimated size of the long message PFlash served (the first scorer's row, ``lexical``); head+tail
   truncation and random whole units shorten the same message to that budget; full prefill keeps everything.
4. Retention per row and turn with ``check_retention``: gold whole (bool), kept fraction, mode.
5. Multi-turn: the follow-ups go through the same proxy session (placeholder assistant replies); the served
   follow-up turn, with any recall excerpts, must carry its gold.  The baselines have no recall.
6. Summary tables per row × length for the main families, the aggregation negative control and the follow-ups.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, Unpack

import aiohttp

from pflash_proxy.bench.cases import (Case, check_retention, default_count_tokens, head_tail_truncate,
                                      messages_text, random_units, shorten_longest)
from pflash_proxy.bench import analyses
from pflash_proxy.bench.defaults import DRAFTER_TIMEOUT_S
from pflash_proxy.bench.report import Chart, Table, Written, mean, median, pct, write_report
from pflash_proxy.bench.runner import BenchError, LlamaProc, Proxy, bench_settings, chat, new_id
from pflash_proxy.bench.sizing import sized_cases, tokenize_counter
from pflash_proxy.headers import KEPT_TOKENS_HEADER, MODE_HEADER, PROMPT_TOKENS_HEADER
from pflash_proxy.progress import Progress
from pflash_proxy.jsontypes import ChatMessage, JSONValue

if TYPE_CHECKING:
    from pflash_proxy.compress.scores import Scorer
    from pflash_proxy.stages.scorers import ScorerKit

QUICK_FAMILIES = ("ruler_single", "ruler_multikey", "vartrack", "nolima", "code", "agent", "multiturn",
                  "aggregation")
BASELINES = ("full prefill", "head+tail", "random units")


class RecordExtra(TypedDict, total=False):
    """What a row adds to a record: the proxy's headers and log (PFlash rows), the budget (baselines)."""

    prompt_tokens: int | None
    kept_tokens: int | None
    pflash_ms: JSONValue
    served: list[ChatMessage] | None  # the first turn's served messages, dropped before the run is written
    budget: int | None


class Record(RecordExtra):
    """One row × case × turn: what reached the upstream of the case's gold."""

    row: str
    case_id: str
    family: str
    length: int
    turn: int
    negative_control: bool
    all_gold: bool
    gold_whole: int
    gold_total: int
    kept_fraction: float
    mode: str
    missing: list[int]  # indexes of the gold items that did not arrive whole


class QualityRun(TypedDict):
    """``run``'s result, the report's input (``quality.json``; ``merge_runs`` joins several)."""

    bench: str
    quick: bool
    lengths: list[int]
    threshold: int
    seed: int
    families: list[str]
    rows: list[str]
    case_tokens: dict[str, JSONValue]
    unavailable: dict[str, str]
    seconds: float
    records: list[Record]
    merged_from: NotRequired[list[str]]


# bench rows that are a registry scorer read with other ``--attention-heads``: row -> (scorer, heads)
ROW_VARIANTS: dict[str, tuple[str, str]] = {"attention-all": ("attention", "all")}


def build_scorers(names: list[str], opts: argparse.Namespace) -> dict[str, Scorer | str]:
    """row name → the Scorer ``--scorer NAME`` serves, or a string saying why it is unavailable.

    Every row is a registry entry (``stages.scorers.SCORERS``), built by its own ``build`` from the parts its
    ``needs`` name (``ScorerKit``), so the bench measures exactly what the proxy serves (reference hops
    included). ``ROW_VARIANTS`` adds rows that are a registry scorer with other ``--attention-heads``
    (``attention-all``: every head of the global layers). The drafter rows share one drafter and one kit: the
    attention rows share the content's keys and drafter state, so a row after ``head-attention`` reads only its
    question. The probe files are ``--scoring-head``/``--request-probe``, or the set shipped for the drafter."""
    from pflash_proxy.stages.scorers import SCORERS, ScorerParts

    out: dict[str, Scorer | str] = {}
    rows: dict[str, tuple[str, str | None]] = {name: ROW_VARIANTS.get(name, (name, None)) for name in names}
    kit: ScorerKit | None = None
    for name, (scorer, heads) in rows.items():
        entry = SCORERS.get(scorer)
        if entry is None:
            out[name] = f"unknown scorer {name!r}"
            continue
        if not entry.needs.drafter:
            out[name] = entry.build(ScorerParts())
            continue
        if not getattr(opts, "drafter", None):
            out[name] = "unavailable: no drafter configured (--drafter GGUF)"
            continue
        try:
            kit = kit or _kit(opts, any(SCORERS[s].needs.scoring_head for s, _ in rows.values() if s in SCORERS))
            out[name] = kit.scorer(scorer, heads)
        except Exception as exc:  # noqa: BLE001 - a scorer that cannot load is reported, not fatal
            out[name] = f"unavailable: {type(exc).__name__}: {exc}"
    return out


def _kit(opts: argparse.Namespace, heads: bool) -> ScorerKit:
    """The drafter rows' one kit: the drafter sized for the longest case, the proxy's --attention-heads auto."""
    from pflash_proxy.config import state_home
    from pflash_proxy.drafter.runtime import Drafter
    from pflash_proxy.stages.scorers import ProbeFiles, ScorerKit

    home = state_home()
    files = ProbeFiles(None, _path(getattr(opts, "scoring_head", None)), _path(getattr(opts, "request_probe", None)))
    files = files.with_packaged(Path(opts.drafter), home / "drafter-hashes.json", heads, False)
    # cache_mb: a 32K message's drafter state (~0.6 GB for gemma-3-270m) must stay, so the other attention rows
    # of the same case read only their question
    drafter = Drafter(str(opts.drafter), n_ctx=max(opts.lengths) + 1024, cache_mb=4096,
                      timeout=getattr(opts, "drafter_timeout", DRAFTER_TIMEOUT_S))
    return ScorerKit(drafter, home, files)


def _path(value: str | Path | None) -> Path | None:
    return None if value in (None, "") else Path(value)


def _longest_index(messages: Sequence[ChatMessage]) -> int:
    best, longest = -1, ""
    for i, m in enumerate(messages):
        if isinstance(content := m.get("content"), str) and (best < 0 or len(content) >= len(longest)):
            best, longest = i, content
    return best


def _record(row: str, case: Case, turn: int, received: Sequence[ChatMessage], mode: str,
            **extra: Unpack[RecordExtra]) -> Record:
    r = check_retention(case, received, turn=turn)
    return {"row": row, "case_id": case.case_id, "family": case.family, "length": case.target_tokens,
            "turn": turn, "negative_control": case.negative_control, "all_gold": r.all_gold,
            "gold_whole": r.gold_whole, "gold_total": r.gold_total, "kept_fraction": round(r.kept_fraction, 4),
            "mode": mode, "missing": list(r.missing), **extra}


async def _through_proxy(http: aiohttp.ClientSession, proxy: Proxy, row: str, case: Case) -> list[Record]:
    out = []
    for turn in range(len(case.followups) + 1):
        key = new_id()
        # one named session per case: two cases that share a prefix (agent 2K and 4K) must not continue one
        # conversation, or the second is compressed "in conversation" and never judged flat
        res = await chat(http, proxy.url, case.turn_messages(turn), stream=False, max_tokens=1, bench_id=key,
                         conversation=f"bench-{case.case_id}")
        seen = proxy.seen(key)
        h = res.headers
        out.append(_record(row, case, turn, seen.messages, h.get(MODE_HEADER, "?"),
                           prompt_tokens=_int(h.get(PROMPT_TOKENS_HEADER)),
                           kept_tokens=_int(h.get(KEPT_TOKENS_HEADER)),
                           pflash_ms=seen.fields.get("pflash_ms"), served=seen.messages if turn == 0 else None))
    return out


def _int(v: str | None) -> int | None:
    return int(v) if v is not None else None


def _baselines(case: Case, served: Sequence[ChatMessage], seed: int) -> list[Record]:
    idx = _longest_index(case.messages)
    budget = default_count_tokens(messages_text([served[idx]])) if idx >= 0 and idx < len(served) else None
    full_size = default_count_tokens(messages_text([case.messages[idx]])) if idx >= 0 else 0
    out = []
    for turn in range(len(case.followups) + 1):
        msgs = case.turn_messages(turn)
        out.append(_record("full prefill", case, turn, msgs, "full"))
        shortened = budget is not None and budget < full_size
        mode = "truncated" if shortened else "full"
        cut = budget if budget is not None else 0  # used only when shortened (budget given)
        ht = shorten_longest(msgs, lambda t: head_tail_truncate(t, cut)) if shortened else msgs
        ru = shorten_longest(msgs, lambda t: random_units(t, cut, seed)) if shortened else msgs
        out += [_record("head+tail", case, turn, ht, mode, budget=budget),
                _record("random units", case, turn, ru, mode, budget=budget)]
    return out


async def run(opts: argparse.Namespace) -> QualityRun:
    families = opts.families or (QUICK_FAMILIES if opts.quick else None)
    scorers = build_scorers(opts.scorers, opts)
    usable = {k: v for k, v in scorers.items() if not isinstance(v, str)}
    work = Path(opts.workdir)
    dump = Path(opts.dump_analyses) if getattr(opts, "dump_analyses", None) else None
    analysed: list[analyses.Analysed] = []
    current: dict[str, str] = {}
    llama = LlamaProc(work / "llama", opts.upstream, opts.model, ctx_per_slot=max(opts.lengths) + 4096)
    t0 = time.perf_counter()
    await llama.start()
    records: list[Record] = []
    try:
        # A request waits for the drafter's pass: give the client more than the drafter's own timeout.
        read_s = getattr(opts, "drafter_timeout", DRAFTER_TIMEOUT_S) + 600
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=read_s)) as http:
            # No cap: nothing is forwarded, and the proxy admits prompts longer than a slot (up to
            # --max-prompt-tokens) because PFlash may shorten them to fit; 64K/128K work with gemma too.
            cases = await sized_cases(tokenize_counter(http, llama.url), families, opts.lengths, opts.per_family,
                                      opts.seed)
            proxies = {}
            for name, scorer in usable.items():
                settings = bench_settings(llama.url, work / f"proxy-{name}", llama.slot_dir,
                                          threshold=opts.threshold)
                proxies[name] = await Proxy(settings, scorer=scorer, dry_run=True).__aenter__()
                if dump is not None:
                    stage = proxies[name].compress
                    if stage is None:  # bench_settings turns compression on
                        raise BenchError("--dump-analyses: the proxy runs without compression")
                    analyses.record(stage, f"pflash-{name}", analysed, current)
            bar = Progress(len(cases) * max(len(proxies), 1), "quality")  # one step per case and scorer
            bar(0)
            try:
                for case in cases:
                    current["case"] = case.case_id
                    primary = None
                    for name, proxy in proxies.items():
                        recs = await _through_proxy(http, proxy, f"pflash-{name}", case)
                        primary = primary or recs[0]["served"]
                        records += recs
                        bar.advance(f"{case.case_id} {name}")
                    records += _baselines(case, primary or case.messages, opts.seed)
                    if not proxies:
                        bar.advance(case.case_id)
                    if opts.verbose:
                        bar.write(f"  {case.case_id}: done ({time.perf_counter() - t0:.0f}s)")
            finally:
                bar.close()
                for proxy in proxies.values():
                    await proxy.__aexit__(None, None, None)
    finally:
        await llama.stop()
    if dump is not None:
        analyses.save(dump, analysed, cases)
    for r in records:
        r.pop("served", None)
    rows = list(BASELINES) + [f"pflash-{n}" for n in scorers]
    unavailable = {f"pflash-{k}": v for k, v in scorers.items() if isinstance(v, str)}
    return {"bench": "quality", "quick": opts.quick, "lengths": list(opts.lengths), "threshold": opts.threshold,
            "seed": opts.seed, "families": sorted({c.family for c in cases}), "rows": rows,
            "case_tokens": {c.case_id: c.meta["real_tokens"] for c in cases},
            "unavailable": unavailable, "seconds": round(time.perf_counter() - t0, 1), "records": records}


def tables(data: QualityRun) -> tuple[list[Table], Chart]:
    lengths, rows, recs = data["lengths"], data["rows"], data["records"]
    # "served flat": cases the flat-relevance fallback served whole; their gold is kept by not compressing
    heads = ["row"] + [h for n in lengths for h in (f"{n // 1024}K gold whole", f"{n // 1024}K served flat",
                                                      f"{n // 1024}K kept", f"{n // 1024}K median kept")]
    groups: list[tuple[str, Callable[[Record], bool]]] = [("Gold evidence reaching the upstream whole (main families, first turn)",
               lambda r: r["turn"] == 0 and not r["negative_control"]),
              ("Negative control: aggregation (count/list every X), first turn",
               lambda r: r["turn"] == 0 and r["negative_control"]),
              ("Multi-turn follow-ups (gold of each later question; PFlash rows include recall)",
               lambda r: r["turn"] > 0)]
    out: list[Table] = []
    chart_series: dict[str, list[float | None]] = {}
    for title, pick in groups:
        body: list[Sequence[object]] = []
        for row in rows:
            if row in data["unavailable"]:
                body.append([row, data["unavailable"][row]] + ["–"] * (4 * len(lengths) - 1))
                continue
            cells: list[object] = [row]
            for n in lengths:
                sel = [r for r in recs if r["row"] == row and r["length"] == n and pick(r)]
                kept = [r["kept_fraction"] for r in sel]
                flat = sum(r["mode"] == "full-flat" for r in sel) if row.startswith("pflash-") and sel else "–"
                cells += [pct(sum(r["all_gold"] for r in sel), len(sel)), flat, mean(kept),
                          median(kept)]
                if title.startswith("Gold") and sel:
                    chart_series.setdefault(row, []).append(100 * sum(r["all_gold"] for r in sel) / len(sel))
            body.append(cells)
        out.append(Table(title, heads, body))
    pflash_rows = [r for r in rows if r.startswith("pflash-") and r not in data["unavailable"]]
    out.append(_by_family(data, pflash_rows))
    per_case = []
    for r0 in [r for r in recs if r["row"] == "full prefill"]:
        def get(row: str) -> Record | None:
            return next((r for r in recs if r["row"] == row and r["case_id"] == r0["case_id"]
                         and r["turn"] == r0["turn"]), None)
        line: list[object] = [r0["case_id"], r0["turn"]]
        for row in pflash_rows:
            p = get(row)
            line += [p["mode"], p.get("prompt_tokens"), p.get("kept_tokens"), _gold(p)] if p else ["–"] * 4
        line += [_gold(get("head+tail")), _gold(get("random units"))]
        per_case.append(line)
    ph = [h for row in pflash_rows for h in (f"{row} mode", "prompt tok", "kept tok", f"{row} gold")]
    out.append(Table("Per case (gold = whole/total; tokens from the upstream's tokenizer; on recall turns: recalled "
                     "tokens)",
                     ["case", "turn", *ph, "head+tail gold", "random gold"], per_case))
    chart = Chart("Gold evidence kept whole (main families)", "% of cases",
                  [f"{n // 1024}K" for n in lengths], chart_series)
    return out, chart


def _by_family(data: QualityRun, pflash_rows: list[str]) -> Table:
    """Main families, first turn: gold whole / cases per row, family and length. A PFlash cell also says how
    many of those cases the flat-relevance fallback served whole (``full-flat``): gold kept that way is kept by
    not compressing, which a reader must be able to tell from gold the ranking found."""
    recs = [r for r in data["records"] if r["turn"] == 0 and not r["negative_control"]]
    families = sorted({r["family"] for r in recs})
    heads = ["family", "length", "cases", *pflash_rows, "head+tail", "random units"]
    body = []
    for fam in families:
        for n in data["lengths"]:
            sel = [r for r in recs if r["family"] == fam and r["length"] == n]
            cases = len({r["case_id"] for r in sel})
            if not cases:
                continue
            cells: list[object] = [fam, f"{n // 1024}K", cases]
            for row in [*pflash_rows, "head+tail", "random units"]:
                mine = [r for r in sel if r["row"] == row]
                flat = sum(r["mode"] == "full-flat" for r in mine)
                cell = f"{sum(r['all_gold'] for r in mine)}/{len(mine)}" if mine else "–"
                cells.append(cell + (f" ({flat} flat)" if flat else ""))
            body.append(cells)
    return Table("Main families, first turn: gold whole / cases (\"flat\": served whole by the flat-relevance "
                 "fallback)", heads, body)


def _gold(r: Record | None) -> str:
    return f"{r['gold_whole']}/{r['gold_total']}" if r else "–"


_SAME_IN_EVERY_RUN = ("lengths", "threshold", "seed", "rows", "quick")


def merge_runs(runs: list[tuple[str, QualityRun]]) -> QualityRun:
    """One quality run from several (``bench quality --render A.json B.json``): a long run split by ``--families``
    so that each part leaves its report. Their cases must be disjoint and the runs comparable (same lengths,
    threshold, seed, rows); ``seconds`` is their sum. ValueError says what differs."""
    first_path, merged = runs[0]
    merged = {**merged, "records": list(merged["records"]), "case_tokens": dict(merged.get("case_tokens", {})),
              "unavailable": dict(merged.get("unavailable", {})), "families": list(merged["families"])}
    owner = {r["case_id"]: first_path for r in merged["records"]}
    for path, data in runs[1:]:
        for key in _SAME_IN_EVERY_RUN:
            if data.get(key) != merged.get(key):
                raise ValueError(f"cannot merge {path} with {first_path}: {key} {data.get(key)!r} != "
                                 f"{merged.get(key)!r}")
        for case in sorted({r["case_id"] for r in data["records"]}):
            if case in owner:
                raise ValueError(f"cannot merge: case {case} is in both {owner[case]} and {path}")
            owner[case] = path
        merged["records"] += data["records"]
        merged["case_tokens"].update(data.get("case_tokens", {}))
        merged["unavailable"].update(data.get("unavailable", {}))
        merged["families"] = sorted(set(merged["families"]) | set(data["families"]))
        merged["seconds"] = round(merged["seconds"] + data["seconds"], 1)
    merged["merged_from"] = [p for p, _ in runs]
    return merged


def report(data: QualityRun, out_dir: Path, opts: argparse.Namespace | None = None) -> Written:
    t, chart = tables(data)
    notes = [f"lengths {', '.join(str(n) for n in data['lengths'])} tokens, in llama-server's own tokens (its tokenizer, "
             f"within 3%; not capped at a slot, as nothing is forwarded), seed "
             f"{data['seed']}, threshold {data['threshold']}, families: {', '.join(data['families'])}",
             "measured through the proxy's real chat route (sessions → PFlash → commit), stopped just before the "
             "forward: no prefill, no generation (retention needs neither; see `bench ttft` for real forwarding)",
             "baselines shorten the same long message to the budget PFlash used (its served size); kept = "
             "received / original tokens (same estimator for every row)",
             f"run took {data['seconds']} s"]
    if data.get("merged_from"):
        notes[-1] = (f"merged from {len(data['merged_from'])} runs of the same seed, threshold and rows "
                     f"({', '.join(data['merged_from'])}); they took {data['seconds']} s together")
    return write_report(out_dir, "quality", "PFlash quality: gold evidence retention", data, t, notes, chart)
