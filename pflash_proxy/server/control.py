"""The proxy's own endpoints: ``GET /pflash/stats`` (JSON), ``GET /pflash/metrics`` (Prometheus) and
``POST /pflash/save`` (snapshot every resident session now), and the stats every view reads."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pflash_proxy.server.keys import BODIES, METRICS, PIPELINE, UPSTREAM


async def pflash_stats(request: web.Request) -> web.Response:
    return web.json_response(collect_stats(request.app))


async def pflash_metrics(request: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return web.Response(body=request.app[METRICS].prometheus(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def pflash_save(request: web.Request) -> web.Response:
    """Snapshot every resident session now (used by ``pflash-proxy warm`` and before maintenance)."""
    saved = 0
    for stage in request.app[PIPELINE].stages:
        saved += await stage.save_all()
    return web.json_response({"saved": saved})


def collect_stats(app: web.Application) -> dict[str, Any]:
    stats: dict[str, Any] = {"requests": app[METRICS].snapshot()}
    upstream = app[UPSTREAM]
    stats["upstream"] = {"url": upstream.base_url, "ready": upstream.not_ready_reason is None,
                         "not_ready_reason": upstream.not_ready_reason}
    bodies = app[BODIES]
    stats["bodies"] = {"held_bytes": bodies.used, "limit_bytes": bodies.limit, "refused": bodies.refused}
    for stage in app[PIPELINE].stages:
        s = stage.stats()
        if s:
            stats[stage.name] = s
    return stats
