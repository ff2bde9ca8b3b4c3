"""Typed application state keys (``web.AppKey``)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from pflash_proxy.config import Settings
    from pflash_proxy.server.bodies import BodyBudget
    from pflash_proxy.server.metrics import Metrics
    from pflash_proxy.contract import Pipeline
    from pflash_proxy.llama.spawn import LlamaServerSupervisor
    from pflash_proxy.engine import Engine
    from pflash_proxy.llama.upstream import Upstream
    from pflash_proxy.server.peers import PeerNode
    from pflash_proxy.sessions.service import SessionAdmin

SETTINGS: web.AppKey["Settings"] = web.AppKey("settings")
UPSTREAM: web.AppKey["Upstream"] = web.AppKey("upstream")  # the transport that relays clients' requests
ENGINE: web.AppKey["Engine"] = web.AppKey("engine")  # the proxy's own calls to the server (engine seam)
PIPELINE: web.AppKey["Pipeline"] = web.AppKey("pipeline")
METRICS: web.AppKey["Metrics"] = web.AppKey("metrics")
SUPERVISOR: web.AppKey["LlamaServerSupervisor | None"] = web.AppKey("supervisor")
BODIES: web.AppKey["BodyBudget"] = web.AppKey("bodies")
STREAMS: web.AppKey["set[asyncio.Task]"] = web.AppKey("streams")  # handlers relaying a stream now
PEERS: web.AppKey["dict[str, PeerNode]"] = web.AppKey("peers")  # other proxy nodes, by URL (forwarded turns)
# the session service's admin face (saves, slot actions, its stats and read-only view); None: no sessions
SESSIONS: web.AppKey["SessionAdmin | None"] = web.AppKey("sessions")
# the nonce ``serve`` wrote into its state directory's lock file (cli/home.py); absent when none was written
HOLDER_NONCE: web.AppKey[str] = web.AppKey("holder_nonce")
PROOF_PATH = "/pflash/holder"  # ?challenge=HEX -> {"proof": proof(nonce, challenge)} (server/routes.py)


def proof(nonce: str, challenge: str) -> str:
    """What the proxy holding ``nonce`` answers to ``challenge``: HMAC-SHA256, hex (the nonce never travels)."""
    return hmac.new(nonce.encode(), challenge.encode(), hashlib.sha256).hexdigest()
