"""The app calls what ``contract.Stage`` declares (issue 27): ``bind`` with the metrics' hooks, ``start`` in
order, ``stop`` in reverse, ``save_all`` for ``POST /pflash/save``, ``stats`` under the stage's name."""

from __future__ import annotations

from dataclasses import dataclass

from pflash_proxy.contract import Stage, StageHooks
from pflash_proxy.server.app import create_app
from pflash_proxy.stats import Stats
from tests.conftest import make_settings


@dataclass(frozen=True)
class Saves(Stats):
    saves: int


class Hooked(Stage):
    def __init__(self, name: str, log: list[str], saves: int):
        self.name, self.log, self.saves = name, log, saves
        self.hooks: StageHooks | None = None

    def bind(self, hooks: StageHooks) -> None:
        self.hooks = hooks
        self.log.append(f"bind {self.name}")

    async def start(self) -> None:
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")

    async def save_all(self) -> int:
        return self.saves

    def stats(self) -> Saves:
        return Saves(self.saves)


async def test_the_app_calls_the_declared_hooks(aiohttp_client, tmp_path):
    log: list[str] = []
    a, b = Hooked("a", log, 2), Hooked("b", log, 3)
    client = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path), stages=[a, b]))
    assert log == ["bind a", "bind b", "start a", "start b"]
    assert a.hooks is not None and a.hooks.on_snapshot_timing is not None  # the metrics' histogram
    r = await client.post("/pflash/save")
    assert r.status == 200 and (await r.json()) == {"saved": 5}
    stats = await (await client.get("/pflash/stats")).json()
    assert stats["a"] == {"saves": 2} and stats["b"] == {"saves": 3}
    await client.close()
    assert log[-2:] == ["stop b", "stop a"]


async def test_the_inspector_is_a_sub_app_that_falls_through(aiohttp_client, tmp_path):
    client = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path, sessions=False)))
    r = await client.get("/pflash/api/overview")
    data = await r.json()
    assert r.status == 200 and data["slots"] == [] and data["sessions"] == [] and "requests" in data["counters"]
    assert (await client.get("/pflash/stats")).status == 200  # the proxy's own /pflash routes are still its own
    r = await client.get("/pflash/nope")
    assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
