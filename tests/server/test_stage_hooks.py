"""The app calls what ``contract.Stage`` declares: ``start`` in order, ``stop`` in reverse, ``stats`` under the
stage's name; what only the sessions offer (``POST /pflash/save``, the inspector's view) goes to the session
service's admin face, which the app holds (``keys.SESSIONS``)."""

from __future__ import annotations

from dataclasses import dataclass

from pflash_proxy.contract import Stage
from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import SESSIONS
from pflash_proxy.stats import Stats
from tests.conftest import make_settings, session_service


@dataclass(frozen=True)
class Count(Stats):
    n: int


class Hooked(Stage):
    def __init__(self, name: str, log: list[str], n: int):
        self.name, self.log, self.n = name, log, n

    async def start(self) -> None:
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")

    def stats(self) -> Count:
        return Count(self.n)


async def test_the_app_calls_the_declared_hooks(aiohttp_client, tmp_path):
    log: list[str] = []
    a, b = Hooked("a", log, 2), Hooked("b", log, 3)
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path), stages=[a, b])
    client = await aiohttp_client(app)
    assert log == ["start a", "start b"] and app[SESSIONS] is None  # no session stage: no session service
    r = await client.post("/pflash/save")
    assert r.status == 200 and (await r.json()) == {"saved": 0}
    stats = await (await client.get("/pflash/stats")).json()
    assert stats["a"] == {"n": 2} and stats["b"] == {"n": 3}
    await client.close()
    assert log[-2:] == ["stop b", "stop a"]


async def test_the_app_holds_the_session_services_admin_face(aiohttp_client, tmp_path):
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path))
    client = await aiohttp_client(app)
    assert app[SESSIONS] is session_service(app)  # the one the session stage calls
    r = await client.post("/pflash/save")  # the engine was never described: nothing is resident
    assert r.status == 200 and (await r.json()) == {"saved": 0}
    overview = await (await client.get("/pflash/api/overview")).json()
    assert overview["upstream"]["model_identity"] == session_service(app).view().model_identity
    await client.close()


async def test_the_app_builds_the_session_service_and_hands_it_to_the_stage_factory(aiohttp_client, tmp_path):
    """The app is the composition root: it builds the session service, hands it to the stages it builds
    (``stages.default_stages`` or a caller's factory), starts it first and stops it last."""
    from pflash_proxy.stages import default_stages

    handed: list[object] = []

    def stages(settings, engine, sessions):
        handed.append(sessions)
        return default_stages(settings, engine, sessions)
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path), stages=stages)
    client = await aiohttp_client(app)
    assert handed == [app[SESSIONS]] and app[SESSIONS] is not None and session_service(app) is app[SESSIONS]
    await client.close()
    off: list[object] = []
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path / "off", sessions=False),
                     stages=lambda settings, engine, sessions: off.append(sessions) or [])
    client = await aiohttp_client(app)
    assert off == [None] and app[SESSIONS] is None  # --no-sessions: no service is built
    await client.close()


async def test_the_inspector_is_a_sub_app_that_falls_through(aiohttp_client, tmp_path):
    client = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path, sessions=False)))
    r = await client.get("/pflash/api/overview")
    data = await r.json()
    assert r.status == 200 and data["slots"] == [] and data["sessions"] == [] and "requests" in data["counters"]
    assert (await client.get("/pflash/stats")).status == 200  # the proxy's own /pflash routes are still its own
    r = await client.get("/pflash/nope")
    assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
