"""OpenAI-shaped errors: ``{"error": {"message", "type", "code"}}``, the only error body the proxy writes."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "unavailable_error",
    504: "timeout_error",
}


def error_body(status: int, message: str, code: str | None = None, type_: str | None = None
               ) -> dict[str, dict[str, str]]:
    return {
        "error": {
            "message": message,
            "type": type_ or _TYPES.get(status, "server_error"),
            "code": code or str(status),
        }
    }


def error_response(
    status: int, message: str, code: str | None = None, type_: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.json_response(error_body(status, message, code, type_), status=status, headers=headers)


class ProxyError(Exception):
    """An error that becomes an HTTP response with an OpenAI-shaped body."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        self.headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.code, headers=self.headers or None)


class BadRequest(ProxyError):
    status = 400
    code = "invalid_request"


class PayloadTooLarge(ProxyError):
    status = 413
    code = "request_too_large"


class UpstreamUnavailable(ProxyError):
    """The upstream could not be reached (refused, reset before a response, DNS)."""

    status = 502
    code = "upstream_unreachable"


class UpstreamNotReady(ProxyError):
    """The upstream is starting, restarting or reports itself unhealthy."""

    status = 503
    code = "upstream_not_ready"


class UpstreamTimeout(ProxyError):
    status = 504
    code = "upstream_timeout"



class QueueFull(ProxyError):
    """More requests wait for a slot than ``--max-queue`` allows: the client should come back later."""

    status = 429
    code = "queue_full"


class QueueTimeout(ProxyError):
    """A request waited ``--queue-timeout-s`` for a slot without getting one."""

    status = 503
    code = "queue_timeout"
