"""A second engine fits: the session stages run on the in-process ``FakeEngine`` (``engine/fake.py``) exactly as
the server runs them on llama-server: the request is pinned to its slot with the engine's own fields, a session
the single slot's next lease displaces is saved, it is restored when it comes back, the headers say what the
engine's cache report says, and a restart empties the table. Where an index call runs is decided by the index's
declared ``remote``, not by whether nodes share it."""

from __future__ import annotations

import contextlib
import inspect
import json
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from pflash_proxy.config import Settings
from pflash_proxy.contract import Dialogue, Pipeline, ProxyRequest, RelayResult
from pflash_proxy.dialects.registry import dialect_for
from pflash_proxy.engine.fake import PIN_FIELD, FakeEngine
from pflash_proxy.server.routes import pin_of
from pflash_proxy.sessions.service import SessionService, TurnAsk
from pflash_proxy.sessions.stats import SessionStats
from pflash_proxy.sessions.index.sqlite import SqliteIndex
from pflash_proxy.stages.sessions import SessionCommitStage, SessionStage
from tests.conftest import make_settings

DOC_A = "The depot at plot 3 holds forty crates of pears and the depot at plot 8 holds nine. " * 12
DOC_B = "A lighthouse keeper logs the ships at dawn, the tide at noon and the wind at dusk. " * 12


@dataclass
class Proxy:
    engine: FakeEngine
    service: SessionService
    pipeline: Pipeline
    settings: Settings  # the service's, changed while it runs by ``write_rate``
    sent: dict[str, object] = field(default_factory=dict)  # the body the last turn sent the engine

    def on_disk(self, sid: str) -> bool:
        """Session ``sid`` has a snapshot in the index (the service's view) whose file is in the engine's folder."""
        snap = self.service.view().snapshot(sid)
        return snap is not None and self.engine.slots.save_dir is not None and \
            (self.engine.slots.save_dir / snap.file).is_file()

    def stats(self) -> SessionStats:
        """The session service's counters and gauges (its ``stats``, what ``/metrics`` shows)."""
        return self.service.stats()

    @contextlib.asynccontextmanager
    async def holding(self, sid: str) -> AsyncIterator[None]:
        """Session ``sid``'s next turn begun (found by its served history, its slot leased and made ready) and held
        meanwhile, then closed without an answer."""
        rec = self.service.view().session(sid)
        assert rec is not None
        turn = await self.service.begin(TurnAsk("chat", {}, messages=rec.served))
        assert turn.record is not None and turn.record.id == sid and turn.slot is not None
        try:
            yield
        finally:
            await turn.close()

    def write_rate(self, mb_s: float) -> None:
        """``--idle-save-mb-s`` changed on the running service (its settings, read at each save)."""
        self.settings.sessions.idle_save_mb_s = mb_s

    async def turn(self, messages: list[dict[str, object]], *, path: str = "/v1/chat/completions",
                   headers: dict[str, str] | None = None, body: dict[str, object] | None = None,
                   answered: Callable[[], object] | None = None) -> tuple[ProxyRequest, dict[str, object]]:
        """One turn through the session stages and the fake engine, as the server runs it (``path``: the
        dialect's route; ``body``: the whole body, else a chat body of ``messages``; ``answered``: called once
        the engine answered, before the proxy reads the answer)."""
        if body is None:
            body = {"messages": messages, "max_tokens": 1}
        dialect = dialect_for(path)
        assert dialect is not None
        req = ProxyRequest("chat", "POST", path, headers or {}, json.dumps(body).encode(), body, None,
                           dialogue=Dialogue(dialect, dialect.parse(body), body))
        await self.pipeline.run_request(req)
        if dialect.upstream_path:  # translated for another route, the pin carried over, as server/routes.py does
            sent = {**dialect.to_upstream(req.body, req.messages), **pin_of(self.engine, req.body)}
        else:
            sent = json.loads(req.forward_bytes())
        answer = await self.engine.complete(sent)
        if answered is not None and inspect.isawaitable(after := answered()):
            await after
        await req.settle()
        for hook in req.relay.on_answer:
            hook(answer)
        await self.pipeline.run_response(req, RelayResult(200, completed=True, final_json=answer))
        await self.pipeline.finish(req)
        self.sent = sent
        return req, answer


def chat(doc: str, *questions: str) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [{"role": "system", "content": doc}]
    for i, q in enumerate(questions):
        if i:
            messages.append({"role": "assistant", "content": "ok"})
        messages.append({"role": "user", "content": q})
    return messages


async def _proxy(tmp_path, index: SqliteIndex | None = None, n_slots: int = 1, **settings: object
                 ) -> AsyncIterator[Proxy]:
    slots = tmp_path / "slots"
    slots.mkdir()
    engine = FakeEngine(n_slots=n_slots, save_dir=slots)
    config = make_settings("http://127.0.0.1:9", tmp_path, slot_save_path=slots, **settings)
    service = SessionService(config, engine, index=index)
    pipeline = Pipeline([SessionStage(service, engine), SessionCommitStage()])
    await service.start()
    try:
        yield Proxy(engine, service, pipeline, config)
    finally:
        await service.stop()


@pytest.fixture
async def proxy(tmp_path) -> AsyncIterator[Proxy]:
    async for p in _proxy(tmp_path):
        yield p


async def test_a_session_is_pinned_saved_when_displaced_and_restored(proxy):
    req, _ = await proxy.turn(chat(DOC_A, "How many crates at plot 3?"))
    assert req.response_headers["X-PFlash-Cache"] == "miss" and proxy.sent[PIN_FIELD] == 0
    assert "id_slot" not in proxy.sent  # the fake's own pin, not llama-server's
    sid_a = req.response_headers["X-PFlash-Session"]

    req, answer = await proxy.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?"))
    report = proxy.engine.cache_report(answer)
    assert report is not None and report.cached_tokens > 200
    assert req.response_headers["X-PFlash-Cache"] == "hit"
    assert req.response_headers["X-PFlash-Cached-Tokens"] == str(report.cached_tokens)  # the engine's number
    assert req.response_headers["X-PFlash-Session"] == sid_a
    assert proxy.engine.calls.get("states", 0) == 0  # the engine vouched for the slot: nothing asked

    req, _ = await proxy.turn(chat(DOC_B, "Who logs the ships?"))  # displaces A from the only slot
    assert req.response_headers["X-PFlash-Cache"] == "miss"
    assert proxy.stats().snapshots.evicted_saves == 1 and proxy.on_disk(sid_a)
    assert proxy.engine.calls["states"] == 1  # the save checked the slot first

    req, answer = await proxy.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?", "And in all?"))
    report = proxy.engine.cache_report(answer)
    assert req.response_headers["X-PFlash-Cache"] == "restored" and req.response_headers["X-PFlash-Session"] == sid_a
    assert report is not None and report.cached_tokens > 200  # the restored slot served the prefix
    stats = proxy.stats()
    assert (stats.scheduler.hits, stats.snapshots.restored, stats.misses, stats.cache_mismatches) == (1, 1, 2, 0)
    assert stats.snapshots.snap_saves == 2 and stats.snapshots.snap_restores == 1  # A when displaced, then B


async def test_a_restart_empties_the_table_and_the_snapshot_comes_back(proxy):
    await proxy.turn(chat(DOC_A, "How many crates at plot 3?"))
    await proxy.turn(chat(DOC_B, "Who logs the ships?"))  # A saved
    proxy.engine.restart("the test restarted it")
    assert proxy.stats().scheduler.upstream_restarts == 1 and not proxy.service.view().slots()[0].tokens
    req, _ = await proxy.turn(chat(DOC_A, "How many crates at plot 3?", "And at plot 8?"))
    assert req.response_headers["X-PFlash-Cache"] == "restored"


async def test_an_unvouched_hit_is_checked_against_the_slots_state_and_a_lost_one_restored(proxy):
    await proxy.turn(chat(DOC_A, "How many crates at plot 3?"))
    await proxy.turn(chat(DOC_B, "Who logs the ships?"))  # A saved, B resident
    proxy.engine.stop_watching()  # nothing vouches for B's slot now
    req, _ = await proxy.turn(chat(DOC_B, "Who logs the ships?", "When?"))
    assert req.response_headers["X-PFlash-Cache"] == "hit" and proxy.stats().scheduler.hits_vouched == 0
    for s in proxy.engine.slots.slots:  # a restart nobody reported: the slot holds nothing, no task ran
        s.tokens, s.task, s.prompt_tokens = [], None, None
    req, _ = await proxy.turn(chat(DOC_B, "Who logs the ships?", "When?", "Why?"))
    assert req.response_headers["X-PFlash-Cache"] == "miss"  # B was never saved: prefilled, not a false hit
    assert proxy.stats().scheduler.slots_lost == 1 and proxy.stats().scheduler.upstream_restarts == 1


class RemoteStore(SqliteIndex):
    """The embedded index declared remote, as a single-node index over a network would be."""

    remote = True


def _lookup_threads(store: SqliteIndex) -> list[bool]:
    on_loop: list[bool] = []
    lookup = store.lookup

    def spy(*a):
        on_loop.append(threading.current_thread() is threading.main_thread())
        return lookup(*a)
    store.lookup = spy  # type: ignore[method-assign]
    return on_loop


@pytest.mark.parametrize("remote", [False, True])
async def test_where_a_lookup_runs_is_decided_by_the_index_declaring_itself_remote(tmp_path, remote):
    store = (RemoteStore if remote else SqliteIndex)(tmp_path / "index")
    assert store.as_cluster() is None  # one node either way
    async for p in _proxy(tmp_path, index=store):
        on_loop = _lookup_threads(store)
        await p.turn(chat("short", "hi"))
        assert on_loop == [not remote] * len(on_loop) and on_loop, on_loop  # a short history, a local index: the loop


def _anthropic(doc: str, question: str) -> dict[str, object]:
    return {"model": "m", "max_tokens": 1, "system": doc, "messages": [{"role": "user", "content": question}]}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_a_slot_that_could_not_be_erased_for_another_credential_reuses_nothing_in_any_dialect(proxy, path):
    """Cache isolation's fallback when the erase fails (``cache_prompt: false``) reaches the engine however the
    dialect is translated: the second credential's request reuses none of the first's tokens."""
    from pflash_proxy.engine import EngineRefused

    def ask(headers: dict[str, str], question: str):
        if path == "/v1/messages":
            return proxy.turn([], path=path, headers=headers, body=_anthropic(DOC_A, question))
        return proxy.turn(chat(DOC_A, question), path=path, headers=headers)

    await ask({"Authorization": "Bearer key-of-a"}, "How many crates at plot 3?")
    proxy.engine.fail("erase", EngineRefused("slot 0 erase", 501, "This server does not support slots action."))
    req, answer = await ask({"Authorization": "Bearer key-of-b"}, "How many crates at plot 8?")
    # A's request erased the slot (content of an owner this process did not know: issue 50 item 5), B's could not
    stats = proxy.stats().scheduler
    assert (stats.isolation_erases, stats.isolation_erases_unknown, stats.isolation_cold) == (1, 1, 1)
    assert proxy.sent.get("cache_prompt") is False
    report = proxy.engine.cache_report(answer)
    assert report is not None and report.cached_tokens == 0 and report.new_tokens > 200  # DOC_A not reused
