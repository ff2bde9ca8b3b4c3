"""The Grafana dashboard in configs/ uses only metrics the proxy exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pflash_proxy.server.metrics import SESSION_COUNTERS, SNAPSHOT_COUNTERS, Metrics

ROOT = Path(__file__).resolve().parent.parent


def _exported() -> set[str]:
    sessions = {**{k: 0 for k in SESSION_COUNTERS}, **{k: 0 for k in SNAPSHOT_COUNTERS}, "hits": 1, "restored": 0,
                "misses": 0, "slots": 2, "queued": 0, "snapshots": 0, "snapshot_bytes": 0, "store_available": True,
                "table": []}
    stats = {"upstream": {"ready": True}, "sessions": sessions,
             "pflash": {"modes": {"compressed": 1}, "tokens_in": 10, "tokens_kept": 3}}
    m = Metrics()
    m.bind(lambda: stats)
    return {f.name for f in m.registry.collect()}


def test_dashboard_queries_name_only_exported_metrics():
    dash = json.loads((ROOT / "configs" / "grafana-pflash-proxy.json").read_text())
    exported = _exported()
    names = {n for p in dash["panels"] for t in p["targets"] for n in re.findall(r"pflash_[a-z_]+", t["expr"])}
    assert len(names) >= 10
    for n in names:
        base = re.sub(r"_(total|bucket|count|sum)$", "", n)
        assert base in exported, f"dashboard queries {n}, which the proxy does not export"
