"""Typed application state keys (``web.AppKey``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from pflash_proxy.config import Settings
    from pflash_proxy.server.bodies import BodyBudget
    from pflash_proxy.server.metrics import Metrics
    from pflash_proxy.contract import Pipeline
    from pflash_proxy.llama.spawn import LlamaServerSupervisor
    from pflash_proxy.llama.upstream import Upstream

SETTINGS: web.AppKey["Settings"] = web.AppKey("settings")
UPSTREAM: web.AppKey["Upstream"] = web.AppKey("upstream")
PIPELINE: web.AppKey["Pipeline"] = web.AppKey("pipeline")
METRICS: web.AppKey["Metrics"] = web.AppKey("metrics")
SUPERVISOR: web.AppKey["LlamaServerSupervisor | None"] = web.AppKey("supervisor")
BODIES: web.AppKey["BodyBudget"] = web.AppKey("bodies")
STREAMS: web.AppKey["set[asyncio.Task]"] = web.AppKey("streams")  # handlers relaying a stream now
PEERS: web.AppKey["dict[str, Upstream]"] = web.AppKey("peers")  # other proxy nodes, by URL (forwarded turns)
