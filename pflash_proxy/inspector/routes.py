"""The inspector as an aiohttp sub-app (``create_inspector``, mounted at ``/pflash``): ``/pflash/ui`` (pages) and
``/pflash/api`` (their JSON), behind ``allowed``. It is handed read-only views (``data.InspectorViews``) and
reaches nothing else of the running proxy.

Access (``allowed``): a loopback peer always; another peer only with ``Authorization: Bearer <--api-key>`` when the
proxy has a key; else 403. The peer is the socket's, never a forwarding header (behind a reverse proxy on the same
host every client looks local, so such a set-up must restrict ``/pflash/`` itself); ``server/gate.py`` refuses
foreign Hosts and cross-site writes before. Pages are this package's static files under a Content-Security-Policy
that allows only this origin's scripts and styles; the scripts render message text as text. A session is reached
only by its full id (404 for an unknown or malformed one).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import re
from importlib import resources
from typing import Awaitable, Callable

from aiohttp import web

from pflash_proxy.errors import error_response
from pflash_proxy.inspector.data import SESSION_ID, InspectorData, InspectorViews
from pflash_proxy.sessions.index import StoreError

DATA: web.AppKey[InspectorData] = web.AppKey("inspector_data")
# the proxy's --api-key, set on the proxy's app (read through the app chain: sub-app handlers see it too)
API_KEY: web.AppKey[str | None] = web.AppKey("inspector_api_key")
PREFIX = "/pflash"
ASSET = re.compile(r"^[a-z0-9][a-z0-9_-]*\.(css|js|html)$")
CONTENT_TYPES = {"css": "text/css", "js": "text/javascript", "html": "text/html"}
CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_inspector(views: InspectorViews) -> web.Application:
    """The inspector's sub-app, to mount at ``PREFIX``: a path under it that the inspector does not serve falls
    through to the proxy's own routes (aiohttp resolves the most specific prefix first)."""
    app = web.Application()
    app[DATA] = InspectorData(views)
    app.router.add_get("/ui", guarded(page_overview))
    app.router.add_get("/ui/", guarded(page_overview))
    app.router.add_get("/ui/session/{sid}", guarded(page_session))
    app.router.add_get("/ui/static/{name}", guarded(asset))
    app.router.add_get("/api/overview", guarded(api_overview))
    app.router.add_get("/api/sessions", guarded(api_sessions))
    app.router.add_get("/api/sessions/{sid}", guarded(api_session))
    return app


def is_loopback(peer: str | None) -> bool:
    if not peer:
        return False
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def allowed(request: web.Request) -> web.Response | None:
    """None when the client may see the inspector, else the 403 to answer."""
    if is_loopback(request.remote):
        return None
    key = request.config_dict.get(API_KEY)
    if not key:
        return error_response(403, "the inspector is served to loopback clients only (start the proxy with "
                                   "--api-key to admit others with Authorization: Bearer)", "inspector_forbidden",
                              "permission_error")
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
        return None
    return error_response(403, "the inspector needs Authorization: Bearer <the proxy's --api-key> from a "
                               "non-loopback client", "inspector_forbidden", "permission_error")


def guarded(handler: Handler) -> Handler:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        refused = allowed(request)
        if refused is not None:
            return refused
        try:
            resp = await handler(request)
        except StoreError as exc:  # an unreadable index: say so, no traceback
            return error_response(503, f"session index unavailable: {exc}", "index_unavailable")
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        return resp
    wrapper.__name__ = handler.__name__
    return wrapper


def _static(name: str) -> bytes | None:
    try:
        return (resources.files("pflash_proxy.inspector") / "static" / name).read_bytes()
    except OSError:  # no such file, a directory, a name too long for the file system (ENAMETOOLONG)
        return None


def _file(name: str) -> web.Response:
    body = _static(name) if ASSET.match(name) else None
    if body is None:
        return error_response(404, f"no inspector file {name!r}", "not_found")
    headers = {"Content-Type": CONTENT_TYPES[name.rsplit(".", 1)[1]] + "; charset=utf-8"}
    if name.endswith(".html"):
        headers["Content-Security-Policy"] = CSP
        headers["Referrer-Policy"] = "no-referrer"
    return web.Response(body=body, headers=headers)


async def _settled(request: web.Request) -> None:
    """The trace writes of the turns answered so far have ended (``Stage.settle``): a page shows them."""
    settled = request.app[DATA].views.settled
    if settled is not None:
        await settled()


async def _run(fn, *args):
    """Store reads block (SQLite): in the executor."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def page_overview(request: web.Request) -> web.Response:
    return _file("overview.html")


async def page_session(request: web.Request) -> web.Response:
    sid = request.match_info["sid"]
    if not SESSION_ID.match(sid) or not await _run(request.app[DATA].session_exists, sid):
        return _unknown(sid)
    return _file("session.html")


async def asset(request: web.Request) -> web.Response:
    return _file(request.match_info["name"])


async def api_overview(request: web.Request) -> web.Response:
    await _settled(request)
    data = request.app[DATA]
    out = data.overview()  # in-memory state: on the loop, like /pflash/stats
    out["sessions"], out["sessions_total"] = await _run(data.sessions)
    return web.json_response(out)


async def api_sessions(request: web.Request) -> web.Response:
    await _settled(request)
    sessions, total = await _run(request.app[DATA].sessions)
    return web.json_response({"sessions": sessions, "total": total})


async def api_session(request: web.Request) -> web.Response:
    await _settled(request)
    sid = request.match_info["sid"]
    data = await _run(request.app[DATA].session, sid)
    if data is None:
        return _unknown(sid)
    return web.json_response(data)


def _unknown(sid: str) -> web.Response:
    return error_response(404, f"no session {sid[:40]!r}", "session_not_found")
