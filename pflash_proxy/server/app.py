"""``create_app(settings) -> web.Application``: wiring only.

Start-up (one ``cleanup_ctx``, in order; torn down in reverse, also when a later step fails to start):
1. the ``Upstream`` client session;
2. the spawned llama-server, when ``--spawn`` (its supervisor opens the upstream gate once healthy);
3. the pipeline stages that own resources (session store, drafter), via their ``start``/``stop`` hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator, Callable

from aiohttp import web

from pflash_proxy.config import Settings
from pflash_proxy.server.bodies import BodyBudget
from pflash_proxy.server.keys import BODIES, METRICS, PIPELINE, SETTINGS, STREAMS, SUPERVISOR, UPSTREAM
from pflash_proxy.server.metrics import Metrics
from pflash_proxy.server.pipeline import Pipeline, Stage
from pflash_proxy.server.control import collect_stats
from pflash_proxy.server.gate import gate_middleware_factory
from pflash_proxy.server.routes import add_routes, error_middleware_factory
from pflash_proxy.spawn import LlamaServerSupervisor
from pflash_proxy.upstream import Upstream

log = logging.getLogger("pflash_proxy.app")


def build_stages(app: web.Application) -> list[Stage]:
    """The ordered stage list: response chains → sessions (identity, slot, restore) → compression → commit served
    history."""
    settings = app[SETTINGS]
    if not settings.sessions:
        return []
    from pflash_proxy.sessions.manager import SessionManager
    from pflash_proxy.sessions.stage import SessionCommitStage, SessionStage

    manager = SessionManager(settings, app[UPSTREAM])
    from pflash_proxy.sessions.chains import ResponseChainStage

    # previous_response_id is expanded into the items it stands for before the session is looked up
    stages: list[Stage] = [ResponseChainStage(manager), SessionStage(manager)]
    if settings.pflash:
        from pflash_proxy.compress_stage import CompressStage
        from pflash_proxy.drafter_setup import build_stages as build_compression

        built = build_compression(settings)  # loads the drafter when one is configured; errors stop start-up
        stages.append(CompressStage(settings, app[UPSTREAM], built.segmenter, built.scorer, built))
    stages.append(SessionCommitStage(manager))
    return stages


def create_app(settings: Settings, stages: list[Stage] | None = None) -> web.Application:
    # client_max_size only bounds aiohttp's own body readers; the handlers enforce --max-body-mb themselves.
    # gate first: non-canonical paths and /pflash/* under a foreign Host are refused before any decision
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[gate_middleware_factory(), error_middleware_factory()])
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[METRICS].bind(lambda: collect_stats(app))
    app[UPSTREAM] = Upstream(settings.upstream, read_timeout_s=settings.upstream_timeout_s,
                             api_key=settings.upstream_api_key, wait_s=settings.upstream_wait_s)
    app[SUPERVISOR] = None
    app[BODIES] = BodyBudget(int(settings.max_pending_mb * 2**20))
    app[STREAMS] = set()
    app.on_shutdown.append(_end_streams_before_the_deadline)
    app[PIPELINE] = Pipeline()
    steps = [_upstream_ctx, *([_spawn_ctx] if settings.spawn else []), _stages_ctx(stages)]
    app.cleanup_ctx.append(_in_order(steps))
    add_routes(app)
    return app


def _in_order(steps: list[Callable[[web.Application], AsyncIterator[None]]]):
    """The steps as one context: aiohttp runs no clean-up when start-up fails (``run_app`` calls ``setup``
    outside its ``try``), so a step that cannot start (no llama-server, a bad drafter file) would leave the
    earlier ones open (an "Unclosed client session" after the one-line error); the exit stack closes them."""
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for step in steps:
                await stack.enter_async_context(contextlib.asynccontextmanager(step)(app))
            yield

    return ctx


async def _end_streams_before_the_deadline(app: web.Application) -> None:
    """SIGTERM: aiohttp waits ``--shutdown-save-timeout-s`` for requests in flight, then closes their
    connections. Half a second before that, streams still running are cancelled while their clients are still
    connected, so each ends with an error event of its dialect instead of a cut connection."""
    def cancel() -> None:
        for task in list(app[STREAMS]):
            task.cancel()
    asyncio.get_running_loop().call_later(max(0.0, app[SETTINGS].shutdown_save_timeout_s - 0.5), cancel)


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    await app[UPSTREAM].start()
    try:
        yield
    finally:
        await app[UPSTREAM].close()


async def _spawn_ctx(app: web.Application) -> AsyncIterator[None]:
    supervisor = LlamaServerSupervisor(app[SETTINGS], app[UPSTREAM])
    app[SUPERVISOR] = supervisor
    try:
        await supervisor.start()
        yield
    finally:
        await supervisor.stop()


def _stages_ctx(stages: list[Stage] | None):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if stages is not None:
            app[PIPELINE].stages = list(stages)
        else:  # may load a drafter model: keep the event loop free
            app[PIPELINE].stages = await asyncio.get_running_loop().run_in_executor(None, build_stages, app)
        for stage in app[PIPELINE].stages:  # snapshot timings feed the metrics' histograms
            manager = getattr(stage, "manager", None)
            if manager is not None:
                manager.snapshots.on_timing = app[METRICS].observe_snapshot
        started: list[Stage] = []
        try:
            for stage in app[PIPELINE].stages:
                start = getattr(stage, "start", None)
                if start is not None:
                    await start()
                started.append(stage)
            yield
        finally:
            for stage in reversed(started):
                stop = getattr(stage, "stop", None)
                if stop is not None:
                    try:
                        await stop()
                    except Exception:
                        log.exception("stage %s failed to stop", stage.name)

    return ctx
