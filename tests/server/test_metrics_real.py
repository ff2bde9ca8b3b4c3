"""/pflash/metrics through prometheus_client: counters with _total, histograms, HELP on all, one prefix (issue 14)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pflash_proxy.server.app import create_app
from tests.conftest import make_settings

pytestmark = pytest.mark.llama


async def test_metrics_are_prometheus_with_histograms_and_help(aiohttp_client, llama_server, tmp_path):
    proxy = await aiohttp_client(create_app(make_settings(llama_server.url, tmp_path,
                                                          slot_save_path=llama_server.slot_dir)))
    r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 2})
    assert r.status == 200
    assert (await proxy.get("/v1/models")).status == 200
    m = await proxy.get("/pflash/metrics")
    assert m.status == 200 and m.headers["Content-Type"].startswith("text/plain; version=")
    fams = {f.name: f for f in text_string_to_metric_families(await m.text())}
    for name, fam in fams.items():
        assert name.startswith("pflash_") and not name.startswith("pflash_pflash_"), name
        assert fam.documentation, f"{name} has no HELP"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    assert samples[("pflash_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))] == 1
    assert samples[("pflash_requests_total", (("route", "/v1/models"), ("status", "200")))] == 1
    assert fams["pflash_request_seconds"].type == "histogram"
    assert samples[("pflash_request_seconds_count", (("route", "/v1/chat/completions"),))] == 1
    assert samples[("pflash_upstream_first_byte_seconds_count", (("route", "/v1/chat/completions"),))] == 1
    assert samples[("pflash_queue_wait_seconds_count", ())] >= 1
    assert samples[("pflash_session_turns_total", (("cache", "miss"),))] == 1
    assert fams["pflash_session_turns"].type == "counter"
    assert fams["pflash_snapshot_bytes"].type == "gauge" and samples[("pflash_upstream_ready", ())] == 1


async def test_session_turns_count_a_new_session_that_reused_a_prefix_as_hit_prefix(aiohttp_client, llama_server,
                                                                                     tmp_path):
    """A new session whose opening (a shared system prompt) llama-server found in the slot is ``hit-prefix``, and
    is not counted as a ``miss`` too: the labels add up to the chat turns."""
    import uuid

    proxy = await aiohttp_client(create_app(make_settings(llama_server.url, tmp_path,
                                                          slot_save_path=llama_server.slot_dir)))
    system = f"Policy {uuid.uuid4().hex}: " + " ".join(f"Rule {i}: answer in one short sentence." for i in range(12))
    for question in ("What is rule 3?", "What is rule 7?"):
        r = await proxy.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": system},
                                                                        {"role": "user", "content": question}],
                                                           "max_tokens": 2, "temperature": 0})
        assert r.status == 200, await r.text()
    assert r.headers["X-PFlash-Cache"] == "hit-prefix", dict(r.headers)
    fams = {f.name: f for f in text_string_to_metric_families(await (await proxy.get("/pflash/metrics")).text())}
    turns = {s.labels["cache"]: s.value for s in fams["pflash_session_turns"].samples}
    assert turns == {"hit": 0, "restored": 0, "hit-prefix": 1, "miss": 1}
