"""The server process tunes the garbage collector once started (``server.app.tune_garbage_collector``): its
start-up heap frozen, so a full collection scans what the turns made, not every object start-up left; the youngest
generation collected after ``GEN0_THRESHOLD`` new objects. An app built for a test leaves the collector alone."""

from __future__ import annotations

import gc

from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.server.app import GEN0_THRESHOLD, create_app
from tests.conftest import make_settings


async def test_the_served_app_freezes_the_start_up_heap_and_raises_the_threshold_once_started(aiohttp_client,
                                                                                               tmp_path):
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        plain = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path / "a"),
                                                engine=lambda _t: FakeEngine()))
        assert plain.server.app is not None and gc.get_freeze_count() == 0  # a test's app: nothing frozen
        assert gc.get_threshold() == thresholds

        frozen = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path / "b"),
                                                 engine=lambda _t: FakeEngine(), tune_collector=True))
        assert frozen.server.app is not None
        assert gc.get_freeze_count() > 10_000  # the modules, the app, its stages
        assert gc.get_threshold() == (GEN0_THRESHOLD, *thresholds[1:])

        # the app and its router are out of the collector's generations; what a turn makes is not
        app = frozen.server.app
        tracked = {id(o) for o in gc.get_objects()}
        assert id(app) not in tracked and id(app.router) not in tracked
        made_now: list[object] = [object()]
        assert any(o is made_now for o in gc.get_objects())
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_serve_builds_the_app_that_freezes(monkeypatch, tmp_path):
    from aiohttp import web

    from pflash_proxy.cli import serve
    from pflash_proxy.server.app import tune_garbage_collector

    started: list[web.Application] = []
    monkeypatch.setattr(web, "run_app", lambda app, **_kw: started.append(app))
    assert serve(make_settings("http://127.0.0.1:9", tmp_path, port=0)) == 0
    assert len(started) == 1 and tune_garbage_collector in started[0].on_startup
