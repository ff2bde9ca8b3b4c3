"""Reliability on a real llama-server (gemma-3-270m): nothing lost or crossed between requests and sessions."""

from __future__ import annotations

import asyncio

import pytest

from pflash_proxy.server.app import create_app
from pflash_proxy.sessions.index import open_index
from tests.conftest import make_settings, session_service

pytestmark = pytest.mark.llama

GEN = {"temperature": 0, "seed": 1, "top_k": 1}


@pytest.fixture
async def make_proxy(aiohttp_client, llama_server, tmp_path):
    async def make(index=None, **kw):  # index: the test's own (a fault-injecting one), else --index's
        settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, **kw)
        return await aiohttp_client(create_app(settings, index=index))
    return make


async def _chat(client, messages, max_tokens=4, **extra):
    r = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens, **GEN,
                                                         **extra})
    return r.status, r.headers, await r.json()


async def test_concurrent_requests_of_one_session_do_not_overwrite_each_others_history(make_proxy):
    """B waited behind A on the session's slot and then saved a stale record over A's."""
    proxy = await make_proxy()
    turn1 = [{"role": "user", "content": "Say hello."}]
    _, h, body = await _chat(proxy, turn1)
    sid = h["X-PFlash-Session"]
    history = turn1 + [{"role": "assistant", "content": body["choices"][0]["message"]["content"]}]
    a_msgs = history + [{"role": "user", "content": "Count from one to forty in words, slowly."}]
    b_msgs = history + [{"role": "user", "content": "Name a colour."}]
    scheduler = session_service(proxy.app)._scheduler  # reaches inside: the slot check it slows down
    check = scheduler.resident_hit

    async def slow_check(lease, served_hashes):  # fault injection: A's slot check (or restore) is slow
        if len(served_hashes) == 3 and not slow_check.done:
            slow_check.done = True
            await asyncio.sleep(1.0)
        return await check(lease, served_hashes)
    slow_check.done = False
    scheduler.resident_hit = slow_check
    a = asyncio.create_task(_chat(proxy, a_msgs, max_tokens=8))
    await asyncio.sleep(0.3)  # A holds the lease but has not saved yet; B reads the record, then waits behind A
    b = asyncio.create_task(_chat(proxy, b_msgs))
    (sa, ha, ba), (sb, hb, _) = await a, await b
    assert sa == sb == 200
    assert ha["X-PFlash-Session"] == sid
    assert hb["X-PFlash-Session"] != sid, "B diverges from what A served: it must fork, not overwrite"
    rec = session_service(proxy.app).view().session(sid)
    assert [m["content"] for m in rec.served] == [m["content"] for m in a_msgs]
    nxt = a_msgs + [{"role": "assistant", "content": ba["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "Thanks."}]
    _, h3, _ = await _chat(proxy, nxt)
    # B, a fork sharing A's opening, is placed on A's idle slot (sessions/slots.py step 1), so A comes back from
    # its snapshot; either way it continues its own session, never a miss
    assert h3["X-PFlash-Session"] == sid and h3["X-PFlash-Cache"] in ("hit", "restored")


async def test_a_clients_hidden_fields_never_reach_another_clients_prompt(make_proxy):
    """Identity ignores fields like reasoning_content; the served copy must not carry them over."""
    proxy = await make_proxy()
    secret = "SECRET-OF-CLIENT-A"
    a_msgs = [{"role": "user", "content": "Hi."},
              {"role": "assistant", "content": "Hello!", "reasoning_content": secret},
              {"role": "user", "content": "Name a fruit."}]
    _, ha, _ = await _chat(proxy, a_msgs)
    b_msgs = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
              {"role": "user", "content": "Name a tree."}]
    status, hb, _ = await _chat(proxy, b_msgs)
    assert status == 200
    served_b = session_service(proxy.app).view().session(hb["X-PFlash-Session"]).served
    assert secret not in repr(served_b)
    assert served_b[1] == b_msgs[1]


async def test_a_full_queue_answers_429_with_retry_after_and_a_long_wait_503(make_proxy, llama_server):
    proxy = await make_proxy(max_queue=1, queue_timeout_s=0)
    long = [{"role": "user", "content": "Count from one to one hundred in words."}]
    busy = [asyncio.create_task(_chat(proxy, long + [{"role": "user", "content": f"Go {i}."}], max_tokens=96))
            for i in range(2)]  # both slots of the test server
    await asyncio.sleep(0.3)
    waiting = asyncio.create_task(_chat(proxy, [{"role": "user", "content": "Queued."}]))
    await asyncio.sleep(0.1)
    r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Refused."}],
                                                        "max_tokens": 2})
    assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
    assert (await r.json())["error"]["code"] == "queue_full"
    assert [(await t)[0] for t in busy] == [200, 200] and (await waiting)[0] == 200  # nothing else was lost

    proxy2 = await make_proxy(queue_timeout_s=0.2)
    busy = [asyncio.create_task(_chat(proxy2, long + [{"role": "user", "content": f"Again {i}."}], max_tokens=96))
            for i in range(2)]
    await asyncio.sleep(0.3)
    r = await proxy2.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Late."}],
                                                         "max_tokens": 2})
    assert r.status == 503 and "Retry-After" in r.headers
    assert (await r.json())["error"]["code"] == "queue_timeout"
    assert [(await t)[0] for t in busy] == [200, 200]


async def test_a_full_disk_under_the_index_never_fails_a_chat_and_saving_recovers(make_proxy, monkeypatch, tmp_path):
    """Issue 13 item 6: sqlite's 'database or disk is full' on the history write is served, flagged, counted."""
    import sqlite3

    store = open_index(tmp_path / "home")  # the proxy's index (the default embedded one), its disk filled below
    proxy = await make_proxy(index=store)
    target, name = store, "_put"  # the write under the history's record
    real_set = getattr(target, name)
    full = {"on": True}

    def set_or_full(*a, **kw):  # fault injection: what SQLite raises when the disk is full
        if full["on"]:
            raise sqlite3.OperationalError("database or disk is full")
        return real_set(*a, **kw)
    monkeypatch.setattr(target, name, set_or_full)
    msgs = [{"role": "user", "content": "Name a river."}]
    status, h, body = await _chat(proxy, msgs)
    assert status == 200 and body["choices"][0]["message"]["content"] is not None
    assert "not saved" in h["X-PFlash-Degraded"]
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["sessions"]["store_failures"] == 1 and stats["sessions"]["store_available"] is False
    full["on"] = False  # space came back
    status, h2, _ = await _chat(proxy, msgs + [{"role": "assistant", "content": "Nile."},
                                               {"role": "user", "content": "Another?"}])
    assert status == 200 and "X-PFlash-Degraded" not in h2
    assert session_service(proxy.app).view().session(h2["X-PFlash-Session"]) is not None  # saved again
    assert (await (await proxy.get("/pflash/stats")).json())["sessions"]["store_available"] is True


async def test_a_damaged_index_at_start_up_is_moved_aside_and_chats_work(make_proxy, tmp_path):
    index = tmp_path / "home" / "sessions"
    index.mkdir(parents=True)
    (index / "cache.db").write_bytes(b"this is not a sqlite database" * 100)
    proxy = await make_proxy()
    status, h, _ = await _chat(proxy, [{"role": "user", "content": "Hello?"}])
    assert status == 200 and "X-PFlash-Degraded" not in h
    assert list(index.glob("cache.db.corrupt-*"))
    assert session_service(proxy.app).view().session(h["X-PFlash-Session"]) is not None


async def test_a_quick_restart_of_an_attached_server_is_noticed_before_announcing_a_hit(make_proxy, llama_server):
    """Issue 13 item 1: a restart between two health polls was announced `hit` and prefilled in full."""
    proxy = await make_proxy(save_every_turn=True)
    service = session_service(proxy.app)
    view = service.view()
    doc = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))
    msgs = [{"role": "user", "content": doc + "\nWhat animal jumps?"}]
    status, h, body = await _chat(proxy, msgs)
    assert status == 200
    nxt = msgs + [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                  {"role": "user", "content": "And which one is lazy?"}]
    _, h2, b2 = await _chat(proxy, nxt)  # a plain hit first: the check must not spoil the normal case
    assert h2["X-PFlash-Cache"] == "hit" and b2["timings"]["cache_n"] > 400
    sid = h["X-PFlash-Session"]
    for _ in range(100):  # the background save of turn 2
        snap, slot = view.snapshot(sid), view.resident_slot(sid)
        if snap is not None and (llama_server.slot_dir / snap.file).is_file() and slot is not None \
                and view.slots()[slot].snapshot_current:
            break
        await asyncio.sleep(0.1)
    service._scheduler.watch._monitor.cancel()  # the 1 s health poll misses the restart (systemd restarts in well under 1 s)
    await asyncio.get_running_loop().run_in_executor(None, llama_server.restart)
    third = nxt + [{"role": "assistant", "content": b2["choices"][0]["message"]["content"]},
                   {"role": "user", "content": "Thanks."}]
    status, h3, b3 = await _chat(proxy, third)
    assert status == 200
    assert h3["X-PFlash-Cache"] == "restored", "the server lost the slot: the snapshot must be restored"
    assert b3["timings"]["cache_n"] > 400  # llama-server itself reports the restored prefix as cached
    assert (await (await proxy.get("/pflash/stats")).json())["sessions"]["slots_lost"] == 1


@pytest.mark.parametrize("path, body, status", [
    # gemma has no fill-in-the-middle tokens: llama-server answers 501, still under a lease
    ("/infill", {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "n_predict": 4}, 501),
    ("/v1/messages", {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}, 200),
    ("/v1/responses", {"model": "x", "max_output_tokens": 4, "input": "Hi"}, 200),
])
async def test_every_generating_route_gets_a_slot_lease(make_proxy, path, body, status):
    """Issue 12: a route that decodes must never land on a slot the table believes holds a session."""
    proxy = await make_proxy()
    _, h, _ = await _chat(proxy, [{"role": "user", "content": "Hold this slot."}])
    held = int(h["X-PFlash-Slot"])
    r = await proxy.post(path, json=body)
    await r.read()
    assert r.status == status and "X-PFlash-Slot" in r.headers
    assert int(r.headers["X-PFlash-Slot"]) != held  # the free slot, not the session's
    _, h2, b2 = await _chat(proxy, [{"role": "user", "content": "Hold this slot."},
                                    {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Again."}])
    assert h2["X-PFlash-Cache"] == "hit" and int(h2["X-PFlash-Slot"]) == held


async def test_client_slot_actions_are_refused_by_default_and_leased_when_allowed(make_proxy, llama_server):
    proxy = await make_proxy()
    r = await proxy.post("/slots/0?action=erase", json={})
    assert r.status == 403 and (await r.json())["error"]["code"] == "slot_actions_refused"
    assert (await proxy.get("/slots")).status == 200  # reading the slots still passes
    proxy2 = await make_proxy(allow_slot_actions=True)
    _, h, _ = await _chat(proxy2, [{"role": "user", "content": "Fill a slot."}])
    slot = int(h["X-PFlash-Slot"])
    r = await proxy2.post(f"/slots/{slot}?action=erase", json={})
    assert r.status == 200
    _, h2, _ = await _chat(proxy2, [{"role": "user", "content": "Fill a slot."}, {"role": "assistant", "content": "ok"},
                                    {"role": "user", "content": "More."}])
    assert h2["X-PFlash-Cache"] != "hit"  # the proxy knows the client erased it


async def test_a_slot_action_beyond_the_slot_count_wraps_as_in_llama_server_and_is_leased_there(make_proxy):
    """llama-server takes ``id_slot`` modulo its slot count (``get_slot_by_id``: "allow id_slot to be out of bounds
    (wrap around)"); the proxy leases and forgets the slot the action really touches."""
    proxy = await make_proxy(allow_slot_actions=True)
    first = [{"role": "user", "content": "Keep this."}]
    _, h, _ = await _chat(proxy, first)
    slot = int(h["X-PFlash-Slot"])
    r = await proxy.post(f"/slots/{slot + 2}?action=erase", json={})  # the test server has 2 slots
    assert r.status == 200 and (await r.json())["id_slot"] in (slot, slot + 2)
    _, h2, b2 = await _chat(proxy, first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "And?"}])
    assert h2["X-PFlash-Cache"] != "hit"  # the erase reached the session's slot, and the proxy knows it



async def test_a_batch_of_prompts_stays_a_batch(make_proxy, http, llama_server):
    """Issue 12: pinned to one slot, the two completions of [tokens, tokens] differed (llama.cpp's own
    test_completion_with_tokens_input); a batch now runs unpinned, with every slot leased."""
    proxy = await make_proxy()
    async with http.post(llama_server.url + "/tokenize", json={"content": "The capital of France is"}) as r:
        toks = (await r.json())["tokens"]
    body = {"prompt": [toks, toks], "n_predict": 8, "temperature": 0, "seed": 1}
    async with http.post(llama_server.url + "/completion", json=body) as r:
        direct = await r.json()
    r = await proxy.post("/completion", json=body)
    via = await r.json()
    assert r.status == 200 and r.headers["X-PFlash-Slot"] == "all"
    assert [c["content"] for c in via] == [c["content"] for c in direct]
    assert via[0]["content"] == via[1]["content"]
    stats = await (await proxy.get("/pflash/stats")).json()
    assert not any(s["busy"] for s in stats["sessions"]["table"])  # every lease was given back


async def test_echoing_the_session_header_continues_the_session(make_proxy):
    """Issue 12: a client that sends back the X-PFlash-Session value it received continued nothing."""
    proxy = await make_proxy()
    msgs = [{"role": "user", "content": "Remember the number 7."}]
    _, h, body = await _chat(proxy, msgs)
    nxt = msgs + [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                  {"role": "user", "content": "Which number?"}]
    r = await proxy.post("/v1/chat/completions", json={"messages": nxt, "max_tokens": 4, **GEN},
                         headers={"X-PFlash-Session": h["X-PFlash-Session"]})
    assert r.status == 200
    assert r.headers["X-PFlash-Session"] == h["X-PFlash-Session"] and r.headers["X-PFlash-Cache"] == "hit"


@pytest.mark.parametrize("header", ["x-session-affinity", "X-Claude-Code-Session-Id"])  # opencode, Claude Code
async def test_an_agents_own_session_header_names_the_conversation(make_proxy, header):
    proxy = await make_proxy()
    msgs = [{"role": "user", "content": "Same words, two agents."}]
    r1 = await proxy.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, **GEN},
                          headers={header: "agent-one"})
    r2 = await proxy.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, **GEN},
                          headers={header: "agent-two"})
    assert r1.status == r2.status == 200
    assert r1.headers["X-PFlash-Session"] != r2.headers["X-PFlash-Session"]  # two names, two sessions
