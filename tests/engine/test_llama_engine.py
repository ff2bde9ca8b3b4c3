"""``LlamaServerEngine`` beyond the shared contract: its cache report reads every answer shape llama-server sends
(the engine's own ``cache_report``, which the session layer reads, gives the same report), its identity is the one
the session index stores beside snapshots, and its errors say what happened (a fake upstream for the faults:
refused, unreachable, timed out)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from pflash_proxy.engine import EngineNotReady, EngineRefused, EngineTimeout, EngineUnreachable
from pflash_proxy.errors import UpstreamNotReady, UpstreamTimeout, UpstreamUnavailable
from pflash_proxy.llama.engine import LlamaServerEngine, cache_report, identity_of
from pflash_proxy.llama.spawn import free_port
from pflash_proxy.llama.upstream import Upstream
from pflash_proxy.sessions.liveness import UpstreamWatch
from tests.conftest import make_settings

ANSWERS = [
    {"timings": {"cache_n": 7, "prompt_n": 3, "predicted_n": 1, "prompt_ms": 1.5, "predicted_ms": 0.5}},
    {"timings": {"cache_n": 0, "prompt_n": 40}},  # a stream's last event may carry no predicted_n
    {"usage": {"cache_read_input_tokens": 12, "input_tokens": 4, "output_tokens": 2}},  # Anthropic
    {"type": "message_delta", "message": {"usage": {"cache_read_input_tokens": 5, "input_tokens": 1}}},
    {"response": {"usage": {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 25},
                            "output_tokens": 3}}},  # Responses: input_tokens includes the cached part
    {"usage": {"input_tokens": 2, "input_tokens_details": {"cached_tokens": 9}}},  # never below zero
]


EXPECTED = [(7, 3, 1), (0, 40, 0), (12, 4, 2), (5, 1, 0), (25, 5, 3), (9, 0, 0)]  # cached, new, generated


def test_the_cache_report_reads_every_answer_shape():
    engine = LlamaServerEngine(Upstream("http://127.0.0.1:9"))  # never started: reading an answer calls nothing
    for answer, expected in zip(ANSWERS, EXPECTED, strict=True):
        report = cache_report(answer)
        assert report is not None, answer
        assert (report.cached_tokens, report.new_tokens, report.generated_tokens) == expected, answer
        assert engine.cache_report(answer) == report, answer
    timed = cache_report(ANSWERS[0])
    assert timed is not None and (timed.prompt_ms, timed.generate_ms, timed.prompt_tokens) == (1.5, 0.5, 10)
    # OpenAI usage without timings (a server that drops them): cached_tokens is part of prompt_tokens
    openai = cache_report({"usage": {"prompt_tokens": 50, "completion_tokens": 1,
                                     "prompt_tokens_details": {"cached_tokens": 45}}})
    assert openai is not None and (openai.cached_tokens, openai.new_tokens, openai.generated_tokens) == (45, 5, 1)
    for nothing in (None, {}, {"usage": {"prompt_tokens": 3}}, {"timings": {"cache_n": "x"}}, {"usage": 3}):
        assert cache_report(nothing) is None


def test_one_answer_is_read_once_by_the_stages_that_share_it(monkeypatch):
    """The session stage's headers, the slot table and the savings stage each ask the engine for the turn's cache
    report: one answer is parsed once; another answer (or the next turn's) is parsed anew."""
    import pflash_proxy.llama.engine as llama_engine
    reads: list[object] = []
    monkeypatch.setattr(llama_engine, "cache_report", lambda answer: reads.append(answer) or cache_report(answer))
    engine = LlamaServerEngine(Upstream("http://127.0.0.1:9"))
    first, second = dict(ANSWERS[0]), dict(ANSWERS[2])
    reports = [engine.cache_report(first) for _ in range(3)]
    assert reports[0] is not None and reports[0].cached_tokens == 7 and all(r is reports[0] for r in reports)
    assert len(reads) == 1
    later = engine.cache_report(second)
    assert later is not None and later.cached_tokens == 12 and len(reads) == 2
    assert engine.cache_report(first) == reports[0] and len(reads) == 3  # an earlier answer again: read again
    assert engine.cache_report(None) is None and engine.cache_report(None) is None


def test_the_identity_is_the_one_snapshots_were_stored_with():
    props = {"total_slots": 2, "model_path": "/m/gemma.gguf", "model_alias": "gemma",
             "default_generation_settings": {"n_ctx": 4096}}
    info = identity_of(props)
    assert (info.n_slots, info.n_ctx, info.model) == (2, 4096, "/m/gemma.gguf")
    assert info.identity == identity_of(dict(props)).identity
    assert identity_of({**props, "total_slots": 4}).identity != info.identity


@pytest.mark.llama
async def test_the_identity_matches_the_session_layer_on_a_real_server(llama_server, tmp_path):
    upstream = Upstream(llama_server.url)
    await upstream.start()
    try:
        settings = make_settings(llama_server.url, tmp_path)
        watch = UpstreamWatch(settings.upstream, settings.effective_slot_save_path, LlamaServerEngine(upstream),
                              lambda n: None, lambda r: None)
        await watch.ensure_ready()
        info = await LlamaServerEngine(upstream).describe()
        assert info.identity == watch.model_identity and info.n_slots == watch.n_slots
        assert dict(info.details) == watch.identity_info
    finally:
        await upstream.close()


def _faulty_app() -> web.Application:
    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "tokenizer exploded", "code": 500}}, status=500)

    async def props(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Invalid API Key"}}, status=401)

    async def loading(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Loading model"}}, status=503)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"input_tokens": 1})

    async def slots(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "This server does not support slots action."}}, status=501)

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/props", props)
    app.router.add_get("/health", loading)
    app.router.add_post("/v1/chat/completions/input_tokens", slow)
    app.router.add_post("/slots/{id}", slots)
    app.router.add_get("/slots", slots)
    return app


async def test_an_answer_with_an_error_status_is_refused_not_unreachable(aiohttp_server):
    server = await aiohttp_server(_faulty_app())
    upstream = Upstream(str(server.make_url("")), wait_s=0)
    await upstream.start()
    try:
        engine = LlamaServerEngine(upstream)
        with pytest.raises(EngineRefused) as tok:
            await engine.count_text("hello")
        assert (tok.value.engine_status, tok.value.detail) == (500, "tokenizer exploded")
        assert (tok.value.status, tok.value.code) == (502, "upstream_refused")
        assert not isinstance(tok.value, UpstreamUnavailable)
        with pytest.raises(EngineRefused) as props:
            await engine.describe()
        assert props.value.engine_status == 401 and "Invalid API Key" in props.value.message
        with pytest.raises(EngineRefused) as save:
            await engine.slots.save(0, "a.bin")
        assert save.value.engine_status == 501
        assert await engine.slots.states() is None  # --no-slots: the engine does not report them
        assert await engine.slots.can_save() is False
        assert not await engine.healthy()
    finally:
        await upstream.close()


async def test_a_slow_engine_times_out_and_a_closed_port_is_unreachable(aiohttp_server):
    server = await aiohttp_server(_faulty_app())
    upstream = Upstream(str(server.make_url("")), read_timeout_s=0.2, wait_s=0)
    closed = Upstream(f"http://127.0.0.1:{free_port()}", wait_s=0)
    await upstream.start()
    await closed.start()
    try:
        with pytest.raises(EngineTimeout) as slow:
            await LlamaServerEngine(upstream).count_prompt({"messages": []})
        assert slow.value.status == 504 and isinstance(slow.value, (EngineUnreachable, UpstreamTimeout))
        with pytest.raises(EngineUnreachable) as gone:
            await LlamaServerEngine(closed).count_text("hello")
        # the transport's error classes still catch the seam's: callers migrate one by one
        assert gone.value.status == 502 and isinstance(gone.value, UpstreamUnavailable)
        assert await LlamaServerEngine(closed).slots.can_save() is None
        upstream.set_ready(False, "restarting")
        with pytest.raises(EngineNotReady) as starting:
            await LlamaServerEngine(upstream).count_text("hello")
        assert starting.value.status == 503 and isinstance(starting.value, UpstreamNotReady)
    finally:
        await upstream.close()
        await closed.close()


async def test_reachable_is_false_only_for_an_engine_that_is_gone(aiohttp_server):
    """A shutdown skips its saves only when the server is gone: a refused port or an error status; a health probe
    that gets no answer in time is a loaded machine, still reachable."""
    async def slow_health(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"status": "ok"})

    async def quiet_save(request: web.Request) -> web.Response:
        return web.json_response({"id_slot": 0})  # a server that does not say how many tokens it wrote

    app = web.Application()
    app.router.add_get("/health", slow_health)
    app.router.add_post("/slots/{id}", quiet_save)
    slow = await aiohttp_server(app)
    loading = await aiohttp_server(_faulty_app())
    upstreams = [Upstream(str(slow.make_url("")), wait_s=0), Upstream(str(loading.make_url("")), wait_s=0),
                 Upstream(f"http://127.0.0.1:{free_port()}", wait_s=0)]
    for u in upstreams:
        await u.start()
    try:
        quiet, busy, gone = (LlamaServerEngine(u) for u in upstreams)
        assert await quiet.reachable(0.2)
        assert not await busy.reachable(2) and not await gone.reachable(2)
        assert await quiet.slots.save(0, "a.bin") is None and await quiet.slots.restore(0, "a.bin") is None
    finally:
        for u in upstreams:
            await u.close()


async def test_a_slow_health_probe_is_not_a_restart(aiohttp_server, tmp_path):
    """The health monitor forgets every slot only when the server was gone (refused, or an error status): a probe
    that got no answer in time, then a quick one, is a loaded machine whose slots still hold what they held (was:
    'upstream came back after being unreachable', every session then re-prefilled)."""
    calls = 0

    async def health(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(3)  # past the monitor's 2 s probe
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/health", health)
    server = await aiohttp_server(app)
    upstream = Upstream(str(server.make_url("")), wait_s=0)
    await upstream.start()
    try:
        engine = LlamaServerEngine(upstream)
        reasons: list[str] = []
        settings = make_settings(str(server.make_url("")), tmp_path)
        watch = UpstreamWatch(settings.upstream, settings.effective_slot_save_path, engine, lambda n: None,
                              reasons.append)
        monitor = asyncio.create_task(watch._health_monitor())
        for _ in range(100):  # the slow probe, then at least one quick one
            await asyncio.sleep(0.1)
            if calls >= 3:
                break
        monitor.cancel()
        assert calls >= 3
        assert reasons == [] and upstream.restart_notices == 0 and watch.restarts == 0
    finally:
        await upstream.close()
