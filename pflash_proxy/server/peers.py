"""``PeerNode``: the HTTP transport to another proxy node, for turns forwarded to the node that holds a session
(``sessions/cluster.py``).

A node is another pflash-proxy, not an engine: no readiness gate, no wait for a restarting server, no
``--upstream-api-key`` (the client's own headers travel, with the forwarding node's signed mark). One pooled
``aiohttp.ClientSession`` per node (``auto_decompress=False``: compressed answers relay untouched; no cookie jar).
``open`` returns the live response for the relay; a pooled connection the node had closed before any answer is
retried once on a fresh one; errors become ``UpstreamUnavailable`` / ``UpstreamTimeout`` (the caller then serves
the turn itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import aiohttp

from pflash_proxy.errors import UpstreamTimeout, UpstreamUnavailable


class PeerNode:
    def __init__(self, base_url: str, *, read_timeout_s: float, connect_timeout_s: float = 5):
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True),
            timeout=self._timeout, auto_decompress=False, skip_auto_headers=("User-Agent",),
            cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open(self, method: str, path_qs: str, headers: Mapping[str, str] | Sequence[tuple[str, str]],
                   body: bytes | None) -> aiohttp.ClientResponse:
        """Send a request; the response comes back with its body unread (the caller releases or closes it)."""
        if self._session is None:
            raise RuntimeError("PeerNode.start() was not awaited")
        url = self.base_url + path_qs
        try:
            try:
                return await self._session.request(method, url, headers=headers, data=body, allow_redirects=False,
                                                   compress=False)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise
                return await self._session.request(method, url, headers=headers, data=body, allow_redirects=False,
                                                   compress=False)
        except asyncio.TimeoutError as exc:
            raise UpstreamTimeout(f"node {self.base_url} did not answer in time") from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise UpstreamUnavailable(f"node {self.base_url} unreachable: {exc.__class__.__name__}: {exc}") from exc
