"""Dialects registered once (``dialects/registry.py``): each owns its paths, and the routes, ``dialect_for`` and
the metrics' route labels all come from the registry."""

from __future__ import annotations

from pflash_proxy.dialects.registry import BY_PATH, DIALECTS, dialect_for, dialect_paths
from pflash_proxy.server.app import create_app
from pflash_proxy.server.metrics import route_label
from pflash_proxy.server.routes import parsed
from tests.conftest import make_settings


def test_every_dialect_owns_distinct_paths():
    assert [d.name for d in DIALECTS] == ["chat", "anthropic", "responses"]
    owned = [p for d in DIALECTS for p in d.paths]
    assert owned and len(owned) == len(set(owned)) == len(BY_PATH)
    assert "/v1/chat/completions" in owned and "/v1/messages" in owned and "/v1/responses" in owned


def test_routes_lookup_and_metrics_read_the_registry(tmp_path):
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path, sessions=False))
    posts = {r.resource.canonical: r.handler for r in app.router.routes() if r.method == "POST"}
    for cls in DIALECTS:
        for path in cls.paths:
            assert type(dialect_for(path)) is cls
            assert posts[path] is parsed, path
            assert route_label(path) == path
    assert set(dialect_paths()) == set(BY_PATH)
    assert dialect_for("/completion") is None and route_label("/v1/unknown") == "other"
