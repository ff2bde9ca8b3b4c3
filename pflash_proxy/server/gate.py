"""What every request passes before any routing decision: a canonical path, and for ``/pflash/*`` a local Host.

1. Path (every request). The proxy decides on the path as received (parsed route, slot-action refusal, the
   inspector); the path then travels as the upstream URL (yarl removes ``.``/``..`` segments), and llama-server
   (cpp-httplib 0.59, b11434) percent-decodes it (``%XX`` and ``%uXXXX``) and matches its routes literally,
   except ``/slots/:id_slot``, which also takes a trailing ``/`` (``/slots/0/``) and percent-decodes the id a
   second time. So the proxy decides only on paths none of this changes: no ``%``, no ``.`` or ``..`` segment,
   no empty segment (``//``), no trailing ``/`` (``/`` and ``/pflash/ui/`` excepted). Any other spelling
   (``/./slots/0``, ``/slots/./0``, ``/slots/0/``, ``/slots%2F0``, ``/./v1/chat/completions``) gets 400 JSON
   (in the dialect of the route it spells) before it is read, routed or forwarded. llama-server routes none of
   these spellings differently from their canonical path except by reaching it, so nothing a client may do is
   lost: it writes the canonical path.
2. Host (``/pflash/*``). The inspector, stats, metrics and save answer only when the Host header names a
   loopback address (``localhost``, ``127.0.0.0/8``, ``[::1]``, any port), one of the proxy's own ``--host``
   addresses, or a ``--public-host`` name; another Host gets 403 JSON. A DNS-rebinding page (its own domain
   resolved to 127.0.0.1) sends its own name and is refused, so it cannot read ``/pflash/api`` "same-origin". A
   request without a Host header (HTTP/1.0; no browser sends one) passes. A ``/pflash/*`` path the proxy does not
   serve gets 404 here, whatever the method: never llama-server's answer (its CORS pre-flight answer included).
3. Cross-site writes. A ``/pflash/*`` request other than GET/HEAD is refused (403) when it carries what a browser
   adds to another site's request: ``Sec-Fetch-Site: cross-site`` or ``same-site``, an ``Origin`` whose
   host:port is not the Host (``null`` included), or a body type an HTML form can send
   (``application/x-www-form-urlencoded``, ``multipart/form-data``, ``text/plain``). ``pflash-proxy warm`` and
   curl send none of these.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiohttp import web

from pflash_proxy.errors import error_response
from pflash_proxy.server.keys import SETTINGS

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler, Middleware

    from pflash_proxy.config import Settings

SLASH_OK = ("/", "/pflash/ui/")  # trailing slashes the proxy itself serves
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")


def path_problem(raw_path: str) -> str | None:
    """Why llama-server could route ``raw_path`` (the path as received, before the query) differently from what
    the proxy decides on it, or None when it cannot."""
    if not raw_path.startswith("/"):
        return "the path must start with /"
    if "%" in raw_path:
        return "percent-encoded characters in the path (llama-server decodes them before routing)"
    segments = raw_path.split("/")[1:]
    if any(s in (".", "..") for s in segments):
        return "a '.' or '..' segment in the path"
    if any(s == "" for s in segments[:-1]):
        return "an empty segment ('//') in the path"
    if raw_path.endswith("/") and raw_path not in SLASH_OK:
        return "a trailing '/' in the path"
    return None


def canonical_path(raw_path: str) -> str:
    """The route a non-canonical path spells (for the error's dialect and message): decoded, dot segments
    resolved, empty segments and a trailing slash dropped."""
    from urllib.parse import unquote

    out: list[str] = []
    for seg in unquote(raw_path).split("/"):
        if seg == "..":
            if out:
                out.pop()
        elif seg not in ("", "."):
            out.append(seg)
    return "/" + "/".join(out)


def host_name(value: str) -> str | None:
    """``Host`` header → the name without port, lower-case, IPv6 without brackets; None when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name
    name, sep, port = value.rpartition(":")
    if not sep:
        name = value
    elif not port.isdigit() or ":" in name:
        return None
    name = name.rstrip(".")
    return name or None


def local_host(name: str, settings: Settings) -> bool:
    """Whether ``/pflash/*`` answers under Host ``name``: a loopback name or address, an address the proxy
    listens on, or a ``--public-host``."""
    from pflash_proxy.inspector.routes import is_loopback

    if name == "localhost" or is_loopback(name):
        return True
    if name in settings.inspector.public_host:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return name in {h.lower() for h in settings.proxy.tcp_hosts if h not in ("0.0.0.0", "::")}


def refuse_path(raw_path: str, problem: str) -> web.Response:
    from pflash_proxy.dialects.registry import dialect_for

    canonical = canonical_path(raw_path)
    message = (f"non-canonical request path {raw_path[:200]!r}: {problem}; the proxy routes only canonical paths "
               f"(write {canonical[:200]!r})")
    dialect = dialect_for(canonical)
    if dialect is not None:
        return dialect.error_response(400, message, "non_canonical_path")
    return error_response(400, message, "non_canonical_path")


def refuse_pflash(request: web.Request) -> web.Response | None:
    """The 403/404 for a ``/pflash/*`` request (items 2 and 3), or None when it may be answered."""
    settings = request.app[SETTINGS]
    hosts = request.headers.getall("Host", [])
    if len(hosts) > 1:
        return error_response(400, "several Host headers", "invalid_host")
    if hosts:
        name = host_name(hosts[0])
        if name is None or not local_host(name, settings):
            return error_response(403, f"/pflash/ answers only under a loopback Host (localhost, 127.0.0.1, [::1]) "
                                       f"or a name given with --public-host; not {hosts[0][:100]!r}",
                                  "host_forbidden", "permission_error")
    from pflash_proxy.server.routes import passthrough

    # no /pflash/ route of the proxy (the catch-all, or no route of the inspector's sub-app): never forwarded
    if request.match_info.handler is passthrough or request.match_info.http_exception is not None:
        return error_response(404, f"no proxy endpoint {request.method} {request.path[:200]}", "not_found")
    if request.method not in ("GET", "HEAD"):
        refused = cross_site(request, hosts[0] if hosts else None)
        if refused is not None:
            return error_response(403, f"cross-site request refused: {refused}", "cross_site_refused",
                                  "permission_error")
    return None


def cross_site(request: web.Request, host: str | None) -> str | None:
    site = request.headers.get("Sec-Fetch-Site", "").strip().lower()
    if site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("Origin")
    if origin is not None:
        try:
            netloc = urlsplit(origin.strip()).netloc.lower()
        except ValueError:
            netloc = ""
        if not netloc or host is None or netloc != host.strip().lower():
            return f"Origin {origin[:100]!r} is not this proxy's origin"
    ctype = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if ctype in FORM_TYPES:
        return f"Content-Type {ctype} (an HTML form's); send application/json or no body"
    return None


def gate_middleware_factory() -> Middleware:
    @web.middleware
    async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
        raw = request.rel_url.raw_path
        problem = path_problem(raw)
        if problem is not None:
            return refuse_path(raw, problem)
        if request.path == "/pflash" or request.path.startswith("/pflash/"):
            refused = refuse_pflash(request)
            if refused is not None:
                return refused
        return await handler(request)

    return gate
