"""Agents' dialects end to end: the real ``anthropic`` and ``openai`` SDKs → proxy → real llama-server (gemma).

Claude Code-shaped (Anthropic Messages: ``tool_use`` / ``tool_result`` blocks, a billing line at the top of the
system prompt that changes every request, ``metadata.user_id`` naming the session) and Codex-shaped (Responses:
``function_call`` / ``function_call_output`` items, ``prompt_cache_key``) three-turn agent loops, streaming and
not: the long tool output is compressed on its first appearance, the next turn replays it byte for byte (the
server reuses the whole prompt from its cache), and a question about an omitted function brings it back.
"""

from __future__ import annotations

import inspect
import json
import uuid

import pytest

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings, session_service, start_llama_server

pytestmark = pytest.mark.llama

CURVE = "1000:0.45 4000:0.35"
TOPICS = ["glacier", "violin", "harbour", "orchard", "telescope", "bakery", "railway", "lighthouse", "vineyard",
          "monastery", "observatory", "foundry", "tannery", "apiary", "quarry", "shipyard", "weaving", "pottery",
          "falconry", "brewery", "clockmaking", "cartography", "printing", "glassblowing"]
TASK = "Read inventory.py and tell me what restock_falconry returns."


def inventory_source() -> str:
    """~2.5K tokens of small functions: whole units, each about one topic."""
    out = ["import json", ""]
    for i, t in enumerate(TOPICS):
        out += [f"def restock_{t}(count, shelf):", f"    ledger = load_ledger(\"{t}\")",
                f"    total = count * {i * 3 + 2} + shelf.offset", f"    ledger.append((\"{t}\", total))",
                f"    return total  # the {t} restock total", "", ""]
        out += [f"def audit_{t}(ledger):", f"    seen = [row for row in ledger if row[0] == \"{t}\"]",
                f"    return len(seen) * {i + 11}  # the {t} audit count", "", ""]
    return "\n".join(out)


def billing_line() -> str:  # what Claude Code puts first in its system prompt, different on every request
    return f"x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={uuid.uuid4().hex[:5]};"


def omitted_topic(served_text: str) -> str:
    return next(t for t in TOPICS if f"def audit_{t}(" not in served_text and f"def restock_{t}(" not in served_text)


@pytest.fixture
async def proxy(aiohttp_client, llama_server, tmp_path):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             prefill_curve=CURVE, query_pin=32)
    return await aiohttp_client(create_app(settings))


# Anthropic Messages (Claude Code) ----------------------------------------------------------------------------
async def _messages(client, stream: bool, **kw):
    """One /v1/messages call through the SDK: (headers, text, usage)."""
    args = dict(model="gemma", max_tokens=4, extra_body={"temperature": 0, "top_k": 1}, **kw)
    if not stream:
        raw = await client.messages.with_raw_response.create(**args)
        msg = await raw.parse()
        return raw.headers, "".join(b.text for b in msg.content if b.type == "text"), msg.usage.model_dump()
    raw = await client.messages.with_raw_response.create(stream=True, **args)
    text, usage = "", {}
    async for event in await raw.parse():
        if event.type == "message_start":
            usage.update(event.message.usage.model_dump())
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            text += event.delta.text
        elif event.type == "message_delta":  # the prompt's counts are known at the end of the stream
            usage.update({k: v for k, v in event.usage.model_dump().items() if v is not None})
    return raw.headers, text, usage


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_claude_code_shaped_session_compresses_replays_and_recalls(proxy, stream):
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=str(proxy.make_url("/")), api_key="unused", max_retries=0)
    source = inventory_source()
    meta = {"user_id": f"user_abc_account_1_session_{uuid.uuid4()}"}

    def system():
        return [{"type": "text", "text": billing_line()},
                {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": "Read", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}]
    turn1 = [{"role": "user", "content": TASK}]
    h1, _, _ = await _messages(client, stream, system=system(), messages=turn1, tools=tools, metadata=meta)
    assert h1["X-PFlash-Mode"] == "passthrough"

    # The agent called Read; the tool result (a whole file) comes back with a reminder after it.
    turn2 = turn1 + [
        {"role": "assistant", "content": [{"type": "text", "text": "Reading it."},
                                          {"type": "tool_use", "id": "toolu_01", "name": "Read",
                                           "input": {"file_path": "inventory.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": source},
                                     {"type": "text", "text": "<system-reminder>Be brief.</system-reminder>"}]}]
    h2, text2, usage2 = await _messages(client, stream, system=system(), messages=turn2, tools=tools, metadata=meta)
    assert h2["X-PFlash-Session"] == h1["X-PFlash-Session"] and h2["X-PFlash-Cache"] == "hit"
    assert h2["X-PFlash-Mode"] == "compressed"
    prompt2 = usage2["input_tokens"] + usage2["cache_read_input_tokens"]
    assert prompt2 < int(h2["X-PFlash-Prompt-Tokens"]) * 0.8  # llama-server got the shortened tool result
    record = session_service(proxy.app).view().session(h2["X-PFlash-Session"])
    served_tool = record.served[3]
    assert served_tool["role"] == "tool" and served_tool["tool_call_id"] == "toolu_01"
    served_text = served_tool["content"]
    assert served_text.startswith("[pflash:") and "call the tool again" in served_text
    assert "def restock_falconry(count, shelf):" in served_text
    gone = omitted_topic(served_text)

    # Turn 3: the whole served prompt comes from the cache (the billing line changed again, the tool result is
    # replayed shortened), and a question about an omitted function brings it back.
    turn3 = turn2 + [{"role": "assistant", "content": text2 or "ok"},
                     {"role": "user", "content": f"And what does audit_{gone} count in the {gone} ledger rows?"}]
    h3, _, usage3 = await _messages(client, stream, system=system(), messages=turn3, tools=tools, metadata=meta)
    assert h3["X-PFlash-Session"] == h1["X-PFlash-Session"] and h3["X-PFlash-Cache"] == "hit"
    assert usage3["cache_read_input_tokens"] >= 0.9 * prompt2
    assert h3["X-PFlash-Mode"] == "recall"
    record = session_service(proxy.app).view().session(h3["X-PFlash-Session"])
    assert record.served[3]["content"] == served_text  # replayed as first served
    recalled = record.served[-1]["content"]
    recalled = recalled if isinstance(recalled, str) else recalled[0]["text"]
    assert recalled.startswith("[pflash recall:") and f"def audit_{gone}(ledger):" in recalled


async def test_billing_line_is_dropped_and_only_it(proxy, llama_server):
    """The volatile line never reaches llama-server (two requests differing only in it share one session and
    the cache); with --no-drop-volatile-lines it does, and each request is a new session."""
    async def send(url_proxy, system):
        body = {"model": "gemma", "max_tokens": 2, "temperature": 0, "system": system,
                "messages": [{"role": "user", "content": "Say hi."}]}
        resp = await url_proxy.post("/v1/messages", json=body)
        assert resp.status == 200, await resp.text()
        return resp.headers, await resp.json()

    sys1 = billing_line() + "\nYou are a coding agent."
    sys2 = billing_line() + "\nYou are a coding agent."
    h1, _ = await send(proxy, sys1)
    h2, b2 = await send(proxy, sys2)
    assert h2["X-PFlash-Session"] == h1["X-PFlash-Session"] and h2["X-PFlash-Cache"] == "hit"
    assert b2["usage"]["input_tokens"] <= 2  # everything but the last token came from the cache
    served = session_service(proxy.app).view().session(h2["X-PFlash-Session"]).served
    assert served[0] == {"role": "system", "content": "You are a coding agent."}


async def test_anthropic_errors_come_in_anthropic_shape(proxy):
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=str(proxy.make_url("/")), api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        await client.messages.create(model="gemma", max_tokens=2, messages="not a list")  # type: ignore[arg-type]
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages" in body["error"]["message"]
    resp = await proxy.post("/v1/messages", data=b"{not json")
    assert resp.status == 400 and (await resp.json())["type"] == "error"


# OpenAI Responses (Codex) ------------------------------------------------------------------------------------
async def _parsed(raw):
    """``raw.parse()``: a coroutine in some SDK versions, a plain call in others."""
    out = raw.parse()
    return await out if inspect.isawaitable(out) else out


async def _responses(client, stream: bool, **kw):
    args = dict(model="gemma", max_output_tokens=4, temperature=0, **kw)
    if not stream:
        raw = await client.responses.with_raw_response.create(**args)
        resp = await _parsed(raw)
        return raw.headers, resp.output_text, resp.usage.model_dump()
    raw = await client.responses.with_raw_response.create(stream=True, **args)
    text, usage = "", {}
    async for event in await _parsed(raw):
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.completed":
            usage = event.response.usage.model_dump()
    return raw.headers, text, usage


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_codex_shaped_session_compresses_replays_and_recalls(proxy, stream):
    import openai

    client = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="unused", max_retries=0)
    source = inventory_source()
    key = f"codex-{uuid.uuid4()}"
    tools = [{"type": "function", "name": "shell", "description": "run a command",
              "parameters": {"type": "object",
                             "properties": {"command": {"type": "array", "items": {"type": "string"}}}}}]
    instructions = "You are Codex, a coding agent."
    turn1 = [{"role": "user", "content": [{"type": "input_text", "text": TASK}]}]
    h1, _, _ = await _responses(client, stream, instructions=instructions, input=turn1, tools=tools,
                                prompt_cache_key=key)
    assert h1["X-PFlash-Mode"] == "passthrough"
    turn2 = turn1 + [
        {"type": "function_call", "call_id": "call_1", "name": "shell",
         "arguments": json.dumps({"command": ["cat", "inventory.py"]})},
        {"type": "function_call_output", "call_id": "call_1", "output": source}]
    h2, text2, usage2 = await _responses(client, stream, instructions=instructions, input=turn2, tools=tools,
                                         prompt_cache_key=key)
    assert h2["X-PFlash-Session"] == h1["X-PFlash-Session"] and h2["X-PFlash-Cache"] == "hit"
    assert h2["X-PFlash-Mode"] == "compressed"
    assert usage2["input_tokens"] < int(h2["X-PFlash-Prompt-Tokens"]) * 0.8
    record = session_service(proxy.app).view().session(h2["X-PFlash-Session"])
    served_text = record.served[3]["content"]
    assert record.served[3]["role"] == "tool" and served_text.startswith("[pflash:")
    assert "def restock_falconry(count, shelf):" in served_text
    gone = omitted_topic(served_text)

    # (llama-server needs "type": "message" on an assistant item; Codex sends it)
    reply = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text2 or "ok"}]}
    turn3 = turn2 + [reply,
                     {"role": "user", "content": f"And what does audit_{gone} count in the {gone} ledger rows?"}]
    h3, _, usage3 = await _responses(client, stream, instructions=instructions, input=turn3, tools=tools,
                                     prompt_cache_key=key)
    assert h3["X-PFlash-Session"] == h1["X-PFlash-Session"] and h3["X-PFlash-Cache"] == "hit"
    assert usage3["input_tokens_details"]["cached_tokens"] >= 0.9 * usage2["input_tokens"]
    assert h3["X-PFlash-Mode"] == "recall"
    record = session_service(proxy.app).view().session(h3["X-PFlash-Session"])
    assert record.served[3]["content"] == served_text
    recalled = record.served[-1]["content"]
    recalled = recalled if isinstance(recalled, str) else recalled[0]["text"]
    assert f"def audit_{gone}(ledger):" in recalled


async def test_responses_stream_cut_mid_way_ends_with_a_responses_error_event(aiohttp_client, tmp_path):
    """A fake upstream that dies mid-stream (fault injection): the client gets whole events, then an ``error``
    event in the Responses dialect, which the openai SDK raises as an API error."""
    from aiohttp import web

    async def responses(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'event: response.created\ndata: {"type":"response.created","response":{"id":"r1",'
                         b'"object":"response","status":"in_progress"}}\n\nevent: response.output_text.delta\nda')
        request.transport.close()
        return resp

    fake = web.Application()
    fake.router.add_post("/v1/responses", responses)
    upstream = await aiohttp_client(fake)
    settings = make_settings(str(upstream.make_url("")).rstrip("/"), tmp_path, sessions=False)
    proxy = await aiohttp_client(create_app(settings))
    resp = await proxy.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True})
    text = await resp.text()
    assert text.endswith("\n\n") and "output_text.delta" not in text  # the half event was dropped
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ")
    assert json.loads(last.split("data: ", 1)[1])["type"] == "error"


# One slot, an API key on llama-server -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed_one_slot_server(gemma_model, tmp_path_factory):
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("llama-key"), parallel=1,
                                extra=["--api-key", "sekrit"])
    yield server
    server.stop()


async def test_one_slot_chat_then_messages_then_chat_restores_behind_an_api_key(aiohttp_client, keyed_one_slot_server,
                                                                                  tmp_path):
    """-np 1 and llama-server --api-key: chat session A (compressed: /tokenize and token counts authenticate),
    then an Anthropic session B takes the only slot (A is saved), then A again: restored, never a false hit."""
    server = keyed_one_slot_server
    settings = make_settings(server.url, tmp_path, slot_save_path=server.slot_dir, threshold=1000,
                             prefill_curve=CURVE, query_pin=32, upstream_api_key="sekrit")
    proxy = await aiohttp_client(create_app(settings))
    auth = {"Authorization": "Bearer sekrit"}
    sampling = {"max_tokens": 2, "temperature": 0}
    a1 = [{"role": "user", "content": inventory_source() + "\n\nWhat does restock_falconry return?"}]
    r = await proxy.post("/v1/chat/completions", json={"messages": a1, **sampling}, headers=auth)
    body = await r.json()
    assert r.status == 200, body
    assert r.headers["X-PFlash-Mode"] == "compressed"
    session_a = r.headers["X-PFlash-Session"]

    r = await proxy.post("/v1/messages", json={"model": "g", "messages": [{"role": "user", "content": "Hello B"}],
                                               **sampling}, headers=auth)
    assert r.status == 200, await r.text()
    assert r.headers["X-PFlash-Slot"] == "0" and r.headers["X-PFlash-Session"] != session_a

    a2 = a1 + [body["choices"][0]["message"], {"role": "user", "content": "Thanks."}]
    r = await proxy.post("/v1/chat/completions", json={"messages": a2, **sampling}, headers=auth)
    body2 = await r.json()
    assert r.status == 200, body2
    assert r.headers["X-PFlash-Session"] == session_a and r.headers["X-PFlash-Cache"] == "restored"
    assert body2["timings"]["cache_n"] >= body["usage"]["prompt_tokens"] - 1

    # Without the client's own key llama-server refuses the client's request; the proxy never adds its key.
    r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **sampling})
    assert r.status == 401


async def test_without_the_upstream_key_the_proxy_cannot_start_sessions(aiohttp_client, keyed_one_slot_server,
                                                                       tmp_path):
    """The control: the same set-up without --upstream-api-key fails (the proxy's own /props calls get 401)."""
    server = keyed_one_slot_server
    settings = make_settings(server.url, tmp_path, slot_save_path=server.slot_dir)
    proxy = await aiohttp_client(create_app(settings))
    r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 2}, headers={"Authorization": "Bearer sekrit"})
    assert r.status != 200


async def test_messages_land_on_the_pinned_slot(proxy, llama_server):
    """llama-server's own /v1/messages drops ``id_slot`` (its requests alternate between slots); sent as a chat
    completion, every turn of an Anthropic session runs on the slot the proxy pinned it to."""
    import urllib.request

    def tasks():
        with urllib.request.urlopen(llama_server.url + "/slots", timeout=5) as r:
            return {s["id"]: s.get("id_task") for s in json.load(r)}

    history = [{"role": "user", "content": "Count with me: one."}]
    slots = set()
    for n in ("two", "three", "four"):
        before = tasks()
        resp = await proxy.post("/v1/messages", json={"model": "g", "max_tokens": 2, "messages": history})
        body = await resp.json()
        assert resp.status == 200, body
        slot = int(resp.headers["X-PFlash-Slot"])
        slots.add(slot)
        after = tasks()
        assert after[slot] != before[slot] and all(after[s] == before[s] for s in after if s != slot)
        history = history + [{"role": "assistant", "content": body["content"][0]["text"] if body["content"] else "ok"},
                             {"role": "user", "content": f"{n}."}]
    assert len(slots) == 1


async def test_previous_response_id_chains_continue_the_session(proxy):
    """llama-server refuses previous_response_id; through the proxy a chained request is expanded into the items
    the id stands for and continues that session from the slot's cache."""
    import openai

    client = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="unused", max_retries=0)
    raw = await client.responses.with_raw_response.create(
        model="gemma", max_output_tokens=4, temperature=0, instructions="Be brief.",
        input=[{"role": "user", "content": "Remember the word lighthouse. " * 20}])
    first = await _parsed(raw)
    raw2 = await client.responses.with_raw_response.create(
        model="gemma", max_output_tokens=4, temperature=0, instructions="Be brief.", previous_response_id=first.id,
        input=[{"role": "user", "content": "Which word?"}])
    second = await _parsed(raw2)
    assert raw2.headers["X-PFlash-Session"] == raw.headers["X-PFlash-Session"]
    assert raw2.headers["X-PFlash-Cache"] == "hit"
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    served = session_service(proxy.app).view().session(raw2.headers["X-PFlash-Session"]).served
    assert [m["role"] for m in served] == ["system", "user", "assistant", "user"]
    # a chain of chains
    raw3 = await client.responses.with_raw_response.create(
        model="gemma", max_output_tokens=4, temperature=0, instructions="Be brief.", previous_response_id=second.id,
        input="And again?")
    await _parsed(raw3)
    assert raw3.headers["X-PFlash-Session"] == raw.headers["X-PFlash-Session"]
    assert raw3.headers["X-PFlash-Cache"] == "hit"
    # an id the proxy never saw is llama-server's to answer (it does not support the field)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="gemma", max_output_tokens=2, previous_response_id="resp_unknown",
                                      input="hi")
