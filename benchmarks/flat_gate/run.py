"""Calibrate the flat-relevance gate per scorer and prompt length: pointed questions must be compressed,
"list every X" served whole.

Usage: ``python benchmarks/flat_gate/run.py --out DIR [--scorers lexical,...] [--drafter GGUF] [--per 12]``

1. Cases (``gate_cases.py``): for each split (train, test), length (4K, 16K, 32K) and document kind (code, prose):
   ``--per`` pointed and ``--per`` aggregation cases; plus the agent_reads files as cold Claude Code reads
   (``agent_read``, by package: every package's files in one split).
   Plus the code-reads eval's functions (``bench/code_reads/generator.py``: third-party packages, split by
   package) as cold Claude Code reads (``--reads``: all, or a seeded sample per band).
2. Each case goes through the real pipeline with the gate off (``in_conversation=True``: a flat outcome is
   compressed anyway), so what the budget keeps is known; recorded per case: the unpinned units' scores (``s``),
   tokens (``t``) and which of them the budget keeps (``k_idx``), and, for a request that asks for every match,
   the gate's scores (``sc``: BM25 of its every-clause, ``pipeline.gate_scores``); every
   measure (``value``) is computed from these. Rows go to ``DIR/rows.jsonl`` as they are measured, case by
   case with every scorer in turn (one kit: the drafter rows after the first read the case warm).
3. Calibration on train only (``calibrate``): per scorer and length, the threshold on each measure with the
   best mean share served right (pointed and agent cases compressed, aggregation whole) among those that serve
   at least ``CONTROL`` of the aggregation cases whole (ties: the middle of the best interval).  Reported: the
   confusion on test at the registry's thresholds, and per measure at its train threshold and the seed's 0.11.
Writes ``DIR/flat_gate.json`` (every case's numbers) and ``DIR/flat_gate.md``; ``--render`` rewrites them from
earlier runs' rows (e.g. a drafter run and a lexical run together). ``--estimate attention,...`` (with
``--render``): those scorers' rows of every lexical case, computed from the lexical row (its gate scores and its
``k``) and marked as an estimate: the gate reads BM25 whatever the scorer, so only ``k`` is the scorer's, and a
drafter keeps a different number of units of the same budget (reported apart from the drafter's measured rows).
``--k-bounds`` (``k_bounds.py``): instead of an estimate, the decision for ANY scorer's ranking: per case (test
split unless ``--splits``) the range of ``k`` every ranking's budget keeps, from the units' sizes, the pinned tail
and the budget alone, and whether the gate's decision is the same over all of it; checked against adversarial
rankings run through the real selection (``--rankings`` random ones per case). Writes ``DIR/bounds-rows.jsonl``
and ``DIR/bounds.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "benchmarks" / "agent_reads"))

import gate_cases  # noqa: E402
from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText  # noqa: E402
from pflash_proxy.compress.spread import SpreadCurve, asks_for_every, kept_mass  # noqa: E402
from pflash_proxy.stages.scorers import default_spread  # noqa: E402

LENGTHS = (4096, 16384, 32768)
CONTROL = 0.9


def agent_cases(which: str) -> list[gate_cases.GateCase]:
    from cases import CASES, load  # benchmarks/agent_reads

    out = []
    for k, case in enumerate(CASES):
        pkg = case.module_file.split("/")[0]
        if gate_cases.split(pkg) != which:
            continue
        got = load(case)
        if got is None:
            continue
        text, (a, b) = got
        tool = "\n".join(f"{n}\t{line}" for n, line in enumerate(text.rstrip("\n").split("\n"), 1))  # Read
        msgs = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"Read {Path(case.module_file).name} and answer: {case.question}"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "Read", "arguments": json.dumps({"file_path": case.module_file})}}]},
                {"role": "tool", "tool_call_id": "c1", "content": tool}]
        gold = "\n".join(tool.split("\n")[a - 1:b])
        out.append(gate_cases.GateCase(f"agent-{k}-{case.function}-{which}", "agent_read", "agent",
                                       gate_cases.approx_tokens(tool), msgs, 3, gold))
    return out


def code_read_cases(which: str) -> list[gate_cases.GateCase]:
    """The code-reads eval's functions (``bench/code_reads/generator.py``: third-party packages, split by package,
    named / qualified / described questions) as cold Claude Code reads: the task, the ``Read`` call and its
    ``N<TAB>line`` result, no earlier turn."""
    from pflash_proxy.bench.code_reads.generator import generate, read_source, site_packages
    from pflash_proxy.bench.code_reads.run import gold_block, render

    site = site_packages()
    out = []
    for case in generate(site, split=which):
        text = read_source(site, case)
        tool = render(text, "claude", f"/work/{case.path}")
        msgs = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"Read {case.path} and answer: {case.question}"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "Read", "arguments": json.dumps({"file_path": f"/work/{case.path}"})}}]},
                {"role": "tool", "tool_call_id": "c1", "content": tool}]
        out.append(gate_cases.GateCase(f"read-{case.case_id}-{which}", "agent_read", f"read-{case.kind}",
                                       gate_cases.approx_tokens(tool), msgs, 3, gold_block(text, case.span, "claude")))
    return out


def parse_per(spec: str) -> dict[int, int]:
    """``12`` (every length) or ``4096:12,16384:4,32768:2``."""
    if ":" not in spec:
        return {n: int(spec) for n in LENGTHS}
    return {int(a): int(b) for a, b in (x.split(":") for x in spec.replace(",", " ").split())}


def sample(cases: list[gate_cases.GateCase], per: dict[int, int], seed: str) -> list[gate_cases.GateCase]:
    """Up to ``per[band]`` agent-read cases of each band (a seeded sample; all, in order, when they are fewer)."""
    out = []
    for b in LENGTHS:
        mine = [c for c in cases if band(c.target) == b]
        if per.get(b, 0) < len(mine):
            mine = random.Random(f"{seed}:{b}").sample(mine, per.get(b, 0))
        out += mine
    return out


def all_cases(per: dict[int, int], reads: dict[int, int] | None = None,
              splits: tuple[str, ...] = ("train", "test")) -> list[tuple[str, gate_cases.GateCase]]:
    """Per split: ``per[length]`` pointed and aggregation cases of each document kind; the agent_reads files and
    the code-reads functions (``reads[band]`` of each band, all when None). Ordered by length, shortest first, the
    splits and kinds interleaved, so a run stopped early holds whole lengths of both splits."""
    out = []
    for target in LENGTHS:
        for i in range(per.get(target, 0)):
            for which in splits:
                for docs in ("code", "prose"):
                    for kind in ("pointed", "aggregation"):
                        c = gate_cases.make_case(which, kind, docs, target, i)
                        if c is not None:
                            out.append((which, c))
    agents = []
    for which in splits:
        pool = agent_cases(which) + (code_read_cases(which) if reads is None or any(reads.values()) else [])
        agents += [(which, c) for c in (pool if reads is None else sample(pool, reads, f"reads:{which}"))]
    return out + sorted(agents, key=lambda wc: band(wc[1].target))


def measure(comp: Compressor, case: gate_cases.GateCase) -> dict:
    """Step 2: the gate's inputs for one case (the gate itself off)."""
    text = case.messages[case.long_index]["content"]
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find(case.messages, case.long_index, tt)
    source = "tool" if case.messages[case.long_index]["role"] == "tool" else "paste"
    t = time.perf_counter()
    # in_conversation=True: the only thing it changes is that a flat outcome is compressed anyway (the gate off)
    out = comp.compress(tt, request, tt.total_tokens + 64, True, source, str(case.long_index + 1))
    ms = (time.perf_counter() - t) * 1e3
    a = out.analysis
    if out.mode != "compressed" or a is None or out.recall is None:
        return {"mode": out.mode, "reason": out.reason}
    omitted = set(out.recall.omitted)
    kept = [i for i in range(len(a.units)) if i not in omitted]
    free = np.ones(len(a.units), bool)
    free[list(a.pinned)] = False
    s = np.asarray(a.scores, np.float64)
    k = len(set(kept) - a.pinned)
    fs = s[free]
    n = int(free.sum())
    tot = float(fs.sum())
    n_eff = tot * tot / float(fs @ fs) if tot > 0 else float(n)
    toks = np.array([u.tokens for u in a.units])
    sc = None if a.gate_scores is None else np.asarray(a.gate_scores, np.float64)[free]  # the gate's step 3
    keep = np.zeros(len(a.units), bool)
    keep[kept] = True
    return {"mode": out.mode, "units": len(a.units), "gated": asks_for_every(request.text), "zero": tot <= 0,
            "free": n, "kept_free": k, "n_eff": n_eff,
            "spread_seed": (n_eff - k) / n if n else 1.0, "kept_mass": kept_mass(s, keep, free),
            "kept_tokens_free": float(toks[keep & free].sum() / max(1, toks[free].sum())),
            "gold": bool(case.gold) and case.gold in out.text, "tokens": tt.total_tokens, "ms": round(ms, 1),
            # the unpinned units' scores and tokens and which of them the budget keeps: any measure of the gate
            # can be computed again from these (``measures.py``)
            "s": [float(f"{x:.6g}") for x in fs], "t": toks[free].tolist(),
            "k_idx": np.flatnonzero(keep[free]).tolist(),
            "sc": None if sc is None else [float(f"{x:.6g}") for x in sc]}


def band(t: int) -> int:
    return min(LENGTHS, key=lambda x: abs(np.log(x / max(t, 1))))


MEASURES = ("spread", "spread-request", "spread-n", "spread-all", "kept_mass")


def value(r: dict, measure_name: str) -> float:
    """A row's value of a measure.  ``spread``: the product's gate (``spread.flat_gate``: ``(N_eff - k) / k`` of
    the gate's scores ``sc``; -1 when the clause has no relevance at all, which the gate never calls flat); ``spread-request``: the previous gate, the seed's
    ``(N_eff - k) / n`` of the whole request's scores; ``spread-n``: the every-clause's scores with the seed's
    ``/ n`` (the clause alone); ``spread-all``: the seed's on every request; ``kept_mass``: the kept units'
    relevance share."""
    k, n = len(r["k_idx"]), max(1, len(r["s"]))
    if measure_name in ("spread", "spread-n"):
        sc = np.asarray(r["sc"] if r.get("sc") is not None else r["s"], np.float64)
        tot = float(sc.sum())
        if tot <= 0:
            return -1.0 if r.get("sc") is not None else 1.0
        n_eff = tot * tot / float(sc @ sc)
        return (n_eff - k) / (max(1, k) if measure_name == "spread" else n)
    return float(r["kept_mass"] if measure_name == "kept_mass" else r.get("spread_seed", r.get("spread")))


def decide(r: dict, measure_name: str, thr: float) -> bool:
    """Flat? (served whole).  ``spread``: the product's gate; ``spread-request``: the same on the whole request's
    scores (the gate before the every-clause); ``spread-all``: the spread threshold on every request (the seed's
    gate); ``kept_mass``: the kept units' relevance share below ``thr``, on requests that ask for every match."""
    if r["zero"]:
        return True
    v = value(r, measure_name)
    if measure_name == "spread-all":
        return v > thr
    if measure_name == "kept_mass":
        return r["gated"] and v < thr
    return r["gated"] and v > thr


def calibrate(rows: list[dict], measure_name: str) -> float:
    """Step 3: the threshold with the best mean of the shares served right (pointed and agent cases compressed,
    aggregation cases whole; each kind present) among those serving >= CONTROL of the aggregation cases whole;
    ties: the middle of the best thresholds."""
    vals = sorted({value(r, measure_name) for r in rows})
    cands = [-1.0, 0.0, 1.0] + [(a + b) / 2 for a, b in zip(vals, vals[1:])]
    best: float | None = None
    scored = []
    agg_rows = [r for r in rows if r["kind"] == "aggregation"]
    kinds = [[r for r in rows if r["kind"] == k] for k in ("pointed", "agent_read")]
    kinds = [k for k in kinds if k]
    for thr in sorted(set(cands)):
        agg = [decide(r, measure_name, thr) for r in agg_rows]
        agg_rate = sum(agg) / len(agg) if agg else 1.0
        rates = [sum(not decide(r, measure_name, thr) for r in k) / len(k) for k in kinds]
        val = (statistics.mean(rates + [agg_rate]) if agg_rate >= CONTROL else -1.0) if kinds else -1.0
        scored.append((thr, val))
        if best is None or val > best:
            best = val
    top = [t for t, v in scored if v == best]
    return float(statistics.median(top))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scorers", default="lexical")
    ap.add_argument("--per", default="12", help="cases per kind: N, or per length 4096:12,16384:4,32768:2")
    ap.add_argument("--reads", default="all", help="code-reads cases per band: all, N, or 4096:40,16384:20")
    ap.add_argument("--drafter", type=Path)
    ap.add_argument("--gate-scores-from", type=Path,
                    help="with --render: take each row's gate scores (sc) from this lexical run's row of the same "
                         "case when its unpinned units are the same (rows measured before the gate read BM25)")
    ap.add_argument("--resume", action="store_true", help="keep DIR/rows.jsonl's rows and measure only the rest")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--splits", help="measure these splits only (e.g. test; default train,test, with --k-bounds "
                                     "test)")
    ap.add_argument("--curves", default="",
                    help="the report's thresholds instead of the registry's: scorer=curve;scorer=curve (e.g. the "
                         "registry's before a change)")
    ap.add_argument("--estimate", default="",
                    help="with --render: these scorers' rows estimated from each lexical row (gate scores and k)")
    ap.add_argument("--render", type=Path, nargs="+",
                    help="write the report of earlier runs' flat_gate.json or rows.jsonl (or .gz) again, their rows "
                         "together")
    ap.add_argument("--k-bounds", action="store_true",
                    help="the decision for ANY scorer's ranking (k_bounds.py): per case the range of k every "
                         "ranking's budget keeps and whether the gate's decision depends on it; writes "
                         "DIR/bounds-rows.jsonl and DIR/bounds.md (with --render: bounds.md from those rows)")
    ap.add_argument("--rankings", type=int, default=4, help="with --k-bounds: random rankings run per case")
    args = ap.parse_args()
    if args.k_bounds:
        bounds_main(args)
        return
    if args.render:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = []
        for path in args.render:
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
            rows += [json.loads(x) for x in text.splitlines() if x.strip()] if ".jsonl" in path.name \
                else json.loads(text)
        if args.gate_scores_from:
            rows = with_gate_scores(rows, args.gate_scores_from)
        if args.estimate:
            rows = rows + estimated(rows, args.estimate.split(","))
        curves = dict(x.split("=", 1) for x in args.curves.split(";") if x.strip())
        (args.out / "flat_gate.json").write_text(json.dumps(rows))
        (args.out / "flat_gate.md").write_text(report(rows, curves))
        return
    lengths = tuple(int(x) for x in args.lengths.split(","))
    reads = None if args.reads == "all" else parse_per(args.reads)
    cases = [(w, c) for w, c in all_cases(parse_per(args.per), reads, tuple((args.splits or "train,test").split(",")))
             if c.kind == "agent_read" or c.target in lengths]
    names = args.scorers.split(",")
    comps = {name: Compressor(CompressionSettings(), scorer=s)
             for name, s in scorers_for(names, args.drafter).items()}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rows.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if args.resume and path.exists() else []
    done = {(r["case"], r["scorer"]) for r in rows}
    # case by case, every scorer in turn: the drafter rows after the first read the case's kept state warm
    with path.open("a" if args.resume else "w") as log:
        for which, c in cases:
            for name, comp in comps.items():
                if (c.case_id, name) in done:
                    continue
                t = time.perf_counter()
                r = measure(comp, c)
                r.update(scorer=name, split=which, case=c.case_id, kind=c.kind, docs=c.docs, band=band(c.target),
                         wall_s=round(time.perf_counter() - t, 2))
                rows.append(r)
                log.write(json.dumps(r) + "\n")
                log.flush()
                print(json.dumps({k: v for k, v in r.items() if k not in ("s", "t", "k_idx", "sc")}), flush=True)
    (args.out / "flat_gate.json").write_text(json.dumps(rows))
    (args.out / "flat_gate.md").write_text(report(rows))


def bounds_main(args: argparse.Namespace) -> None:
    """``--k-bounds``: every case of the splits (default: test only) through ``k_bounds.measure``."""
    import k_bounds

    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/flat_gate/run.py " + " ".join(sys.argv[1:])
    if args.render:
        rows = []
        for path in args.render:
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
            rows += [json.loads(x) for x in text.splitlines() if x.strip()]
        (args.out / "bounds.md").write_text(k_bounds.report(rows, command))
        return
    splits = tuple((args.splits or "test").split(","))
    lengths = tuple(int(x) for x in args.lengths.split(","))
    reads = None if args.reads == "all" else parse_per(args.reads)
    cases = [(w, c) for w, c in all_cases(parse_per(args.per), reads, splits)
             if c.kind == "agent_read" or c.target in lengths]
    rows = []
    t0 = time.perf_counter()
    with (args.out / "bounds-rows.jsonl").open("w") as log:
        for which, c in cases:
            r = k_bounds.measure(c, args.rankings)
            r.update(split=which, case=c.case_id, kind=c.kind, docs=c.docs, band=band(c.target))
            rows.append(r)
            log.write(json.dumps(r) + "\n")
            log.flush()
    print(f"{len(rows)} cases in {time.perf_counter() - t0:.0f} s", flush=True)
    (args.out / "bounds.md").write_text(k_bounds.report(rows, command))


def with_gate_scores(rows: list[dict], lexical_rows: Path) -> list[dict]:
    """The gate's scores are BM25's of the every-clause whatever the scorer (``pipeline.gate_scores``): a row
    measured when the gate asked the serving scorer gets ``sc`` from the lexical row of its case, when the two
    rows' unpinned units hold the same tokens (the heuristic segmenter cuts alike for every scorer); else it is
    left out."""
    text = gzip.decompress(lexical_rows.read_bytes()).decode() if lexical_rows.suffix == ".gz" \
        else lexical_rows.read_text()
    lex = {r["case"]: r for r in map(json.loads, filter(str.strip, text.splitlines())) if r["scorer"] == "lexical"}
    out = []
    for r in rows:
        other = lex.get(r["case"])
        if r["scorer"] == "lexical" or r["mode"] != "compressed":
            out.append(r)
        elif other is not None and other.get("t") == r["t"]:
            out.append({**r, "sc": other.get("sc")})
    return out


def estimated(rows: list[dict], names: list[str]) -> list[dict]:
    """``--estimate``: a row of each named scorer for every lexical row, its gate scores and kept units the
    lexical row's (``estimate: "lexical"``)."""
    return [{**r, "scorer": name, "estimate": "lexical"} for name in names for r in rows
            if r["scorer"] == "lexical" and name != "lexical"]


def scorers_for(names: list[str], drafter: Path | None) -> dict[str, object]:
    """The registry's scorers, the drafter ones from one drafter and one kit (as ``bench quality`` builds them:
    the attention rows share the content's keys and kept state)."""
    from argparse import Namespace

    if names == ["lexical"]:  # model-free: nothing of the bench's drafter machinery needed
        from pflash_proxy.compress import LexicalScorer

        return {"lexical": LexicalScorer()}
    from pflash_proxy.bench.quality import build_scorers

    built = build_scorers(names, Namespace(drafter=drafter, lengths=list(LENGTHS)))
    bad = {k: v for k, v in built.items() if isinstance(v, str)}
    if bad:
        raise SystemExit(f"scorers unavailable: {bad}")
    if "auto" in built and "head-attention" in built:
        # what the registry's ``auto`` builds, around the head-attention row's own scorer: a prose case's
        # head taps, kept by that scorer, are read again warm instead of in a second pass
        from pflash_proxy.compress import LexicalScorer
        from pflash_proxy.compress.routed import RoutedScorer

        built["auto"] = RoutedScorer(LexicalScorer(), built["head-attention"])  # type: ignore[arg-type]
    return built


def report(rows: list[dict], curves: dict[str, str] | None = None) -> str:
    """The markdown report; ``curves``: thresholds by scorer name instead of the registry's."""
    ok = [r for r in rows if r["mode"] == "compressed"]
    lost = [r for r in rows if r["mode"] != "compressed"]
    out = ["# Flat gate calibration", "", "## Confusion at the shipped thresholds (test split)", "",
           "Per kind, served compressed / served whole (of the cases the pipeline could compress at all). "
           "`pointed`: compressed, (gold: the pointed evidence whole in the compressed text), [of them, the "
           "questions whose words make the gate apply (`asks_for_every`)]; `agent reads`: compressed (gold); "
           "`aggregation`: served whole. Thresholds: each scorer's registry curve (`stages/scorers.py`)"
           f"{'' if not curves else ', except ' + ', '.join(f'{k} {v}' for k, v in curves.items())}. Rows: "
           "`measured` (the scorer's own pipeline run), or `estimate` (`--estimate`: the lexical row of the case, "
           "its gate scores and the units its budget keeps, under this scorer's curve; no pass of this scorer).",
           "", "| scorer | rows | thresholds | length | pointed compressed (gold) [gated] | pointed whole | "
           "agent reads compressed (gold) | agent reads whole | aggregation whole | aggregation compressed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for scorer, est in sorted({(r["scorer"], r.get("estimate", "")) for r in ok}):
        curve = SpreadCurve.parse((curves or {}).get(scorer) or default_spread(scorer))
        for b in LENGTHS:
            test = [r for r in ok if r["scorer"] == scorer and r.get("estimate", "") == est and r["band"] == b
                    and r["split"] == "test"]
            if not test:
                continue

            def flat(r: dict, curve: SpreadCurve = curve) -> bool:
                return decide(r, "spread", curve.at(r["tokens"]))
            pts = [r for r in test if r["kind"] == "pointed"]
            rd = [r for r in test if r["kind"] == "agent_read"]
            agg = [r for r in test if r["kind"] == "aggregation"]

            def comp(rs: list[dict], gated: bool = False) -> str:
                if not rs:
                    return "-"
                c = [r for r in rs if not flat(r)]
                g = [r for r in rs if r["gated"]]
                extra = f" [{sum(not flat(r) for r in g)}/{len(g)}]" if gated else ""
                return f"{len(c)}/{len(rs)} ({sum(r['gold'] for r in c)}){extra}"

            def whole(rs: list[dict]) -> str:
                return f"{sum(flat(r) for r in rs)}/{len(rs)}" if rs else "-"

            def compressed(rs: list[dict]) -> str:
                return f"{sum(not flat(r) for r in rs)}/{len(rs)}" if rs else "-"
            out.append(f"| {scorer} | {'estimate' if est else 'measured'} | {curve} | {b // 1024}K | "
                       f"{comp(pts, True)} | {whole(pts)} | {comp(rd)} | "
                       f"{whole(rd)} | {whole(agg)} | {compressed(agg)} |")
    if lost:
        out += ["", f"Not compressible at all (left out above): {len(lost)} rows, e.g. "
                f"{lost[0]['scorer']} {lost[0]['case']}: {lost[0].get('reason')}"]
    out += ["", "## Calibration: thresholds chosen on train, applied to test", "",
            "`spread`: the product's gate (the spread of the every-clause's scores, on requests that ask for every "
            "match, per kept unit); `spread-request`: the gate before (the seed's `(N_eff - k) / n` of the whole "
            "request's scores, on requests that ask for every match); "
            "`spread-all`: the seed's spread on every request (the seed's gate); `kept_mass`: flat when the kept "
            "unpinned units hold less than that share of the unpinned relevance; `spread-n`: the every-clause's scores "
            "with the seed's `/ n`. Threshold (`calibrate`): on train, the best mean share served right (pointed "
            "and agent reads compressed, aggregation whole) among the thresholds serving >= "
            f"{CONTROL:.0%} of its aggregation cases whole.", ""]
    ok = [r for r in ok if not r.get("estimate")]  # an estimate's calibration is the lexical rows' own
    for scorer in sorted({r["scorer"] for r in ok}):
        out += [f"### {scorer}", "", "| length | cases train / test | measure | threshold (train) | "
                "pointed compressed (test) | agent reads compressed (test) | aggregation whole (test) | "
                "seed 0.11 spread: pointed / agent / aggregation |", "|---|---|---|---|---|---|---|---|"]
        for b in LENGTHS:
            mine = [r for r in ok if r["scorer"] == scorer and (r["band"] == b)]
            train = [r for r in mine if r["split"] == "train"]
            test = [r for r in mine if r["split"] == "test"]
            if not train or not test:
                continue
            for m in MEASURES:
                thr = calibrate(train, m)
                out.append(f"| {b // 1024}K | {len(train)} / {len(test)} | {m} | {thr:.3f} | "
                           f"{_frac(test, 'pointed', m, thr)} | "
                           f"{_frac(test, 'agent_read', m, thr)} | {_frac(test, 'aggregation', m, thr, whole=True)} "
                           f"| {_frac(test, 'pointed', 'spread-all', 0.11)} / "
                           f"{_frac(test, 'agent_read', 'spread-all', 0.11)} / "
                           f"{_frac(test, 'aggregation', 'spread-all', 0.11, whole=True)} |")
        out.append("")
    return "\n".join(out)


def _frac(rows: list[dict], kind: str, m: str, thr: float, whole: bool = False) -> str:
    rs = [r for r in rows if r["kind"] == kind]
    if not rs:
        return "-"
    n = sum(decide(r, m, thr) == whole for r in rs)
    return f"{n}/{len(rs)}"


if __name__ == "__main__":
    main()
