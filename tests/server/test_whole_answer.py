"""A whole (non-streamed) answer leaves once the stages saw it and finished the turn, and before the metrics and
the log line (``server/routes.py``, step 4). The client runs in a thread of its own, so it notes when the answer
reached it while the event loop is still busy with what follows."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request

from aiohttp import web

from pflash_proxy.contract import ProxyRequest, RelayResult, Stage
from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import METRICS
from tests.conftest import make_settings

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


class Noting(Stage):
    name = "noting"

    def __init__(self, events: list[tuple[str, float]]):
        self.events = events

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        self.events.append(("on_response", time.monotonic()))

    async def on_finish(self, req: ProxyRequest) -> None:
        time.sleep(0.3)  # a slow release: an answer sent before it would reach the client meanwhile
        self.events.append(("on_finish", time.monotonic()))


async def _upstream(aiohttp_server) -> str:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "Hello"}}]})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


def _post_in_a_thread(url: str, events: list[tuple[str, float]]) -> threading.Thread:
    def post() -> None:
        req = urllib.request.Request(url, json.dumps(CHAT).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        events.append(("answered", time.monotonic()))
        assert json.loads(body)["choices"][0]["message"]["content"] == "Hello"
    thread = threading.Thread(target=post)
    thread.start()
    return thread


async def _wait(thread: threading.Thread) -> None:
    while thread.is_alive():
        await asyncio.sleep(0.01)


async def test_a_whole_answer_leaves_after_the_stages_and_before_the_metrics(aiohttp_server, tmp_path):
    events: list[tuple[str, float]] = []
    app = create_app(make_settings(await _upstream(aiohttp_server), tmp_path), stages=[Noting(events)])
    proxy = await aiohttp_server(app)
    observe = app[METRICS].observe_request

    def slow_observe(*a, **kw):  # the loop is held here for 0.5 s after the answer
        events.append(("metrics", time.monotonic()))
        time.sleep(0.5)
        observe(*a, **kw)
    app[METRICS].observe_request = slow_observe
    thread = _post_in_a_thread(str(proxy.make_url("/v1/chat/completions")), events)
    await _wait(thread)
    at = dict(events)
    assert [name for name, _ in events][:2] == ["on_response", "on_finish"], events
    assert at["on_finish"] < at["answered"], "the client had the answer before the stages finished the turn"
    assert at["answered"] < at["metrics"] + 0.3, "the answer waited for the metrics"
