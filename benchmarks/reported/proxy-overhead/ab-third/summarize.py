"""The third round's before/after table: median (min – max) over the bench_proxy.py runs of each arm.

Reads ``{before,after}-N.json`` beside this file (as ``benchmarks/bench_proxy.py`` wrote them) and prints markdown.
"""
import json
import statistics
from pathlib import Path

d = Path(__file__).resolve().parent
C, P = "POST /v1/chat/completions (1 token)", "the same chat turn, passthrough"
out = {arm: [json.loads(p.read_text()) for p in sorted(d.glob(f"{arm}-*.json"))] for arm in ("before", "after")}


def fmt(vals, nd=2):
    return f"{statistics.median(vals):.{nd}f} ({min(vals):.{nd}f} – {max(vals):.{nd}f})"


def line(name, f, nd=2):
    print(f"| {name} | {fmt([f(r) for r in out['before']], nd)} | {fmt([f(r) for r in out['after']], nd)} |")


print(f"| metric | before: median (min – max) of {len(out['before'])} | after: median (min – max) of "
      f"{len(out['after'])} |")
print("|---|---|---|")
line("**parsed chat turn over the same turn passed through, p50 net of llama-server's time (ms)**",
     lambda r: r["parsed_over_passthrough"]["added_net_p50"])
line("parsed chat turn over the same turn passed through, p50 wall (ms)",
     lambda r: r["parsed_over_passthrough"]["added_p50"])
line("parsed chat turn over the same turn passed through, proxy CPU (ms/turn)",
     lambda r: r["parsed_over_passthrough"]["proxy_cpu_ms_per_request"])
line("parsed chat turn over direct, p50 net (ms)", lambda r: r[C]["added_net_p50"])
line("parsed chat turn over direct, p50 wall (ms)", lambda r: r[C]["added_p50"])
line("parsed chat turn: proxy CPU (ms/turn)", lambda r: r[C]["proxy_cpu_ms_per_request"])
line("the same turn passed through, over direct, p50 net (ms)", lambda r: r[P]["added_net_p50"])
line("the same turn passed through: proxy CPU (ms/turn)", lambda r: r[P]["proxy_cpu_ms_per_request"])
line("POST /tokenize (passthrough), over direct, p50 (ms)", lambda r: r["POST /tokenize"]["added_p50"])
line("GET /health, over direct, p50 (ms)", lambda r: r["GET /health"]["added_p50"])
line("SSE relay, added p50 (ms/event)", lambda r: r["stream"]["added_ms_per_event_p50"], 3)
line("SSE relay: proxy CPU (ms/event)", lambda r: r["stream"]["proxy_cpu_ms_per_event"], 3)
print()
print("per run (parsed over passthrough net / wall / CPU; SSE added per event):")
for arm in ("before", "after"):
    for i, r in enumerate(out[arm], 1):
        o = r["parsed_over_passthrough"]
        print(f"- {arm} {i}: {o['added_net_p50']:.2f} / {o['added_p50']:.2f} / {o['proxy_cpu_ms_per_request']:.2f} ms; "
              f"{r['stream']['added_ms_per_event_p50']:.3f} ms")
