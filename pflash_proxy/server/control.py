"""The proxy's own endpoints: ``GET /`` (llama-server's web UI where the upstream serves one; else a browser goes to
the inspector and any other client gets a JSON index of the routes), ``GET /pflash/stats`` (JSON),
``GET /pflash/metrics`` (Prometheus) and ``POST /pflash/save`` (snapshot every resident session now), and the stats
every view reads."""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING

from aiohttp import web

from pflash_proxy.llama.api import ROUTE_EXAMPLES, serves_root
from pflash_proxy.server.keys import BODIES, ENGINE, METRICS, PIPELINE, SESSIONS, UPSTREAM
from pflash_proxy.stats import BodyStats, ProxyStats, UpstreamStats

if TYPE_CHECKING:
    from pflash_proxy.llama.upstream import Upstream


ROOT_PROBE_S = 30.0  # how long the answer "does llama-server serve /" is kept
_root_served: weakref.WeakKeyDictionary[Upstream, tuple[float, bool]] = weakref.WeakKeyDictionary()  # per transport


async def upstream_serves_root(request: web.Request) -> bool:
    """Whether the upstream answers ``GET /`` itself (a build with the web UI), asked at most every
    ``ROOT_PROBE_S``; a server that is down or starting counts as not serving it."""
    upstream = request.app[UPSTREAM]
    known = _root_served.get(upstream)
    if known is not None and time.monotonic() - known[0] < ROOT_PROBE_S:
        return known[1]
    served = await serves_root(upstream)
    _root_served[upstream] = (time.monotonic(), served)
    return served


async def index(request: web.Request) -> web.Response:
    """``GET /``: a browser (``Accept: text/html``) is sent to the inspector; others get the routes as JSON."""
    from pflash_proxy import __version__
    from pflash_proxy.dialects.registry import dialect_paths

    if "text/html" in request.headers.get("Accept", ""):
        raise web.HTTPFound("/pflash/ui")
    return web.json_response({
        "service": "pflash-proxy", "version": __version__, "upstream": request.app[UPSTREAM].base_url,
        "routes": {"conversations (sessions, compression, recall)": list(dialect_paths()),
                   "inspector (loopback or --api-key)": "/pflash/ui",
                   "inspector JSON": ["/pflash/api/overview", "/pflash/api/sessions", "/pflash/api/sessions/ID"],
                   "stats": "/pflash/stats", "metrics (Prometheus)": "/pflash/metrics",
                   "snapshot every resident session": "POST /pflash/save"},
        "other routes": f"forwarded to llama-server as they are ({', '.join(ROUTE_EXAMPLES)} ...)"})


async def pflash_stats(request: web.Request) -> web.Response:
    await request.app[PIPELINE].settled()  # the turns answered so far are counted
    return web.json_response(collect_stats(request.app).as_json())


async def pflash_metrics(request: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    await request.app[PIPELINE].settled()
    return web.Response(body=request.app[METRICS].prometheus(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def pflash_save(request: web.Request) -> web.Response:
    """Snapshot every resident session now (used by ``pflash-proxy warm`` and before maintenance)."""
    sessions = request.app[SESSIONS]
    return web.json_response({"saved": await sessions.save_all() if sessions is not None else 0})


def collect_stats(app: web.Application) -> ProxyStats:
    """What ``/pflash/stats`` shows (``as_json``), the metrics expose and the inspector's overview reads."""
    engine, bodies = app[ENGINE], app[BODIES]
    stages = {stage.name: s for stage in app[PIPELINE].stages if (s := stage.stats()) is not None}
    return ProxyStats(app[METRICS].snapshot(),
                      UpstreamStats(engine.address, engine.not_ready_reason is None, engine.not_ready_reason),
                      BodyStats(bodies.used, bodies.limit, bodies.refused), stages)
