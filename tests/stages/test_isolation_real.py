"""Isolation between clients, against a real llama-server (issue 26, items 1, 9 and 10).

1. A Responses id expands to the items of its own chain only: a client whose conversation starts like another's
   never receives the other's items (the A/B leak), and an id recorded for one credential means nothing to another.
2. Two credentials (``Authorization`` / ``x-api-key``) never share a session record, even with identical
   messages; the raw keys never reach the index.
3. Recorded responses are pruned with their session (``--max-sessions``).
4. llama.cpp's own ``test_cancel_request`` through the proxy: a client that gives up after 0.1 s leaves the slot
   idle 2 s later (streamed or not), and the proxy's lease goes once llama-server's slot is idle (issue 26
   item 10).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from pflash_proxy.server.app import create_app
from pflash_proxy.sessions.index import open_index
from tests.conftest import make_settings, session_service

pytestmark = pytest.mark.llama

HELLO = "Hello there. I am planning a short trip to the coast next week and want to pack light."
PRIVATE = "B-PRIVATE: my card number is 4111 1111 1111 1111"
IDLE_WITHIN_S = 15


async def make_proxy(aiohttp_client, server, tmp_path, index=None, **kw):
    settings = make_settings(server.url, tmp_path, slot_save_path=server.slot_dir, **kw)
    return await aiohttp_client(create_app(settings, index=index))


async def respond(proxy, input_, headers=None, **kw):
    resp = await proxy.post("/v1/responses", json={"model": "gemma", "input": input_, "max_output_tokens": 8,
                                                   "temperature": 0, **kw}, headers=headers or {})
    body = await resp.json()
    assert resp.status == 200, body
    return resp.headers, body


def output_text(body: dict) -> str:
    return "".join(p.get("text", "") for o in body["output"] if o.get("type") == "message"
                   for p in o.get("content") or [])


async def test_a_response_id_expands_to_its_own_chain_not_a_conversation_that_shares_its_start(
        aiohttp_client, llama_server, tmp_path):
    """Issue 26 item 1, as reported: A and B start with the same message (one session record); B's answer was
    recorded last, and A's previous_response_id expanded into B's items."""
    proxy = await make_proxy(aiohttp_client, llama_server, tmp_path)
    ha, a1 = await respond(proxy, [{"role": "user", "content": HELLO}])
    hb, b1 = await respond(proxy, [{"role": "user", "content": HELLO}, {"role": "user", "content": PRIVATE}])
    assert hb["X-PFlash-Session"] == ha["X-PFlash-Session"]  # B continued the session A started: the shared record
    h2, a2 = await respond(proxy, "What did I just tell you?", previous_response_id=a1["id"])
    served = session_service(proxy.app).view().session(h2["X-PFlash-Session"]).served
    text = json.dumps(served)
    assert "B-PRIVATE" not in text and "4111" not in text
    assert [m["role"] for m in served] == ["user", "assistant", "user"]
    assert output_text(a1) and output_text(a1) in text  # A's own answer, as the chain holds it
    # B's chain is B's: its id expands to its two messages and its answer
    h3, _ = await respond(proxy, "And?", previous_response_id=b1["id"])
    served_b = json.dumps(session_service(proxy.app).view().session(h3["X-PFlash-Session"]).served)
    assert PRIVATE in served_b and output_text(b1) in served_b


async def test_two_credentials_with_the_same_first_message_get_different_session_records(
        aiohttp_client, llama_server, tmp_path):
    proxy = await make_proxy(aiohttp_client, llama_server, tmp_path)
    first = [{"role": "user", "content": HELLO}]

    async def chat(messages, headers):
        resp = await proxy.post("/v1/chat/completions", headers=headers,
                                json={"messages": messages, "max_tokens": 4, "temperature": 0})
        body = await resp.json()
        assert resp.status == 200, body
        return resp.headers, body

    key_a, key_b = {"Authorization": "Bearer sk-alice-0123456789"}, {"x-api-key": "sk-bob-9876543210"}
    ha, a = await chat(first, key_a)
    hb, _ = await chat(first, key_b)
    hn, _ = await chat(first, {})
    assert len({ha["X-PFlash-Session"], hb["X-PFlash-Session"], hn["X-PFlash-Session"]}) == 3
    # the same key (either header) continues its own session; echoing another credential's session id does not
    turn2 = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "And the weather?"}]
    ha2, _ = await chat(turn2, {"x-api-key": "sk-alice-0123456789"})
    assert ha2["X-PFlash-Session"] == ha["X-PFlash-Session"]
    hb2, _ = await chat(turn2, {**key_b, "X-PFlash-Session": ha["X-PFlash-Session"]})
    assert hb2["X-PFlash-Session"] != ha["X-PFlash-Session"]
    view = session_service(proxy.app).view()
    owners = {view.session(h["X-PFlash-Session"]).owner for h in (ha, hb, hn)}
    assert None in owners and len(owners) == 3
    # a response id recorded for one credential is unknown to another (llama-server's own 400)
    _, r = await respond(proxy, [{"role": "user", "content": HELLO}], headers=key_a)
    resp = await proxy.post("/v1/responses", headers=key_b, json={"model": "gemma", "input": "Go on.",
                                                                    "previous_response_id": r["id"]})
    assert resp.status == 400
    # the keys themselves never reach the index
    index = b"".join(p.read_bytes() for p in Path(tmp_path / "home" / "sessions").rglob("*") if p.is_file())
    assert b"sk-alice" not in index and b"sk-bob" not in index


async def test_recorded_responses_are_pruned_with_their_session(aiohttp_client, llama_server, tmp_path):
    """Issue 26 item 9: ("response", id) entries outlived their sessions (70 left for 8 sessions, --max-sessions 2)."""
    index = open_index(tmp_path / "home")  # the default embedded index; the test reads its rows
    proxy = await make_proxy(aiohttp_client, llama_server, tmp_path, index=index, max_sessions=2)
    last = []
    for i in range(8):
        _, r1 = await respond(proxy, [{"role": "user", "content": f"Conversation {i}: {HELLO}"}])
        _, r2 = await respond(proxy, "Go on.", previous_response_id=r1["id"])
        last.append(r2["id"])
    await session_service(proxy.app).prune()
    assert index.count_sessions() == 2
    rows = index._conn().execute("SELECT sid FROM response").fetchall()  # a row per response, with its session
    assert len(rows) == 4 and len(set(rows)) == 2
    # the survivors still expand; the pruned are unknown (llama-server's 400)
    _, r3 = await respond(proxy, "Once more.", previous_response_id=last[-1])
    resp = await proxy.post("/v1/responses", json={"model": "gemma", "input": "Go on.", "max_output_tokens": 2,
                                                   "previous_response_id": last[0]})
    assert resp.status == 400


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_client_that_gives_up_leaves_the_slot_idle(aiohttp_client, llama_server, tmp_path, stream):
    """llama.cpp's tools/server/tests/unit/test_basic.py::test_cancel_request through the proxy: a /completion
    with n_predict -1 whose client times out after 0.1 s; 2 s later /slots shows the slot idle. (The test server
    runs the app with handler_cancellation, as the CLI does: the handler and its upstream request end with the
    client.) llama-server notices a closed connection of a non-streamed task only when its 1 s wait for a result
    times out, and any result of any task (a /slots answer too) restarts that wait: the proxy's own /slots
    polling while it held the lease kept the task generating to the context's end. On a loaded machine the
    cancel can land later than 2 s, so the test asks again every 1.5 s (never faster, for the same reason) up to
    ``IDLE_WITHIN_S`` and checks in llama-server's log that it cancelled the task (rather than ran it out)."""
    proxy = await make_proxy(aiohttp_client, llama_server, tmp_path)
    prompt = "I believe the meaning of life is"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.1)) as client:
        with pytest.raises(asyncio.TimeoutError):
            async with client.post(proxy.make_url("/completion"),
                                   # ignore_eos: the task ends by the cancel, never by the model's own end of
                                   # text (a sampled answer can end after ~60 tokens, before the cancel lands)
                                   json={"prompt": prompt, "n_predict": -1, "ignore_eos": True,
                                         "stream": stream}) as resp:
                await resp.read()
    left = time.monotonic()
    await asyncio.sleep(2)
    while True:
        slots = await (await proxy.get("/slots")).json()
        if not any(s["is_processing"] for s in slots) or time.monotonic() - left > IDLE_WITHIN_S:
            break
        await asyncio.sleep(1.5)
    print(f"slots {[s['is_processing'] for s in slots]} {time.monotonic() - left:.1f} s after the client left")
    assert [s["is_processing"] for s in slots] == [False] * len(slots)
    ran = max((s for s in slots if (s.get("params") or {}).get("n_predict") == -1), key=lambda s: s["id_task"])
    # cancelled (llama-server logs it), not run to the context's end
    assert f"cancel task, id_task = {ran['id_task']}\n" in llama_server.log.read_text(errors="replace")
    # the proxy's lease follows llama-server's slot: released once it is idle
    view = session_service(proxy.app).view()
    deadline = time.monotonic() + 3
    while any(s.busy for s in view.slots()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not any(s.busy for s in view.slots())
