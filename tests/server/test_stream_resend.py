"""A stream whose upstream dies before the first event of its answer is sent again (``relay.py``, step 4), against a
fault-injecting upstream: llama-server sends a stream's headers as its prefill starts, so a server killed
mid-prefill left the client with headers and nothing else, and the proxy, which resent only before headers,
answered with an error event (README says such a turn is sent once more).  Once an event of the answer reached
the client, nothing is sent again.  The last test kills a real llama-server mid-prefill."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings, start_llama_server

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}],' \
       b'"object":"chat.completion.chunk"}\n\n'
PROGRESS = b'data: {"choices":[],"prompt_progress":{"total":9,"cache":0,"processed":4,"time_ms":1}}\n\n'
ANSWER = [b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n',
          b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}\n\n',
          b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,'
          b'"completion_tokens":2,"total_tokens":11},"timings":{"cache_n":0,"prompt_n":9}}\n\n',
          b"data: [DONE]\n\n"]
BODY = {"messages": [{"role": "user", "content": "hi"}], "stream": True}


def dying_app(plan: list[list[bytes] | str]) -> tuple[web.Application, list[dict]]:
    """Answers the n-th chat request by ``plan[n]``: a list of chunks to stream, where the string ``"die"`` ends
    the connection (the process killed), or ``"error"``: a 400 JSON answer. Every request is recorded."""
    seen: list[dict] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        step = plan[min(len(seen), len(plan)) - 1]
        if step == "error":
            return web.json_response({"error": {"code": 400, "message": "bad", "type": "invalid_request_error"}},
                                     status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # llama-server: the headers as the prefill starts
        for chunk in step:
            if chunk == "die":
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.abort()
                return resp
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app, seen


async def _proxy(aiohttp_server, aiohttp_client, tmp_path, plan):
    app, seen = dying_app(plan)
    up = await aiohttp_server(app)
    client = await aiohttp_client(create_app(make_settings(str(up.make_url("")), tmp_path, sessions=False)))
    return client, seen


def _events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def _errors(raw: bytes) -> list[dict]:
    out = []
    for e in _events(raw):
        for line in e.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip().startswith(b"{"):
                data = json.loads(line[5:])
                if "error" in data or data.get("type") == "error":
                    out.append(data)
    return out


async def test_a_stream_that_dies_before_its_first_token_is_sent_again(aiohttp_server, aiohttp_client, tmp_path,
                                                                       caplog):
    caplog.set_level(logging.INFO, "pflash_proxy")
    client, seen = await _proxy(aiohttp_server, aiohttp_client, tmp_path,
                                [[b": keep-alive\n\n", ROLE, "die"], [ROLE, *ANSWER]])
    resp = await client.post("/v1/chat/completions", json=BODY)
    raw = await resp.read()
    assert resp.status == 200 and not _errors(raw), raw
    assert len(seen) == 2 and seen[0] == seen[1]  # the same request, sent again
    assert _events(raw) == [b": keep-alive", ROLE.strip(), *(a.strip() for a in ANSWER)]  # one role chunk
    access = [r for r in caplog.records if r.name == "pflash_proxy.access"]
    assert access[-1].fields["status"] == 200 and access[-1].fields.get("resent") is True


async def test_prompt_progress_passes_at_once_and_the_resend_follows_it(aiohttp_server, aiohttp_client, tmp_path):
    client, seen = await _proxy(aiohttp_server, aiohttp_client, tmp_path, [[PROGRESS, "die"], [PROGRESS, *ANSWER]])
    resp = await client.post("/v1/chat/completions", json=BODY)
    first = await resp.content.readuntil(b"\n\n")
    assert first == PROGRESS  # not held back: a progress event carries nothing of the answer
    raw = first + await resp.read()
    assert not _errors(raw) and len(seen) == 2
    assert b"".join(ANSWER) in raw


async def test_a_translated_stream_sent_again_starts_its_message_once(aiohttp_server, aiohttp_client, tmp_path):
    client, seen = await _proxy(aiohttp_server, aiohttp_client, tmp_path, [[ROLE, "die"], [ROLE, *ANSWER]])
    resp = await client.post("/v1/messages", json={"model": "m", "max_tokens": 8, "stream": True,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    raw = await resp.read()
    assert resp.status == 200 and not _errors(raw), raw
    assert raw.count(b"event: message_start") == 1 and raw.count(b"event: message_stop") == 1
    assert b'"text": "Hel"' in raw and len(seen) == 2


async def test_a_stream_whose_answer_began_is_not_sent_again(aiohttp_server, aiohttp_client, tmp_path):
    client, seen = await _proxy(aiohttp_server, aiohttp_client, tmp_path, [[ROLE, ANSWER[0], "die"], ANSWER])
    resp = await client.post("/v1/chat/completions", json=BODY)
    raw = await resp.read()
    assert len(seen) == 1
    assert [e["error"]["code"] for e in _errors(raw)] == ["upstream_stream_lost"]
    assert raw.count(b'"Hel"') == 1


async def test_a_stream_lost_twice_before_its_answer_is_sent_again_once_only(aiohttp_server, aiohttp_client,
                                                                            tmp_path):
    client, seen = await _proxy(aiohttp_server, aiohttp_client, tmp_path, [[ROLE, "die"], [ROLE, "die"], ANSWER])
    resp = await client.post("/v1/chat/completions", json=BODY)
    raw = await resp.read()
    assert len(seen) == 2
    assert [e["error"]["code"] for e in _errors(raw)] == ["upstream_stream_lost"]
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_an_error_answer_to_the_resend_is_the_streams_error_event(aiohttp_server, aiohttp_client, tmp_path):
    client, seen = await _proxy(aiohttp_server, aiohttp_client, tmp_path, [["die"], "error"])
    resp = await client.post("/v1/chat/completions", json=BODY)
    raw = await resp.read()
    assert resp.status == 200 and len(seen) == 2
    assert [e["error"]["message"] for e in _errors(raw)] == ["bad"]


@pytest.fixture
def doomed_llama(gemma_model, tmp_path):
    """A llama-server of this test's own, to be killed and started again."""
    server = start_llama_server(gemma_model, tmp_path / "doomed", parallel=1, ctx_per_slot=8192)
    yield server
    server.stop()


@pytest.mark.llama
@pytest.mark.timeout(600)
async def test_a_real_llama_server_killed_mid_prefill_after_its_headers_gets_the_stream_sent_again(
        aiohttp_client, doomed_llama, tmp_path, caplog):
    """llama-server answers a stream's headers at once, then prefills (here a ~3,000-token prompt); killed then
    (``kill -9``) and started again, the client still gets its whole answer and no error event."""
    caplog.set_level(logging.INFO, "pflash_proxy")
    settings = make_settings(doomed_llama.url, tmp_path, slot_save_path=doomed_llama.slot_dir, upstream_wait_s=180)
    proxy = await aiohttp_client(create_app(settings))
    text = " ".join(f"item{i} is filed under shelf {i % 7}." for i in range(400))
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 3, "temperature": 0, "stream": True}
    resp = await proxy.post("/v1/chat/completions", json=body)
    assert resp.status == 200  # the headers: llama-server is prefilling now
    await asyncio.get_running_loop().run_in_executor(None, doomed_llama.crash)  # kill -9, start again
    raw = await asyncio.wait_for(resp.read(), 400)
    assert not _errors(raw), raw[-2000:]
    contents = [json.loads(e[5:])["choices"][0]["delta"].get("content") for e in _events(raw)
                if e.startswith(b"data: {") and json.loads(e[5:]).get("choices")]
    assert any(contents) and raw.endswith(b"data: [DONE]\n\n"), raw[-2000:]
    assert any("before the first event of its answer" in r.getMessage() for r in caplog.records), \
        "the stream was not the one sent again (did the first token beat the kill?)"
