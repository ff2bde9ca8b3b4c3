"""The Grafana dashboard in configs/ uses only metrics the proxy exports."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.server.metrics import Metrics
from pflash_proxy.sessions.stats import SchedulerStats, SessionStats, SnapshotStats
from pflash_proxy.stats import BodyStats, CompressStats, ProxyStats, RequestStats, UpstreamStats

ROOT = Path(__file__).resolve().parent.parent


def _zeros(kind: type, **given: object) -> object:
    """A stats dataclass of ``kind`` with every field 0 but those ``given``."""
    return kind(**{**{f.name: 0 for f in fields(kind)}, **given})


def _exported() -> set[str]:
    sessions = _zeros(SessionStats, store_available=True, model_identity="m", cluster=None,
                      scheduler=_zeros(SchedulerStats, hits=1, slots=2, cache_isolation="off", table=()),
                      snapshots=_zeros(SnapshotStats), engine=FakeEngine().stats())
    compress = CompressStats({"compressed": 1}, 10, 3, 1000, "lexical", "heuristic")
    stats = ProxyStats(RequestStats(0, {}), UpstreamStats("http://127.0.0.1:9", True, None), BodyStats(0, 0, 0),
                       {"sessions": sessions, "pflash": compress})  # type: ignore[dict-item]
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
