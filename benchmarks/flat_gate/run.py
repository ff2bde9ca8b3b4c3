"""Calibrate the flat-relevance gate per scorer and prompt length: pointed questions must be compressed,
"list every X" served whole.

Usage: ``python benchmarks/flat_gate/run.py --out DIR [--scorers lexical,...] [--drafter GGUF] [--per 12]``

1. Cases (``gate_cases.py``): for each split (train, test), length (4K, 16K, 32K) and document kind (code, prose):
   ``--per`` pointed and ``--per`` aggregation cases; plus the agent_reads files as cold Claude Code reads
   (``agent_read``, by package: every package's files in one split).
2. Each case goes through the real pipeline, cold (``in_conversation=False``), with the gate off
   (``fallback_spread=1``), so what the budget keeps is known; recorded per case: over the *unpinned* units, the
   seed's spread ``(N_eff - k) / n`` and the relevance share the kept ones hold (``kept_mass``).
3. Calibration on train only (``calibrate``): per scorer and length, the threshold on each measure that
   compresses the most pointed and agent cases while serving at least ``CONTROL`` of the aggregation cases
   whole (ties: the middle of the best interval).  Reported: the confusion on test at those thresholds and at
   the seed's 0.11 spread.
Writes ``DIR/flat_gate.json`` (every case's numbers) and ``DIR/flat_gate.md``.
"""

from __future__ import annotations

import argparse
import json
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
from pflash_proxy.compress.scores import LexicalScorer  # noqa: E402
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


def all_cases(per: int) -> list[tuple[str, gate_cases.GateCase]]:
    out = []
    for which in ("train", "test"):
        for target in LENGTHS:
            for docs in ("code", "prose"):
                for kind in ("pointed", "aggregation"):
                    for i in range(per):
                        c = gate_cases.make_case(which, kind, docs, target, i)
                        if c is not None:
                            out.append((which, c))
        out += [(which, c) for c in agent_cases(which)]
    return out


def measure(comp: Compressor, case: gate_cases.GateCase) -> dict:
    """Step 2: the gate's inputs for one case (the gate itself off)."""
    text = case.messages[case.long_index]["content"]
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find(case.messages, case.long_index, tt)
    source = "tool" if case.messages[case.long_index]["role"] == "tool" else "paste"
    t = time.perf_counter()
    out = comp.compress(tt, request, tt.total_tokens + 64, False, source, str(case.long_index + 1))
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
    keep = np.zeros(len(a.units), bool)
    keep[kept] = True
    return {"mode": out.mode, "units": len(a.units), "gated": asks_for_every(request.text), "zero": tot <= 0, "free": n, "kept_free": k, "n_eff": n_eff,
            "spread": (n_eff - k) / n if n else 1.0, "kept_mass": kept_mass(s, keep, free),
            "kept_tokens_free": float(toks[keep & free].sum() / max(1, toks[free].sum())),
            "gold": bool(case.gold) and case.gold in out.text, "tokens": tt.total_tokens, "ms": round(ms, 1)}


def band(t: int) -> int:
    return min(LENGTHS, key=lambda x: abs(np.log(x / max(t, 1))))


def decide(r: dict, measure_name: str, thr: float) -> bool:
    """Flat? (served whole).  ``spread``: the product's gate (``spread.flat_gate``); ``spread-all``: the spread
    threshold on every request (the seed's gate); ``kept_mass``: the kept units' relevance share below ``thr``."""
    if r["zero"]:
        return True
    if measure_name == "spread":
        return r["gated"] and r["spread"] > thr
    if measure_name == "spread-all":
        return r["spread"] > thr
    return r["kept_mass"] < thr


def calibrate(rows: list[dict], measure_name: str) -> float:
    """Step 3: the threshold that compresses the most pointed/agent cases with >= CONTROL of controls whole."""
    vals = sorted({r["spread" if measure_name.startswith("spread") else measure_name] for r in rows})
    cands = [0.0, 1.0] + [(a + b) / 2 for a, b in zip(vals, vals[1:])] + vals
    best: tuple[float, float] | None = None
    scored = []
    for thr in sorted(set(cands)):
        agg = [decide(r, measure_name, thr) for r in rows if r["kind"] == "aggregation"]
        pts = [not decide(r, measure_name, thr) for r in rows if r["kind"] != "aggregation"]
        ok = (sum(agg) / len(agg) if agg else 1.0) >= CONTROL
        val = (sum(pts) / len(pts) if pts else 0.0) if ok else -1.0
        scored.append((thr, val))
        if best is None or val > best[1]:
            best = (thr, val)
    assert best is not None
    top = [t for t, v in scored if v == best[1]]
    return float(statistics.median(top))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scorers", default="lexical")
    ap.add_argument("--per", type=int, default=12)
    ap.add_argument("--drafter", type=Path)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--render", type=Path, help="write the report of an earlier run's flat_gate.json again")
    args = ap.parse_args()
    if args.render:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "flat_gate.md").write_text(report(json.loads(args.render.read_text())))
        return
    lengths = tuple(int(x) for x in args.lengths.split(","))
    cases = [(w, c) for w, c in all_cases(args.per) if c.kind == "agent_read" or c.target in lengths]
    rows = []
    for name in args.scorers.split(","):
        scorer = scorer_for(name, args.drafter)
        comp = Compressor(CompressionSettings(fallback_spread=1.0), scorer=scorer)
        for which, c in cases:
            r = measure(comp, c)
            r.update(scorer=name, split=which, case=c.case_id, kind=c.kind, docs=c.docs, band=band(c.target))
            rows.append(r)
            print(json.dumps(r), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flat_gate.json").write_text(json.dumps(rows, indent=1))
    (args.out / "flat_gate.md").write_text(report(rows))


def scorer_for(name: str, drafter: Path | None):
    if name == "lexical":
        return LexicalScorer()
    from pflash_proxy.config import Settings
    from pflash_proxy.stages.scorers import build_scorer

    return build_scorer(Settings(drafter=drafter, scorer=name)).scorer


def report(rows: list[dict]) -> str:
    ok = [r for r in rows if r["mode"] == "compressed"]
    out = ["# Flat gate calibration", "", "## Confusion at the shipped thresholds (test split)", "",
           "Served compressed / served whole per kind; `pointed` split by whether the question has words that make the "
           "gate apply (`asks_for_every`); gold = the pointed evidence whole in the compressed text.", "",
           "| scorer | thresholds | length | pointed, not gated: compressed (gold) | pointed, gated: compressed | "
           "agent reads: compressed (gold) | aggregation: whole |", "|---|---|---|---|---|---|---|"]
    for scorer in sorted({r["scorer"] for r in ok}):
        curve = SpreadCurve.parse(default_spread(scorer))
        for b in LENGTHS:
            test = [r for r in ok if r["scorer"] == scorer and r["band"] == b and r["split"] == "test"]
            if not test:
                continue

            def cell(rs: list[dict], whole: bool = False, gold: bool = False, curve: SpreadCurve = curve) -> str:
                if not rs:
                    return "-"
                flat = [decide(r, "spread", curve.at(r["tokens"])) for r in rs]
                n = sum(f == whole for f in flat)
                g = f" ({sum(r['gold'] for r, f in zip(rs, flat) if not f)})" if gold else ""
                return f"{n}/{len(rs)}{g}"
            pts = [r for r in test if r["kind"] == "pointed"]
            out.append(f"| {scorer} | {curve} | {b // 1024}K | {cell([r for r in pts if not r['gated']], gold=True)} | "
                       f"{cell([r for r in pts if r['gated']])} | "
                       f"{cell([r for r in test if r['kind'] == 'agent_read'], gold=True)} | "
                       f"{cell([r for r in test if r['kind'] == 'aggregation'], whole=True)} |")
    out += ["", "## Calibration: thresholds chosen on train, applied to test", "",
            "`spread`: the product's gate (spread threshold on requests that ask for every match); `spread-all`: the "
            "same threshold on every request (the seed's gate); `kept_mass`: flat when the kept unpinned units hold "
            "less than that share of the unpinned relevance.", ""]
    for scorer in sorted({r["scorer"] for r in ok}):
        out += [f"### {scorer}", "", "| length | measure | threshold (train) | pointed compressed (test) | "
                "agent reads compressed (test) | aggregation whole (test) | seed 0.11 spread: pointed / agent / "
                "aggregation |", "|---|---|---|---|---|---|---|"]
        for b in LENGTHS:
            mine = [r for r in ok if r["scorer"] == scorer and (r["band"] == b)]
            train = [r for r in mine if r["split"] == "train"]
            test = [r for r in mine if r["split"] == "test"]
            if not train or not test:
                continue
            for m in ("spread", "spread-all", "kept_mass"):
                thr = calibrate(train, m)
                out.append(f"| {b // 1024}K | {m} | {thr:.3f} | {_frac(test, 'pointed', m, thr)} | "
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
