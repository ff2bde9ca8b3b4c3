"""The before/after table of this folder: median (min – max) over the three bench_proxy.py runs of each arm.

Reads ``ab/{before,after}-{1,2,3}.json`` (as ``benchmarks/bench_proxy.py`` wrote them) and prints markdown.
"""
import json
import statistics
from pathlib import Path

d = Path(__file__).resolve().parent / "ab"
rows = []
C = "POST /v1/chat/completions (1 token)"
def fmt(vals, nd=2):
    return f"{statistics.median(vals):.{nd}f} ({min(vals):.{nd}f} – {max(vals):.{nd}f})"
out = {}
for arm in ("before", "after"):
    runs = [json.loads((d / f"{arm}-{i}.json").read_text()) for i in (1, 2, 3) if (d / f"{arm}-{i}.json").exists()]
    out[arm] = runs
print("| metric | before (02d6e25): median (min – max) | after: median (min – max) |")
print("|---|---|---|")
def line(name, f, nd=2):
    print(f"| {name} | {fmt([f(r) for r in out['before']], nd)} | {fmt([f(r) for r in out['after']], nd)} |")
line("chat turn: direct p50 ms", lambda r: r[C]["direct_p50"])
line("chat turn: added p50 ms", lambda r: r[C]["added_p50"])
line("chat turn: added p99 ms", lambda r: r[C]["added_p99"])
line("chat turn: proxy CPU ms/turn", lambda r: r[C]["proxy_cpu_ms_per_request"])
line("/tokenize (passthrough): added p50 ms", lambda r: r["POST /tokenize"]["added_p50"])
line("/tokenize: proxy CPU ms/request", lambda r: r["POST /tokenize"]["proxy_cpu_ms_per_request"])
line("GET /health: added p50 ms", lambda r: r["GET /health"]["added_p50"])
line("SSE: added p50 ms/event", lambda r: r["stream"]["added_ms_per_event_p50"], 3)
line("SSE: added p99 ms/event", lambda r: r["stream"]["added_ms_per_event_p99"], 3)
line("SSE: proxy CPU ms/event", lambda r: r["stream"]["proxy_cpu_ms_per_event"], 3)
print()
print("per run (chat added p50 / proxy CPU per turn / SSE added p50):")
for arm in ("before", "after"):
    for i, r in enumerate(out[arm], 1):
        print(f"- {arm} {i}: {r[C]['added_p50']:.2f} ms / {r[C]['proxy_cpu_ms_per_request']:.2f} ms / {r['stream']['added_ms_per_event_p50']:.3f} ms")
