"""The one seam to llama-server: every byte the proxy sends upstream goes through ``Upstream``.

1. One pooled ``aiohttp.ClientSession`` (``auto_decompress=False`` so compressed bodies relay untouched).
2. ``open()`` starts a request and returns the live ``ClientResponse`` for the relay to stream; aiohttp's
   connection errors are translated at this boundary into ``UpstreamUnavailable`` / ``UpstreamTimeout``
   (``raise ... from exc``), so nothing above this module sees an aiohttp client exception.
3. A readiness gate (set by the spawn supervisor, or by restart detection) answers 503 before any I/O while the
   server is starting or restarting.
4. Typed helpers for the server's own API (``/props``, ``/slots``, ``/tokenize``, slot save/restore, exact
   input-token counts) used by the session and compression layers; with ``--upstream-api-key`` they
   authenticate (a client's own ``Authorization`` travels only with its own requests).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Mapping

import aiohttp

from pflash_proxy.errors import UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable

log = logging.getLogger("pflash_proxy.upstream")

# RFC 7230 §6.1 hop-by-hop headers, plus the ones aiohttp must compute itself.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Trailers",
        "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str] | list[tuple[str, str]]:
    """Drop hop-by-hop headers (and any named in ``Connection:``); keep everything else, ``Authorization`` too."""
    extra = {t.strip().lower() for t in headers.get("Connection", "").split(",") if t.strip()}
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in extra]


class Upstream:
    """Owns the HTTP client to llama-server and every call made to it."""

    def __init__(self, base_url: str | None, *, read_timeout_s: float = 600, connect_timeout_s: float = 10,
                 api_key: str | None = None):
        self.base_url = (base_url or "").rstrip("/")
        # llama-server's --api-key: sent on the proxy's OWN calls only; forwarded client requests carry theirs.
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        # None when ready; otherwise the reason the upstream cannot take traffic now.
        self.not_ready_reason: str | None = None
        self._restart_listeners: list[Callable[[str], Any]] = []

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

    def add_restart_listener(self, fn: Callable[[str], Any]) -> None:
        """``fn(reason)`` is called when the upstream is known to have lost its state (restart, new identity)."""
        self._restart_listeners.append(fn)

    def notify_restart(self, reason: str) -> None:
        log.warning("upstream state lost: %s", reason)
        for fn in self._restart_listeners:
            try:
                fn(reason)
            except Exception:  # a listener must never break the notifier
                log.exception("restart listener failed")

    def check_ready(self) -> None:
        if self.not_ready_reason is not None:
            raise UpstreamNotReady(f"upstream not ready: {self.not_ready_reason}")

    # Raw forwarding ----------------------------------------------------------------------------------------
    async def open(
        self, method: str, path_qs: str, headers: Any = None, body: bytes | None = None
    ) -> aiohttp.ClientResponse:
        """Send a request and return the response with its body still unread (caller must release/close it)."""
        self.check_ready()
        url = self.base_url + path_qs
        try:
            try:
                return await self.session.request(
                    method, url, headers=headers, data=body, allow_redirects=False, compress=False
                )
            except aiohttp.ServerDisconnectedError:
                # Almost always a pooled keep-alive connection the server had already closed (it drops idle
                # ones): the request never reached it, so retry once on a fresh connection.
                log.debug("stale upstream connection; retrying %s %s once", method, path_qs)
                return await self.session.request(
                    method, url, headers=headers, data=body, allow_redirects=False, compress=False
                )
        except asyncio.TimeoutError as exc:
            raise UpstreamTimeout(f"upstream {self.base_url} did not answer in time") from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise UpstreamUnavailable(f"upstream {self.base_url} unreachable: {exc.__class__.__name__}: {exc}") from exc

    # The server's own API ----------------------------------------------------------------------------------
    async def call(
        self, method: str, path: str, payload: Any = None, *, timeout_s: float | None = None, check_ready: bool = True
    ) -> tuple[int, Any]:
        """JSON call to llama-server; returns (status, parsed body or raw text)."""
        if check_ready:
            self.check_ready()
        url = self.base_url + path
        kwargs: dict[str, Any] = {"headers": self._auth} if self._auth else {}
        if payload is not None:
            kwargs["json"] = payload
        if timeout_s is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.request(method, url, **kwargs) as resp:
                raw = await resp.read()
        except asyncio.TimeoutError as exc:
            raise UpstreamTimeout(f"{method} {path} timed out") from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise UpstreamUnavailable(f"upstream {self.base_url} unreachable: {exc}") from exc
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode("utf-8", "replace")

    async def health(self, timeout_s: float = 2.0) -> bool:
        try:
            status, _ = await self.call("GET", "/health", timeout_s=timeout_s, check_ready=False)
        except (UpstreamUnavailable, UpstreamTimeout):
            return False
        return status == 200

    async def props(self) -> dict:
        status, data = await self.call("GET", "/props")
        return data if status == 200 and isinstance(data, dict) else {}

    async def slots(self) -> list[dict] | None:
        status, data = await self.call("GET", "/slots")
        return data if status == 200 and isinstance(data, list) else None

    async def tokenize(self, text: str, *, add_special: bool = False, with_pieces: bool = False) -> list:
        status, data = await self.call(
            "POST", "/tokenize", {"content": text, "add_special": add_special, "with_pieces": with_pieces}
        )
        if status != 200 or not isinstance(data, dict):
            raise UpstreamUnavailable(f"/tokenize failed with {status}")
        return data["tokens"]

    async def input_tokens(self, chat_body: dict) -> int:
        """Exact prompt-token count of a chat body (``POST /v1/chat/completions/input_tokens``)."""
        status, data = await self.call("POST", "/v1/chat/completions/input_tokens", chat_body)
        if status != 200 or not isinstance(data, dict) or "input_tokens" not in data:
            raise UpstreamUnavailable(f"input_tokens failed with {status}: {str(data)[:200]}")
        return int(data["input_tokens"])

    async def slot_action(self, slot: int, action: str, filename: str | None = None, timeout_s: float = 120) -> dict:
        """``POST /slots/{id}?action=save|restore|erase``; raises ``SlotActionFailed`` on any non-200."""
        payload = {"filename": filename} if filename is not None else {}
        status, data = await self.call("POST", f"/slots/{slot}?action={action}", payload, timeout_s=timeout_s)
        if status != 200:
            raise SlotActionFailed(action, slot, status, data)
        return data if isinstance(data, dict) else {}


class SlotActionFailed(Exception):
    def __init__(self, action: str, slot: int, status: int, body: Any):
        super().__init__(f"slot {slot} {action} failed with HTTP {status}: {str(body)[:300]}")
        self.action, self.slot, self.status, self.body = action, slot, status, body
