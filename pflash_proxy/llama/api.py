"""llama-server's own HTTP routes, as far as the proxy's server must know them (the routes it relays untouched).

1. ``CLIENT_SLOT_ROUTE``: a client's own slot action (``POST /slots/{id}?action=save|restore|erase``); the server
   refuses it, or runs it under a lease of that slot (``server/routes.slot_action``).
2. ``KNOWN_ROUTES``: llama-server's routes the proxy passes through, each its own label in the request metrics
   (any other path is ``other``: bounded label values); ``ROUTE_EXAMPLES`` names a few in the proxy's index.
3. ``serves_root``: whether llama-server answers ``GET /`` itself (a build with its web UI), one call that never
   waits for a starting server; False when it cannot be asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pflash_proxy.errors import UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable

if TYPE_CHECKING:
    from pflash_proxy.llama.upstream import Upstream

CLIENT_SLOT_ROUTE = "/slots/{slot}"
SLOTS_ROUTE = "/slots"  # a client's listing of the slots (server/routes.py filters it)
KNOWN_ROUTES = frozenset({"/v1/completions", "/completions", "/completion", "/infill", "/embedding", "/embeddings",
                          "/v1/embeddings", "/rerank", "/v1/rerank", "/v1/models", "/health", "/tokenize", "/slots"})
ROUTE_EXAMPLES = ("/completion", "/tokenize", "/slots", "/health")


async def serves_root(upstream: Upstream, timeout_s: float = 3.0) -> bool:
    """Step 3."""
    try:
        status, _ = await upstream.call("GET", "/", timeout_s=timeout_s, check_ready=False, wait=False)
    except (UpstreamUnavailable, UpstreamNotReady, UpstreamTimeout):
        return False
    return status == 200
