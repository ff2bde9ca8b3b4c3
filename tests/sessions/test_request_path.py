"""The parsed turn's session bookkeeping without round trips it does not need (issue 29, item 4).

Unit parts: the index's write marks, the slot-state prefetch's coverage rule, the served-hash reuse. The pipeline
part, on each engine (gemma-3-270m llama-server, and the in-process ``FakeEngine`` handed to ``create_app``): a
follow-up turn the engine vouches for (llama-server's upstream sentinel) asks one lookup and no slot states
(``Slots.states``, llama-server's ``GET /slots``); without it the states are asked once and the turn is still a
verified hit. The history commit runs beside the upstream request and lands before the answer.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestClient

from pflash_proxy.engine import Engine
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import ENGINE, UPSTREAM
from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.slots import SlotsPrefetch, SlotTable
from pflash_proxy.sessions.index.sqlite import SqliteIndex
from pflash_proxy.sessions.service import SessionService, TurnAsk, message_hashes
from tests.conftest import make_settings, serve_fake_engine, session_service

MSGS = [{"role": "user", "content": "Hi"}]
SAY_HELLO = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2, "temperature": 0}


def follow_up(body: dict) -> dict:
    """The next turn of ``body``'s conversation: its messages, an answer and one more question."""
    return {**body, "messages": body["messages"] + [{"role": "assistant", "content": "Hello"},
                                                    {"role": "user", "content": "Again."}]}


def test_a_write_mark_holds_until_a_write_that_changes_lookups_begins_or_ends(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    rec = store.new_session("seed", False)
    mark = store.write_mark()
    assert store.unchanged_since(mark)
    store.lookup("seed", MSGS)  # reads change nothing
    assert store.unchanged_since(mark)
    store.save_session(rec, [message_hash(m) for m in MSGS], MSGS)
    assert not store.unchanged_since(mark)
    mark = store.write_mark()
    store.update_record(rec)
    assert not store.unchanged_since(mark), "a lookup before it read the record without what it adds"
    mark = store.write_mark()
    store.prune(older_than=None, max_sessions=10)
    assert not store.unchanged_since(mark), "a prune may forget the session a lookup found"


def test_no_mark_is_given_while_a_write_runs_and_it_ends_changed(tmp_path):
    store = SqliteIndex(tmp_path / "s")
    rec = store.new_session("seed", False)
    inside, go_on = threading.Event(), threading.Event()
    put = store._put

    def slow_put(c, r):  # the write is held inside its transaction
        inside.set()
        go_on.wait(10)
        return put(c, r)
    store._put = slow_put
    t = threading.Thread(target=store.save_session, args=(rec, [message_hash(MSGS[0])], MSGS))
    t.start()
    assert inside.wait(10)
    before = store.write_mark()
    assert before is None and not store.unchanged_since(before), "a lookup now may read before the commit"
    go_on.set()
    t.join(10)
    assert store.write_mark() is not None


def test_a_prefetched_slots_answer_covers_a_slot_only_when_no_other_lease_came_between():
    table = SlotTable(2)

    async def scenario():
        done = asyncio.get_running_loop().create_future()
        first = await table.acquire("a")  # session a takes slot 0
        table.release(first)
        idle = {s.id: s.grants for s in table.slots if not s.busy}
        pf = SlotsPrefetch(done, table, idle, restarts=0)
        lease = await table.acquire("a")
        assert pf.covers(lease.slot, table, 0)
        assert not pf.covers(lease.slot, table, 1), "a restart noticed since: ask again"
        assert not pf.covers(lease.slot, SlotTable(2), 0), "a resized table: ask again"
        table.release(lease)
        other = await table.acquire("anon-slot-0")  # a slot action leased it meanwhile
        table.release(other)
        again = await table.acquire("x")
        table.release(again)
        lease = await table.acquire("a")
        assert not pf.covers(lease.slot, table, 0)
        table.release(lease)
        busy = await table.acquire("b")  # a slot busy when asked is not covered
        pf2 = SlotsPrefetch(done, table, {s.id: s.grants for s in table.slots if not s.busy}, restarts=0)
        table.release(busy)
        lease = await table.acquire("b")
        assert lease.slot.id == busy.slot.id and not pf2.covers(lease.slot, table, 0)
    asyncio.run(scenario())


def test_served_hashes_are_reused_only_for_unchanged_messages():
    before = [{"role": "system", "content": "S"}, {"role": "user", "content": "long text " * 50}]
    hashes = [message_hash(m) for m in before]
    after = [before[0], {"role": "user", "content": "long text (shortened)"}, {"role": "user", "content": "more"}]
    assert message_hashes(after, before, hashes) == [message_hash(m) for m in after]
    assert message_hashes(list(before), before, hashes) == hashes
    assert message_hashes([dict(before[0]), before[1]], before, hashes) == hashes  # equal dicts, not the same objects


@dataclass
class Turned:
    """A proxy after its first turn, its session service, the index the test handed it and the app's engine."""

    proxy: TestClient
    service: SessionService
    index: SqliteIndex
    engine: Engine


def _spy(t: Turned, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The index's lookups, the engine's slot-state calls and the slot table's leases, in order, from now on."""
    events: list[str] = []
    assert t.engine.slots is not None
    lookup, states, acquire = t.index.lookup, t.engine.slots.states, SlotTable.acquire

    def spy_lookup(*a):
        events.append("lookup")
        return lookup(*a)

    async def spy_states():
        events.append("slots")
        return await states()

    async def spy_acquire(table, *a, **kw):
        events.append("lease")
        return await acquire(table, *a, **kw)
    t.index.lookup, t.engine.slots.states = spy_lookup, spy_states
    monkeypatch.setattr(SlotTable, "acquire", spy_acquire)
    return events


def _save_threads(index: SqliteIndex) -> list[str]:
    """The names of the threads the session index's ``save_session`` runs in, from now on."""
    threads: list[str] = []
    save = index.save_session

    def spy_save(*a):
        threads.append(threading.current_thread().name)
        save(*a)
    index.save_session = spy_save
    return threads


ENGINES = [pytest.param("llama-server", marks=pytest.mark.llama), "fake"]


@pytest.fixture(params=ENGINES)
def engine_kind(request) -> str:
    return request.param


@pytest.fixture
async def after_one_turn(request, engine_kind, aiohttp_client, aiohttp_server, tmp_path):
    """A proxy that served ``SAY_HELLO`` once (a miss), with an index of the test's (it spies on it): on the real
    llama-server, or on a ``FakeEngine`` (two slots, like the real one) handed to ``create_app``, its chat route
    answered by the same fake."""
    index = SqliteIndex(tmp_path / "index")
    if engine_kind == "llama-server":
        server = request.getfixturevalue("llama_server")
        app = create_app(make_settings(server.url, tmp_path, slot_save_path=server.slot_dir), index=index)
    else:
        slots = tmp_path / "slots"
        slots.mkdir()
        fake = FakeEngine(n_slots=2, save_dir=slots)
        url, _ = await serve_fake_engine(aiohttp_server, fake)
        app = create_app(make_settings(url, tmp_path, slot_save_path=slots), engine=lambda _transport: fake,
                         index=index)
    return await _proxy_after_one_turn(aiohttp_client, app, index, SAY_HELLO)


async def _proxy_after_one_turn(aiohttp_client, app, index: SqliteIndex, body) -> Turned:
    proxy = await aiohttp_client(app)
    service, engine = session_service(proxy.app), proxy.app[ENGINE]
    await service.ensure_ready()
    for _ in range(100):  # the sentinel connects in the background at start
        if engine.epoch() is not None:
            break
        await asyncio.sleep(0.05)
    assert engine.epoch() is not None
    r = await proxy.post("/v1/chat/completions", json=body)
    assert r.status == 200 and r.headers["X-PFlash-Cache"] == "miss"
    return Turned(proxy, service, index, engine)


@pytest.mark.parametrize("engine_kind", [
    pytest.param("llama-server", marks=pytest.mark.llama),
    "fake"], indirect=True)
async def test_a_follow_up_hit_the_sentinel_vouches_for_asks_one_lookup_and_no_slots_check(after_one_turn, monkeypatch,
                                                                                          engine_kind):
    body = SAY_HELLO
    proxy = after_one_turn.proxy
    events = _spy(after_one_turn, monkeypatch)
    r = await proxy.post("/v1/chat/completions", json=body)
    assert r.status == 200 and r.headers["X-PFlash-Cache"] == "hit"
    assert events == ["lookup", "lease"], events  # the same server process since turn 1: nothing to ask it
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    assert stats["hits"] == 1 and stats["hits_vouched"] == 1
    if engine_kind == "llama-server":
        assert stats["sentinel"]["alive"] is True and stats["sentinel"]["breaks"] == 0


async def test_without_the_sentinel_a_follow_up_hit_asks_one_lookup_and_one_slots_check(after_one_turn,
                                                                                         monkeypatch):
    body = SAY_HELLO
    proxy = after_one_turn.proxy
    after_one_turn.engine.stop_watching()  # what a lost connection leaves: nothing vouches for turn 1's slot
    events = _spy(after_one_turn, monkeypatch)
    r = await proxy.post("/v1/chat/completions", json=body)
    assert r.status == 200
    assert r.headers["X-PFlash-Cache"] == "hit"
    # one of each: the /slots answer asked when the lookup began (it runs beside a lookup in a worker thread; a
    # short history is looked up on the loop, before the ask leaves) covers the lease, so it is not asked again
    assert sorted(events) == ["lease", "lookup", "slots"] and events[0] == "lookup", events
    stats = (await (await proxy.get("/pflash/stats")).json())["sessions"]
    assert stats["hits"] == 1 and stats["hits_vouched"] == 0


async def test_the_history_commit_runs_beside_the_upstream_request_and_lands_before_the_answer(after_one_turn):
    body = SAY_HELLO
    proxy, index = after_one_turn.proxy, after_one_turn.index
    events: list[str] = []
    upstream = proxy.server.app[UPSTREAM]  # the transport the relay sends the request with
    save, open_ = index.save_session, upstream.open

    def slow_save(*a):  # fault injection: a slow disk
        events.append("save starts")
        threading.Event().wait(0.5)
        save(*a)
        events.append("save ends")

    async def spy_open(*a, **kw):
        events.append("forwarded")
        return await open_(*a, **kw)
    index.save_session, upstream.open = slow_save, spy_open
    nxt = follow_up(body)
    r = await proxy.post("/v1/chat/completions", json=nxt)
    assert r.status == 200
    # the request went upstream while the history was being written, and the answer waited for the write
    assert sorted(events[:2]) == ["forwarded", "save starts"] and events[2:] == ["save ends"], events
    assert [m["content"] for m in session_service(proxy.app).view().session(r.headers["X-PFlash-Session"]).served] == \
        [m["content"] for m in nxt["messages"]]


async def test_a_short_history_is_committed_on_the_loop_and_a_long_one_in_a_worker_thread(after_one_turn):
    body = SAY_HELLO
    proxy = after_one_turn.proxy
    threads = _save_threads(after_one_turn.index)
    short = follow_up(body)
    long = {**short, "messages": short["messages"] + [{"role": "assistant", "content": "Hi"},
                                                      {"role": "user", "content": " " * 40_000 + "Bye."}]}  # > 32 KiB, few tokens
    for b in (short, long):
        r = await proxy.post("/v1/chat/completions", json={**b, "max_tokens": 1})
        assert r.status == 200, await r.text()
        assert len(session_service(proxy.app).view().session(r.headers["X-PFlash-Session"]).served) == len(b["messages"])
    assert threads[0] == threading.main_thread().name and threads[1] != threading.main_thread().name, threads


async def test_a_turn_served_as_sent_hashes_each_message_once(after_one_turn, monkeypatch):
    import pflash_proxy.sessions.service as service_module
    body = SAY_HELLO
    proxy = after_one_turn.proxy
    calls: list[str] = []

    def counting_hash(m):
        calls.append(m.get("role"))
        return message_hash(m)
    monkeypatch.setattr(service_module, "message_hash", counting_hash)
    nxt = follow_up(body)
    r = await proxy.post("/v1/chat/completions", json=nxt)
    assert r.status == 200 and r.headers["X-PFlash-Cache"] == "hit"
    assert calls == [], "the lookup already hashed every message the turn serves unchanged"


async def test_a_short_turn_commits_in_a_worker_thread_while_another_write_holds_the_index(after_one_turn):
    """SQLite would make the event loop wait for the other writer's lock: the short turn's write waits in a
    worker thread instead."""
    proxy, index = after_one_turn.proxy, after_one_turn.index
    threads = _save_threads(index)
    with index.writing():  # a prune or a long history's save runs in a worker thread meanwhile
        r = await proxy.post("/v1/chat/completions", json={**follow_up(SAY_HELLO), "max_tokens": 1})
    assert r.status == 200
    assert threads and threads[0] != threading.main_thread().name, threads


async def test_a_turn_that_looked_up_before_a_record_write_uses_the_record_read_under_its_lease(after_one_turn):
    """A record written while the next turn waits for the lease (the previous turn's commit, another process's
    write): that turn, looked up before the write, reads the record again once it holds the lease, and goes on
    with what the write left."""
    svc, index = after_one_turn.service, after_one_turn.index
    ask = TurnAsk("chat", {}, messages=SAY_HELLO["messages"], body_bytes=100)
    held = await svc.begin(ask)  # the previous turn's lease
    assert held.record is not None and held.slot is not None
    sid = held.record.id
    assert index.lookup(held.record.seed, SAY_HELLO["messages"])[0].id == sid
    found = asyncio.ensure_future(svc.begin(ask))
    await asyncio.sleep(0.1)  # the lookup ran (on the loop: a short history), the lease is awaited
    assert not found.done()
    rec = index.get(sid)
    rec.turns = 41  # a write the lookup did not see
    index.update_record(rec)
    await held.close()
    got = await asyncio.wait_for(found, 10)
    try:
        assert got.record is not None and got.record.id == sid and got.record.turns == 41
    finally:
        await got.close()


async def test_a_short_history_is_written_once_the_request_has_reached_the_engine(aiohttp_client, tmp_path):
    """The inline history write is a task made before the client's task that sends the request (Python 3.11 has
    no eager tasks): it lets the tasks ready when the route waits run first, so the engine has the request while
    the write runs instead of after it. The upstream is a thread of its own, so it notes the request's arrival
    while the loop is inside the (slowed) write; the turn runs on a pooled connection, as turns do."""
    import json
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    loop = asyncio.get_running_loop()
    slots = tmp_path / "slots"
    slots.mkdir()
    fake = FakeEngine(n_slots=2, save_dir=slots)
    arrived: list[float] = []

    class Chat(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            arrived.append(time.monotonic())
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = json.dumps(asyncio.run_coroutine_threadsafe(fake.complete(body), loop).result(10)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        index = SqliteIndex(tmp_path / "index")
        app = create_app(make_settings(f"http://127.0.0.1:{upstream.server_address[1]}", tmp_path,
                                       slot_save_path=slots), engine=lambda _transport: fake, index=index)
        proxy = (await _proxy_after_one_turn(aiohttp_client, app, index, SAY_HELLO)).proxy
        writes: list[float] = []
        save = index.save_session

        def slow_save(*a):  # fault injection: a slow disk (the loop waits, the GIL is free)
            writes.append(time.monotonic())
            threading.Event().wait(0.4)
            save(*a)
        index.save_session = slow_save
        arrived.clear()
        r = await proxy.post("/v1/chat/completions", json=follow_up(SAY_HELLO))
        assert r.status == 200 and len(writes) == 1 and len(arrived) == 1
        # the request arrived while the write ran (noted within 0.2 s of its start), not after its 0.4 s
        assert arrived[0] < writes[0] + 0.2, (writes, arrived)
    finally:
        upstream.shutdown()

