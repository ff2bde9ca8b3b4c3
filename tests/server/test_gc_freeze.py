"""The server process freezes its start-up heap once started (``server.app.freeze_start_up_heap``), so a full
garbage collection scans what the turns made, not every object start-up left; an app built for a test does not."""

from __future__ import annotations

import gc

from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.server.app import create_app
from tests.conftest import make_settings


async def test_the_served_app_freezes_the_start_up_heap_once_started(aiohttp_client, tmp_path):
    gc.unfreeze()
    try:
        plain = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path / "a"),
                                                engine=lambda _t: FakeEngine()))
        assert plain.server.app is not None and gc.get_freeze_count() == 0  # a test's app: nothing frozen

        frozen = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path / "b"),
                                                 engine=lambda _t: FakeEngine(), freeze_heap=True))
        assert frozen.server.app is not None
        assert gc.get_freeze_count() > 10_000  # the modules, the app, its stages

        # the app and its router are out of the collector's generations; what a turn makes is not
        app = frozen.server.app
        tracked = {id(o) for o in gc.get_objects()}
        assert id(app) not in tracked and id(app.router) not in tracked
        made_now: list[object] = [object()]
        assert any(o is made_now for o in gc.get_objects())
    finally:
        gc.unfreeze()


def test_serve_builds_the_app_that_freezes(monkeypatch, tmp_path):
    from aiohttp import web

    from pflash_proxy.cli import serve
    from pflash_proxy.server.app import freeze_start_up_heap

    started: list[web.Application] = []
    monkeypatch.setattr(web, "run_app", lambda app, **_kw: started.append(app))
    assert serve(make_settings("http://127.0.0.1:9", tmp_path, port=0)) == 0
    assert len(started) == 1 and freeze_start_up_heap in started[0].on_startup
