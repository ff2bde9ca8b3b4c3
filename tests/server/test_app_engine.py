"""A second engine plugs into the app without editing it: ``create_app(settings, engine=...)`` builds the app on the
in-process ``FakeEngine`` (``engine/fake.py``), and the app serves chat turns through its own stages (sessions,
compression, savings, the commit) with no llama-server. The proxy's own calls (counts, pieces, the cache report,
slot pins, readiness) go to the fake; the client's request still travels through the transport to the address
``--upstream`` names, here a small aiohttp app that answers it from the same fake (``conftest.serve_fake_engine``)."""

from __future__ import annotations

from pflash_proxy.engine.fake import PIN_FIELD, FakeEngine
from pflash_proxy.llama.engine import LlamaServerEngine
from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import ENGINE, UPSTREAM
from tests.conftest import make_settings, serve_fake_engine

LONG = "\n".join(f"line {i}: the build step {i} wrote output file number {i} to the cache" for i in range(400))


def test_the_app_builds_llama_servers_engine_on_its_transport_unless_given_another(tmp_path):
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path))
    assert isinstance(app[ENGINE], LlamaServerEngine)
    fake = FakeEngine()
    handed = []
    app = create_app(make_settings("http://127.0.0.1:9", tmp_path / "b"),
                     engine=lambda transport: handed.append(transport) or fake)
    assert app[ENGINE] is fake and handed == [app[UPSTREAM]]


async def test_the_app_serves_chat_turns_through_its_stages_on_the_fake_engine(aiohttp_client, aiohttp_server,
                                                                                tmp_path):
    slots = tmp_path / "slots"
    slots.mkdir()
    fake = FakeEngine(n_slots=1, save_dir=slots, n_ctx=1 << 16)  # room for the recalled lines of turn 2
    url, received = await serve_fake_engine(aiohttp_server, fake)
    settings = make_settings(url, tmp_path, slot_save_path=slots, threshold=512)
    client = await aiohttp_client(create_app(settings, engine=lambda _transport: fake))

    messages = [{"role": "user", "content": "Run the build."}, {"role": "assistant", "content": "Running it."},
                {"role": "user", "content": LONG}]
    r = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status == 200, await r.text()
    assert r.headers["X-PFlash-Cache"] == "miss" and r.headers["X-PFlash-Mode"] == "compressed"
    sent = received[-1]
    assert sent[PIN_FIELD] == 0 and "id_slot" not in sent  # pinned with the fake's own field
    assert len(str(sent["messages"][2]["content"])) < len(LONG)  # type: ignore[index]
    assert fake.calls["count_prompt"] >= 1 and fake.calls["pieces"] >= 1
    sid = r.headers["X-PFlash-Session"]

    # the next turn continues the served (compressed) history on the slot the fake kept
    follow = [*messages, (await r.json())["choices"][0]["message"], {"role": "user", "content": "Which step failed?"}]
    r = await client.post("/v1/chat/completions", json={"messages": follow, "max_tokens": 1})
    assert r.status == 200, await r.text()
    report = fake.cache_report(await r.json())
    assert report is not None and report.cached_tokens > 0
    assert r.headers["X-PFlash-Session"] == sid and r.headers["X-PFlash-Cache"] == "hit"
    assert r.headers["X-PFlash-Cached-Tokens"] == str(report.cached_tokens)  # the fake's own number

    stats = await (await client.get("/pflash/stats")).json()
    assert stats["upstream"]["url"] == fake.address
    assert stats["sessions"]["hits"] == 1 and stats["sessions"]["misses"] == 1
    assert stats["savings"]["turns"] == 2 and stats["savings"]["cached_tokens"] == report.cached_tokens
    # the savings stage wrote both turn traces to the index through the session service
    detail = await (await client.get(f"/pflash/api/sessions/{sid}")).json()
    assert [t["turn"] for t in detail["turns"]] == [1, 2], detail
    # what the compression and session stages noted on the request's typed fields reaches the turn traces and the
    # metrics: the first turn compressed (its compressor's time), the second recalled the lines its question asks
    # about (no compressor run)
    first, second = detail["turns"]
    assert first["pflash"] == "compressed" and first["compression_ms"] > 0 and first["why"] is None, first
    assert second["pflash"] == "recall" and second["compression_ms"] == 0, second
    assert first["queue_ms"] is not None and second["queue_ms"] is not None
    metrics = await (await client.get("/pflash/metrics")).text()
    assert 'pflash_compression_seconds_count{mode="compressed"} 1.0' in metrics, metrics
    assert "pflash_queue_wait_seconds_count 2.0" in metrics
