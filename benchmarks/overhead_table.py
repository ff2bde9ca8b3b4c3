"""The summary table of alternating ``bench_proxy.py`` runs (``benchmarks/reported/proxy-overhead-*/table.py``).

``summary(by_arm, names)``: one row per tree (``by_arm``: arm -> that arm's ``proxy.json`` results, ``names``: arm
-> the tree's label), each cell the median and range over the arm's runs: the 1-token chat turn added over
llama-server direct, ``/tokenize`` added, the parsed turn over the same turn passed through (wall and net of
llama-server's own time), and the proxy's CPU per parsed turn and parsed minus passthrough.
``sets(folder, names)``: that table for each ``runs-<set>/`` of a report folder (``run.log``: the runs in order;
``<arm>-<n>.json``: each run's ``proxy.json``).
"""

from __future__ import annotations

import json
import re
import statistics as st
from collections.abc import Mapping, Sequence
from pathlib import Path

HEADER = ("| tree | runs | chat added over direct p50 | /tokenize added p50 | parsed over passthrough p50 | "
          "net of llama-server's time | proxy CPU per parsed turn | CPU parsed − passthrough |\n"
          "|---|---|---|---|---|---|---|---|")


def _med(key: str, rows: Sequence[Mapping[str, float]]) -> str:
    vals = [x[key] for x in rows]
    return f"{st.median(vals):.2f} ms ({min(vals):.2f} – {max(vals):.2f})"


def summary(by_arm: Mapping[str, Sequence[Mapping[str, Mapping[str, float]]]], names: Mapping[str, str]) -> str:
    lines = [HEADER]
    for arm, rs in by_arm.items():
        o = [r["parsed_over_passthrough"] for r in rs]
        chats = [r["POST /v1/chat/completions (1 token)"] for r in rs]
        toks = [r["POST /tokenize"] for r in rs]
        lines.append(f"| {names[arm]} | {len(rs)} | {_med('added_p50', chats)} | {_med('added_p50', toks)} | "
                     f"{_med('added_p50', o)} | {_med('added_net_p50', o)} | "
                     f"{_med('proxy_cpu_ms_per_request', chats)} | {_med('proxy_cpu_ms_per_request', o)} |")
    return "\n".join(lines)


def sets(folder: Path, names: Mapping[str, str]) -> str:
    out = []
    for name in sorted(p.name[5:] for p in folder.glob("runs-*")):
        runs = folder / f"runs-{name}"
        order = [m.group(1) for line in (runs / "run.log").read_text().splitlines()
                 if (m := re.match(r"\S+ start (\S+) load", line))]
        by: dict[str, list[dict]] = {}
        for run in order:
            by.setdefault(run.split("-")[0], []).append(json.loads((runs / f"{run}.json").read_text()))
        out.append(f"\n### {name}: {len(order)} runs, arms alternating\n\n{summary(by, names)}")
    return "\n".join(out)
