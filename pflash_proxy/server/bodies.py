"""Request bodies, bounded in memory (``--max-pending-mb`` across every request being handled) and in time
(``--body-timeout-s`` for each body to arrive).

A request's body is read whole before it waits for a slot (its messages say which session, hence which slot,
it waits for), so the bytes held grow with the queue: 256 waiting requests of 64 MB would be 16 GB.

Algorithm (``read_body``):
1. A declared ``Content-Length`` over ``--max-body-mb`` gets 413 before any byte is read; a request without a
   body reads as empty.
2. The body is read as it arrives (at once when it came with the headers), chunk by chunk, with a declared length
   or chunked alike. Each chunk counts against the budget when it arrives (not the declared length up front: a
   connection that declares 64 MB and sends nothing holds nothing) and stays counted until the request ends
   (``BODY_HELD``, released by the error middleware). A body growing past ``--max-body-mb`` gets 413; a chunk
   that would take the budget beyond its bound gets 429 ``queue_full`` with ``Retry-After`` at once. One request
   is always admitted, so a single body within ``--max-body-mb`` never fails for this reason.
3. The whole body must arrive within ``--body-timeout-s`` of the request's headers. A deadline rather than a
   gap between chunks: a client sending a byte every few seconds would pass any gap, and keep its connection
   and what it sent forever. Past it the client gets 408 ``body_timeout`` with ``Connection: close``, its bytes
   are released at once, and aiohttp closes the connection after its lingering close (what still arrives is
   read and dropped, for at most its ``lingering_time``, 10 s by default). Other requests never wait on it.
4. A body that cannot be read (a Content-Encoding that does not decode, chunk framing that breaks after the
   body began) gets 400 ``invalid_body``.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from pflash_proxy.errors import BadRequest, PayloadTooLarge, ProxyError, QueueFull

RETRY_AFTER_S = 2
BODY_HELD = web.RequestKey("pflash_body_bytes", int)  # bytes this request's body counts in the BodyBudget


class BodyTimeout(ProxyError):
    """The request body did not arrive in whole within ``--body-timeout-s``."""

    status = 408
    code = "body_timeout"

    def __init__(self, message: str):
        super().__init__(message)
        self.headers["Connection"] = "close"


class BodyBudget:
    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.used = 0
        self.refused = 0

    def reserve(self, n: int, held: int = 0) -> None:
        """Count ``n`` more bytes for a request already holding ``held``; QueueFull beyond the bound."""
        if self.limit and self.used - held > 0 and self.used + n > self.limit:
            self.refused += 1
            raise QueueFull(f"request bodies waiting in the proxy already hold {self.used:,} bytes "
                            f"(--max-pending-mb is {self.limit / 2**20:g}); retry later", retry_after=RETRY_AFTER_S)
        self.used += n

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)


async def read_body(request: web.Request, budget: BodyBudget, limit: int, timeout_s: float) -> bytes:
    """The request's body, read within the bounds the module docstring lists; ``request[BODY_HELD]`` says what it
    counts."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"request body of {request.content_length} bytes exceeds --max-body-mb ({limit} bytes)")
    if not request.body_exists:
        return b""
    chunks: list[bytes] = []

    def take(chunk: bytes) -> None:
        held = request.get(BODY_HELD, 0)
        if held + len(chunk) > limit:
            raise PayloadTooLarge(f"request body exceeds --max-body-mb ({limit} bytes)")
        budget.reserve(len(chunk), held=held)
        request[BODY_HELD] = held + len(chunk)
        chunks.append(chunk)
    content = request.content
    try:
        if content.is_eof():  # all of it arrived with the headers (a small body, the usual case): no timer
            take(content.read_nowait(-1))
            return chunks[0]
        async with asyncio.timeout(timeout_s or None):
            async for chunk in content.iter_any():
                take(chunk)
    except TimeoutError:
        declared = "?" if request.content_length is None else f"{request.content_length:,}"
        raise BodyTimeout(f"request body not received in whole within --body-timeout-s ({timeout_s:g} s): "
                          f"{request.get(BODY_HELD, 0):,} of {declared} bytes arrived") from None
    except (web.RequestPayloadError, HttpProcessingError) as exc:
        reason = getattr(exc, "message", None) or getattr(exc.__cause__, "message", None) or str(exc)
        raise BadRequest(f"request body could not be read: {' '.join(str(reason).split())}",
                         code="invalid_body") from exc
    return b"".join(chunks)
