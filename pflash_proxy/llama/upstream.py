"""The one seam to llama-server: every byte the proxy sends upstream goes through ``Upstream``.

1. One pooled ``aiohttp.ClientSession`` (``auto_decompress=False`` so compressed bodies relay untouched).
2. ``open()`` starts a request and returns the live ``ClientResponse`` for the relay to stream; aiohttp's
   connection errors are translated at this boundary into ``UpstreamUnavailable`` / ``UpstreamTimeout``
   (``raise ... from exc``), so nothing above this module sees an aiohttp client exception.
3. A readiness gate (set by the spawn supervisor, or by restart detection): while the server is starting or
   restarting a request waits for it, up to ``--upstream-wait-s`` (then 503 ``upstream_not_ready``). A request
   that never reached the server (connection refused, or llama-server's own 503 while it loads the model) waits
   the same way for ``/health`` and is sent again, so a restart behind the proxy costs clients time, not errors;
   so is a request whose connection broke before the server took it (a stale pooled connection, or one closed
   while its body was being written). A request the server was working on when it went away (killed or restarted
   mid-prefill, nothing answered yet) is sent once more when the server is back, its wait counted from the loss;
   once an answer's headers arrived (a stream under way) nothing is sent again.
4. ``call``: a JSON call to the server's own API, with ``--upstream-api-key`` (a client's own ``Authorization``
   travels only with its own requests); ``llama.engine.LlamaServerEngine`` speaks that API on it (its slot
   capability included).
5. JSON answers of 1 MiB or more (``/tokenize`` with pieces of a long message) are parsed in a worker thread.
6. ``sentinel`` (``sentinel.py``): one kept-alive connection to a loopback llama-server that vouches the server
   process has not changed since an epoch; ``notify_restart`` ends the epoch too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Mapping

import aiohttp
from aiohttp.typedefs import LooseHeaders

from pflash_proxy.errors import UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable
from pflash_proxy.headers import FORWARDED_HEADER
from pflash_proxy.llama.sentinel import Sentinel

log = logging.getLogger("pflash_proxy.llama.upstream")

_ALIVE_POLL_S = 0.25
_PARSE_OFF_LOOP_BYTES = 1 << 20


def _loading(raw: bytes) -> bool:
    """llama-server's 503 while it loads its model (``{"error": {"message": "Loading model", ...}}``)."""
    return b"Loading model" in raw[:512]


# RFC 7230 §6.1 hop-by-hop headers, plus the ones aiohttp must compute itself.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Trailers",
        "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)


# headers only proxy nodes set for each other (``sessions/cluster.py``): never passed on from a request; a node
# that forwards a turn adds its own, signed
INTERNAL = frozenset({FORWARDED_HEADER.lower()})


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str] | list[tuple[str, str]]:
    """Drop hop-by-hop headers (and any named in ``Connection:``) and the nodes' internal ones; keep everything
    else, ``Authorization`` too."""
    extra = {t.strip().lower() for t in headers.get("Connection", "").split(",") if t.strip()}
    return [(k, v) for k, v in headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() not in extra and k.lower() not in INTERNAL]


class Upstream:
    """Owns the HTTP client to llama-server and every call made to it."""

    def __init__(self, base_url: str | None, *, read_timeout_s: float = 600, connect_timeout_s: float = 10,
                 api_key: str | None = None, wait_s: float = 60):
        self.base_url = (base_url or "").rstrip("/")
        # llama-server's --api-key: sent on the proxy's OWN calls only; forwarded client requests carry theirs.
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        # None when ready; otherwise the reason the upstream cannot take traffic now.
        self.not_ready_reason: str | None = None
        self.wait_s = wait_s  # how long a request waits for a (re)starting server (0: 503 at once)
        # A base model the proxy spawned (llama/spawn.py, step 3): an Anthropic answer is capped at this many
        # tokens and a capped one ends its turn (routes.parsed); 0 = no such rule (every other upstream).
        self.turn_cap = 0
        self._ready = asyncio.Event()
        self._ready.set()
        self._restart_listeners: list[Callable[[str], object]] = []
        self.restart_notices = 0  # ``notify_restart`` calls so far
        self.sentinel = Sentinel(lambda: self.base_url, self._auth)  # started by whoever relies on it

    # Lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        # DummyCookieJar: a proxy must never keep one client's Set-Cookie and replay it for another (and it
        # skips the jar's per-request work).
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False, skip_auto_headers=("User-Agent",),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        await self.sentinel.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.start() was not awaited")
        return self._session

    def set_ready(self, ready: bool, reason: str = "llama-server is starting") -> None:
        self.not_ready_reason = None if ready else reason
        (self._ready.set if ready else self._ready.clear)()

    def add_restart_listener(self, fn: Callable[[str], object]) -> None:
        """``fn(reason)`` is called when the upstream is known to have lost its state (restart, new identity)."""
        self._restart_listeners.append(fn)

    def notify_restart(self, reason: str) -> None:
        log.warning("upstream state lost: %s", reason)
        self.restart_notices += 1
        self.sentinel.end_epoch()
        for fn in self._restart_listeners:
            try:
                fn(reason)
            except Exception:  # a listener must never break the notifier
                log.exception("restart listener failed")

    def check_ready(self) -> None:
        if self.not_ready_reason is not None:
            raise UpstreamNotReady(f"upstream not ready: {self.not_ready_reason}")

    async def wait_ready(self, deadline: float) -> None:
        """Step 3: return once the server may take traffic; 503 (``UpstreamNotReady``) past ``deadline``."""
        if self.not_ready_reason is None:
            return
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            self.check_ready()
            return
        try:
            await asyncio.wait_for(self._ready.wait(), left)
        except asyncio.TimeoutError:
            self.check_ready()

    async def _wait_alive(self, deadline: float) -> bool:
        """Step 3: after a request could not reach the server, poll ``/health`` until it answers 200 (True) or the
        deadline passes (False)."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            await asyncio.sleep(_ALIVE_POLL_S)
            await self.wait_ready(deadline)
            if await self.health(timeout_s=2):
                return True
        return False

    # Raw forwarding ----------------------------------------------------------------------------------------
    async def open(
        self, method: str, path_qs: str, headers: LooseHeaders | None = None, body: bytes | None = None, *,
        wait: bool = True
    ) -> aiohttp.ClientResponse:
        """Send a request and return the response with its body still unread (caller must release/close it).
        ``wait=False`` (health probes): answer at once while the server is not ready, as llama-server does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.wait_s if wait else 0)
        await self.wait_ready(deadline)
        url = self.base_url + path_qs
        resent = False
        while True:
            try:
                resp = await self._send(method, url, path_qs, headers, body)
            except _LostInFlight:
                # The server went away under a request it had taken (killed or restarted mid-prefill) and no answer
                # came: the client has received nothing of it, so once the server is back it is sent once more. The
                # wait starts now, not when the request was first sent (a long prefill may have used it all).
                if resent or not wait:
                    raise
                resent = True
                deadline = loop.time() + self.wait_s
                if not await self._wait_alive(deadline):
                    raise
                log.info("upstream went away under %s %s before answering; sending it again", method, path_qs)
                continue
            except UpstreamUnavailable as exc:
                if not isinstance(exc.__cause__, aiohttp.ClientConnectorError) or not await self._wait_alive(deadline):
                    raise
                log.info("upstream refused the connection (restarting?); sending %s %s again", method, path_qs)
                continue
            if resp.status == 503 and wait and resp.content_length is not None and resp.content_length <= 65536:
                # read() keeps the body on the response, so a 503 of another kind still relays as it came
                if _loading(await resp.read()):  # llama-server loading its model: nothing was processed
                    resp.release()
                    if await self._wait_alive(deadline):
                        continue
                    raise UpstreamNotReady("upstream not ready: llama-server is loading its model")
            return resp

    async def _send(self, method: str, url: str, path_qs: str, headers: LooseHeaders | None, body: bytes | None
                    ) -> aiohttp.ClientResponse:
        try:
            try:
                return await self.session.request(
                    method, url, headers=headers, data=body, allow_redirects=False, compress=False
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # The connection broke before any answer: almost always a pooled keep-alive connection the server
                # had already closed (it drops idle ones), or one it closed or reset while the body was still
                # being written (a llama-server that stops to restart: "Can not write request body"). Retry once
                # on a fresh connection (refused while the server is down: ``open`` then waits for it). A
                # connection that could not even be opened is not retried here.
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise
                log.debug("upstream connection closed under the request (%s); retrying %s %s once", exc, method,
                          path_qs)
                try:
                    return await self.session.request(
                        method, url, headers=headers, data=body, allow_redirects=False, compress=False
                    )
                except (aiohttp.ClientConnectionError, OSError) as again:  # refused or cut again: the server is gone
                    raise _LostInFlight(f"upstream {self.base_url} went away under the request: "
                                        f"{again.__class__.__name__}: {again}") from again
        except asyncio.TimeoutError as exc:
            raise UpstreamTimeout(f"upstream {self.base_url} did not answer in time") from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise UpstreamUnavailable(f"upstream {self.base_url} unreachable: {exc.__class__.__name__}: {exc}") from exc

    # The server's own API ----------------------------------------------------------------------------------
    async def call(
        self, method: str, path: str, payload: Any = None, *, timeout_s: float | None = None, check_ready: bool = True,
        wait: bool = True,
    ) -> tuple[int, Any]:
        """JSON call to llama-server; returns (status, parsed body or raw text). ``wait=False``: no waiting for a
        server that is down or starting (step 3)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.wait_s if wait else 0)
        if check_ready:
            await self.wait_ready(deadline)
        url = self.base_url + path
        kwargs: dict[str, Any] = {"headers": self._auth} if self._auth else {}
        if payload is not None:
            kwargs["json"] = payload
        if timeout_s is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        while True:
            try:
                async with self.session.request(method, url, **kwargs) as resp:
                    raw = await resp.read()
            except asyncio.TimeoutError as exc:
                raise UpstreamTimeout(f"{method} {path} timed out") from exc
            except aiohttp.ClientConnectorError as exc:
                if check_ready and await self._wait_alive(deadline):
                    continue  # refused: it never reached the server
                raise UpstreamUnavailable(f"upstream {self.base_url} unreachable: {exc}") from exc
            except (aiohttp.ClientConnectionError, OSError) as exc:
                raise UpstreamUnavailable(f"upstream {self.base_url} unreachable: {exc}") from exc
            if resp.status == 503 and check_ready and _loading(raw) and await self._wait_alive(deadline):
                continue
            break
        try:
            if len(raw) >= _PARSE_OFF_LOOP_BYTES:
                return resp.status, await loop.run_in_executor(None, json.loads, raw)
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode("utf-8", "replace")

    async def health(self, timeout_s: float = 2.0) -> bool:
        try:
            status, _ = await self.call("GET", "/health", timeout_s=timeout_s, check_ready=False)
        except (UpstreamUnavailable, UpstreamTimeout):
            return False
        return status == 200


class _LostInFlight(UpstreamUnavailable):
    """``_send``: the connection broke under a request before any answer, and the immediate resend could not reach
    the server either (``open`` waits for it and sends the request once more)."""
