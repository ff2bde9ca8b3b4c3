"""Counters for ``/pflash/stats`` (JSON) and ``/pflash/metrics`` (Prometheus text format)."""

from __future__ import annotations

from collections import Counter
from typing import Any


class Metrics:
    def __init__(self) -> None:
        self.by_status: Counter[int] = Counter()
        self.counters: Counter[str] = Counter()

    def count_request(self, status: int) -> None:
        self.by_status[status] += 1

    def inc(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def snapshot(self) -> dict[str, Any]:
        return {"total": sum(self.by_status.values()), "by_status": {str(k): v for k, v in self.by_status.items()},
                **dict(self.counters)}

    def prometheus(self, stats: dict[str, Any]) -> str:
        lines = ["# TYPE pflash_requests_total counter"]
        for status, n in sorted(self.by_status.items()):
            lines.append(f'pflash_requests_total{{status="{status}"}} {n}')
        for name, value in sorted(_flatten(stats).items()):
            if name.startswith("requests_by_status") or name == "requests_total":
                continue
            metric = "pflash_" + name
            lines.append(f"# TYPE {metric} gauge")
            lines.append(f"{metric} {value}")
        return "\n".join(lines) + "\n"


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}".replace("-", "_").replace(".", "_")
        if isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)):
            out[key] = v
        elif isinstance(v, dict):
            out.update(_flatten(v, key + "_"))
    return out
