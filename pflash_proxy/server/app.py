"""``create_app(settings) -> web.Application``: the composition root, wiring only.

1. Application state under typed keys (``keys.py``): settings, metrics, the ``Upstream`` transport that relays the
   clients' requests, the ``Engine`` the proxy's own calls go through (``create_app``'s ``engine``, a factory
   handed that transport: ``llama.engine.LlamaServerEngine`` unless a caller gives another), the body budget.
2. Routes (``routes.py``) and the inspector, an aiohttp sub-app mounted at ``/pflash`` that is handed read-only
   views (the engine, the session service's view, the stats) and nothing else.
Start-up (one ``cleanup_ctx``, in order; torn down in reverse, also when a later step fails to start):
3. the ``Upstream`` client session;
4. the spawned llama-server, when ``--spawn`` (its supervisor opens the upstream gate once healthy);
5. the session service (unless ``--no-sessions`` or a caller gives its own stage list), held as its admin face
   (``SESSIONS``: saves, slot actions, stats, the view; snapshot timings feed the metrics), and the stages built
   on it (``stages.default_stages``, or a caller's factory; or a caller's list): the service starts first and
   stops last, the stages start in order (``Stage.start``) and stop in reverse (``Stage.stop``);
6. in the server process (``serve``): the garbage collector tuned (``tune_garbage_collector``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from typing import TYPE_CHECKING, AsyncIterator, Callable, TypeAlias

from aiohttp import web

from pflash_proxy.config import Settings
from pflash_proxy.contract import Pipeline, SessionsView, Stage
from pflash_proxy.engine import Engine
from pflash_proxy.inspector.data import InspectorViews
from pflash_proxy.inspector.routes import API_KEY, PREFIX, create_inspector
from pflash_proxy.llama.engine import LlamaServerEngine
from pflash_proxy.llama.spawn import LlamaServerSupervisor
from pflash_proxy.llama.upstream import Upstream
from pflash_proxy.server.bodies import BodyBudget
from pflash_proxy.server.control import collect_stats
from pflash_proxy.server.gate import gate_middleware_factory
from pflash_proxy.server.keys import (BODIES, ENGINE, METRICS, PEERS, PIPELINE, SESSIONS, SETTINGS, STREAMS,
                                      SUPERVISOR, UPSTREAM)
from pflash_proxy.server.metrics import Metrics
from pflash_proxy.server.routes import add_routes, close_peers, error_middleware_factory
from pflash_proxy.stages import default_stages

if TYPE_CHECKING:
    from pflash_proxy.sessions.index import SessionIndex
    from pflash_proxy.sessions.service import SessionService

log = logging.getLogger("pflash_proxy.app")


# the youngest generation is collected after this many new container objects (CPython's default: 700)
GEN0_THRESHOLD = 10_000


async def tune_garbage_collector(app: web.Application) -> None:
    """Step 6, once everything started:
    1. collect, then move every object start-up left (modules, the stages, the drafter's Python side) out of the
       garbage collector's reach (``gc.freeze``): a full collection then scans what the turns made, not the whole
       start-up heap;
    2. collect the youngest generation after ``GEN0_THRESHOLD`` new objects rather than 700: a turn makes hundreds
       that live until its answer, so at the default a collection often ran in the middle of a turn and moved the
       turn's live objects into the older generations, whose collections scan more and pause longer; now most of
       a turn's objects are gone before a collection sees them (docs/results.md has the
       collections' time per turn and their pauses)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    log.debug("start-up heap frozen: %d objects", gc.get_freeze_count())


# builds the engine the proxy's own calls go through, on the transport built from ``--upstream`` (an engine that
# does not call the server over it ignores it)
EngineFactory: TypeAlias = Callable[[Upstream], Engine]
# builds the stage list on the settings, the app's engine and the session service the app built (None: no
# sessions), at start-up (``stages.default_stages`` unless a caller gives another: the bench's scorer and recorder)
StageFactory: TypeAlias = Callable[[Settings, Engine, "SessionService | None"], list[Stage]]


def create_app(settings: Settings, stages: list[Stage] | StageFactory = default_stages,
               engine: EngineFactory = LlamaServerEngine, tune_collector: bool = False,
               index: SessionIndex | None = None) -> web.Application:
    """The app. ``stages``: the pipeline's stages: a factory called at start-up with the session service the app
    builds (``StageFactory``; default: ``stages.default_stages``), or a caller's own list, read at start-up, which
    has no session service; ``engine``: the factory of the app's ``Engine`` (llama-server's unless a caller gives
    another: the session, compression and savings stages, the routes and the inspector all use the one it builds);
    ``tune_collector``: once started, the objects start-up made are frozen and the collector tuned
    (``tune_garbage_collector``; the server process's, not a test's); ``index``: the session service's index
    (default: the one ``--index`` names; a test's fault-injecting one)."""
    # client_max_size only bounds aiohttp's own body readers; the handlers enforce --max-body-mb themselves.
    # gate first: non-canonical paths and /pflash/* under a foreign Host are refused before any decision
    app = web.Application(client_max_size=settings.limits.max_body_bytes,
                          middlewares=[gate_middleware_factory(), error_middleware_factory()])
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[METRICS].bind(lambda: collect_stats(app))
    up = settings.upstream
    app[UPSTREAM] = Upstream(up.url, read_timeout_s=up.upstream_timeout_s, api_key=up.upstream_api_key,
                             wait_s=up.upstream_wait_s)
    app[ENGINE] = engine(app[UPSTREAM])
    app[SUPERVISOR] = None
    app[BODIES] = BodyBudget(int(settings.limits.max_pending_mb * 2**20))
    app[STREAMS] = set()
    app[PEERS] = {}
    app.on_cleanup.append(close_peers)
    app.on_shutdown.append(_end_streams_before_the_deadline)
    app[PIPELINE] = Pipeline()
    app[SESSIONS] = None  # the session service's admin face, once built at start-up
    steps = [_upstream_ctx, *([_spawn_ctx] if up.spawn else []), _stages_ctx(stages, index)]
    app.cleanup_ctx.append(_in_order(steps))
    if tune_collector:
        app.on_startup.append(tune_garbage_collector)  # after the cleanup_ctx start-up, which aiohttp runs first
    add_routes(app)
    app[API_KEY] = settings.inspector.api_key
    app.add_subapp(PREFIX, create_inspector(InspectorViews(  # /pflash/ui and /pflash/api (loopback or --api-key)
        engine=app[ENGINE], sessions=functools.partial(_sessions_view, app), stats=lambda: collect_stats(app),
        settled=app[PIPELINE].settled)))
    return app


def _sessions_view(app: web.Application) -> SessionsView | None:
    admin = app[SESSIONS]
    return admin.view() if admin is not None else None


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
    streams = app[STREAMS]

    def cancel() -> None:
        for task in list(streams):
            task.cancel()
    asyncio.get_running_loop().call_later(max(0.0, app[SETTINGS].sessions.shutdown_save_timeout_s - 0.5), cancel)


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    await app[UPSTREAM].start()
    try:
        yield
    finally:
        await app[UPSTREAM].close()


async def _spawn_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    supervisor = LlamaServerSupervisor(settings.upstream, app[UPSTREAM], home=settings.proxy.home,
                                       slot_dir=settings.effective_slot_save_path)
    app[SUPERVISOR] = supervisor
    try:
        await supervisor.start()
        yield
    finally:
        await supervisor.stop()


def _stages_ctx(stages: list[Stage] | StageFactory, index: SessionIndex | None):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if isinstance(stages, list):
            app[PIPELINE].stages = list(stages)
        else:  # may load a drafter model: keep the event loop free
            service, app[PIPELINE].stages = await asyncio.get_running_loop().run_in_executor(
                None, _build_stages, stages, app[SETTINGS], app[ENGINE], index)
            app[SESSIONS] = service
        admin = app[SESSIONS]
        if admin is not None:
            admin.on_snapshot_timing(app[METRICS].observe_snapshot)  # snapshot timings: histograms
            await admin.start()
        started: list[Stage] = []
        try:
            for stage in app[PIPELINE].stages:
                await stage.start()
                started.append(stage)
            yield
        finally:
            for stage in reversed(started):
                try:
                    await stage.stop()
                except Exception:
                    log.exception("stage %s failed to stop", stage.name)
            if admin is not None:
                try:
                    await admin.stop()
                except Exception:
                    log.exception("the session service failed to stop")

    return ctx


def _build_stages(stages: StageFactory, settings: Settings, engine: Engine, index: SessionIndex | None
                  ) -> tuple[SessionService | None, list[Stage]]:
    """The session service (None: ``--no-sessions``) on ``index`` (default: the one ``--index`` names) and the
    stages ``stages`` builds on it."""
    from pflash_proxy.sessions.service import SessionService

    service = SessionService(settings, engine, index) if settings.sessions.enabled else None
    return service, stages(settings, engine, service)
