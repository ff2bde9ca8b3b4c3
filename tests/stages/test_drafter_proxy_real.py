"""The drafter stages end to end through the proxy on a real llama-server (gemma-3-270m as target AND drafter)."""

from __future__ import annotations

import pytest

from pflash_proxy.stages.scorers import DrafterSetupError, build_scorer
from pflash_proxy.server.app import create_app
from tests.conftest import make_settings
from tests.stages.test_compress_real import CURVE, ask, document, served_message

pytestmark = [pytest.mark.llama, pytest.mark.drafter]
pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def probe_files(gemma_model, tmp_path_factory):
    from pflash_proxy.drafter.hashing import file_sha256
    from pflash_proxy.drafter.probe_writer import (random_head_weights, random_segment_weights, write_scorer_head,
                                                   write_segment_probe)

    d = tmp_path_factory.mktemp("probes")
    sha = file_sha256(gemma_model)
    seg, head = d / "segment.gguf", d / "head.gguf"
    write_segment_probe(seg, random_segment_weights(640), tap_block=9, drafter_sha256=sha)
    write_scorer_head(head, random_head_weights(640), tap_block=9, drafter_sha256=sha)
    wrong = d / "wrong.gguf"
    write_scorer_head(wrong, random_head_weights(640), tap_block=9)  # the seed's drafter hash, not gemma's
    return {"segment": seg, "head": head, "wrong": wrong}


def drafter_settings(llama_server, tmp_path, gemma_model, **kw):
    return make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                         prefill_curve=CURVE, query_pin=32, drafter=gemma_model, drafter_ctx=4096, **kw)


def seed_calibration(home, gemma_model, heads):
    """A calibration result on disk for gemma, as a first start would leave it (calibration has its own test)."""
    import json

    from pflash_proxy.drafter.calibrate import VERSION, cache_path
    from pflash_proxy.drafter.hashing import file_sha256

    p = cache_path(home, file_sha256(gemma_model))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"version": VERSION, "heads": heads, "chosen": heads}))


@pytest.mark.parametrize("scorer", ["attention", "hybrid", "head-attention"])
async def test_drafter_scorer_keeps_the_needle_through_the_proxy(aiohttp_client, llama_server, tmp_path, gemma_model,
                                                                 scorer):
    settings = drafter_settings(llama_server, tmp_path, gemma_model, scorer=scorer)
    seed_calibration(settings.proxy.home, gemma_model, [[5, 0], [11, 2], [17, 0]])
    proxy = await aiohttp_client(create_app(settings))
    question = "What was the name of the silver eagle, the prize bird?"
    h, body = await ask(proxy, [{"role": "user", "content": document() + "\n\n" + question}])
    assert h["X-PFlash-Mode"] == "compressed"
    assert int(h["X-PFlash-Kept-Tokens"]) < int(h["X-PFlash-Prompt-Tokens"]) * 0.6
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["pflash"]["scorer"] == scorer and stats["pflash"]["drafter"]["passes"] >= 1
    assert stats["pflash"]["attention_heads"] == ["5.0", "11.2", "17.0"]  # read from the calibration cache
    assert "silver eagle named Orrin" in served_message(proxy, h["X-PFlash-Session"], 0)


async def test_probe_segmenter_and_head_scorer_through_the_proxy(aiohttp_client, llama_server, tmp_path,
                                                                 gemma_model, probe_files):
    settings = drafter_settings(llama_server, tmp_path, gemma_model, scorer="head", segmenter="probe",
                                segment_probe=probe_files["segment"], scoring_head=probe_files["head"])
    proxy = await aiohttp_client(create_app(settings))
    h, body = await ask(proxy, [{"role": "user", "content": document() + "\n\nWhich section is about the bakery?"}])
    # Random probe weights: whatever the ranking, the request is answered and the stages ran.
    assert h["X-PFlash-Mode"] in ("compressed", "full-flat", "full-error")
    assert body["choices"][0]["message"]["content"] is not None
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["pflash"]["scorer"] == "head" and stats["pflash"]["drafter"]["passes"] >= 1


def test_mismatched_probe_refuses_to_start_with_both_hashes(tmp_path, gemma_model, probe_files):
    from pflash_proxy.drafter.hashing import file_sha256

    settings = make_settings("http://127.0.0.1:1", tmp_path, drafter=gemma_model, drafter_ctx=1024, scorer="head",
                             scoring_head=probe_files["wrong"])
    with pytest.raises(DrafterSetupError) as exc:
        build_scorer(settings)
    msg = str(exc.value)
    assert "\n" not in msg and file_sha256(gemma_model) in msg
    assert "cedf89af31c9041b601fa58303285bc46d99c51baee1b13f5e919626ca526ee5" in msg


def test_drafter_scorers_need_a_drafter(tmp_path):
    with pytest.raises(DrafterSetupError, match="need --drafter"):
        build_scorer(make_settings("http://127.0.0.1:1", tmp_path, scorer="attention"))
    with pytest.raises(DrafterSetupError, match="drafter: cannot load"):
        build_scorer(make_settings("http://127.0.0.1:1", tmp_path, scorer="attention", drafter=tmp_path / "no.gguf"))


async def test_auto_reads_code_without_the_drafter_and_prose_with_it(aiohttp_client, llama_server, tmp_path,
                                                                      gemma_model):
    """The default with a drafter: a file read (code) is scored by BM25 with no drafter pass and keeps the asked-
    about function; a prose document goes through the drafter (head-attention)."""
    import inspect
    import textwrap

    settings = drafter_settings(llama_server, tmp_path, gemma_model)
    assert settings.compression.scorer == "auto"
    proxy = await aiohttp_client(create_app(settings))
    source = inspect.getsource(textwrap)
    h, _ = await ask(proxy, [{"role": "user", "content": source + "\n\nWhat does indent do with its predicate?"}])
    assert h["X-PFlash-Mode"] == "compressed"
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["pflash"]["scorer"] == "auto" and stats["pflash"]["drafter"]["passes"] == 0
    assert inspect.getsource(textwrap.indent).rstrip("\n") in served_message(proxy, h["X-PFlash-Session"], 0)
    h, _ = await ask(proxy, [{"role": "user", "content": document() + "\n\nWhat was the name of the silver eagle, "
                                                        "the prize bird?"}])
    assert h["X-PFlash-Mode"] == "compressed"
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["pflash"]["drafter"]["passes"] >= 1


def test_the_default_scorer_falls_back_to_attention_for_a_drafter_without_a_trained_head(tmp_path, gemma_model,
                                                                                          monkeypatch, caplog):
    import pflash_proxy.drafter.trained as trained
    from pflash_proxy.compress.links import Linked

    settings = make_settings("http://127.0.0.1:1", tmp_path, drafter=gemma_model, drafter_ctx=1024,
                             attention_heads="all")
    assert settings.compression.scorer == "auto"  # no --scorer: code by lexical, the rest by head-attention
    built = build_scorer(settings)  # gemma: the head shipped in the package
    try:
        assert built.scorer.name == "auto" and built.scorer.code.name == "lexical"
        assert built.scorer.other.name == "head-attention" and isinstance(built.scorer.other, Linked)  # hops
    finally:
        built.close()
    monkeypatch.setattr(trained, "for_drafter", lambda sha: None)  # a drafter nobody has trained a head for
    with caplog.at_level("WARNING", logger="pflash_proxy.drafter"):
        built = build_scorer(settings)
    try:
        assert built.scorer.name == "attention" and "pflash-proxy train --drafter" in caplog.text
        assert isinstance(built.scorer, Linked)
    finally:
        built.close()
    explicit = make_settings("http://127.0.0.1:1", tmp_path, drafter=gemma_model, drafter_ctx=1024,
                             attention_heads="all", scorer="head-attention")
    with pytest.raises(DrafterSetupError, match="needs --scoring-head"):  # asked for by name: no substitute
        build_scorer(explicit)


def test_the_bench_and_the_proxy_build_drafter_scorers_in_one_place(monkeypatch, tmp_path):
    # bench quality's rows are registry entries built through ScorerKit, the proxy's own parts loader: what it
    # measures is what --scorer NAME serves
    import pflash_proxy.bench.quality as quality
    import pflash_proxy.stages.scorers as setup
    from pflash_proxy.compress import LexicalScorer
    from pflash_proxy.compress.links import Linked

    made = []
    monkeypatch.setenv("PFLASH_HOME", str(tmp_path))
    monkeypatch.setattr(setup.ScorerKit, "scorer", lambda self, name, heads=None: made.append((name, heads)) or name)
    monkeypatch.setattr("pflash_proxy.drafter.runtime.Drafter", lambda *a, **k: object())
    opts = type("Opts", (), {"drafter": "d.gguf", "lengths": [1024], "scoring_head": None})()
    got = quality.build_scorers(["lexical", "attention", "hybrid", "attention-all", "nope"], opts)
    assert isinstance(got.pop("lexical"), LexicalScorer) and got.pop("nope").startswith("unknown scorer")
    assert got == {"attention": "attention", "hybrid": "hybrid", "attention-all": "attention"}
    assert made == [("attention", None), ("hybrid", None), ("attention", "all")]
    monkeypatch.undo()

    class Attention:  # a stand-in for the loaded attention scorer
        name = "attention"

    hybrid = setup.drafter_scorer("hybrid", Attention())
    assert isinstance(hybrid, Linked) and hybrid.name == "hybrid"
    with pytest.raises(ValueError, match="not a drafter scorer"):
        setup.drafter_scorer("lexical", None)


@pytest.mark.timeout(900)  # two proxies, a drafter pass each, on two shared cores
@pytest.mark.parametrize("first,then", [("lexical", "hybrid"), ("hybrid", "lexical")])
async def test_a_session_stays_recallable_after_the_scorer_changes(aiohttp_client, llama_server, tmp_path,
                                                                   gemma_model, first, then):
    """A conversation compressed under one ``--scorer``, continued after a restart under another: the recall
    follow-up is scored by the new scorer from the stored text (the old reps are another scorer's payload)."""
    from tests.stages.test_compress_real import TOPICS

    settings = drafter_settings(llama_server, tmp_path, gemma_model, scorer=first)
    seed_calibration(settings.proxy.home, gemma_model, [[5, 0], [11, 2], [17, 0]])
    proxy = await aiohttp_client(create_app(settings))
    turn1 = [{"role": "user", "content": document() + "\n\nWhat was the name of the silver eagle, the prize bird?"}]
    h, body = await ask(proxy, turn1)
    assert h["X-PFlash-Mode"] == "compressed"
    served = served_message(proxy, h["X-PFlash-Session"], 0)
    await proxy.close()  # the session index stays in --home

    proxy = await aiohttp_client(create_app(drafter_settings(llama_server, tmp_path, gemma_model, scorer=then)))
    omitted = next(t for t in TOPICS if f"the {t} records list" not in served)
    turn2 = turn1 + [body["choices"][0]["message"],
                     {"role": "user", "content": f"What about the {omitted} keepers and their {omitted} ledgers?"}]
    h2, _ = await ask(proxy, turn2)
    assert h2["X-PFlash-Session"] == h["X-PFlash-Session"]
    assert h2["X-PFlash-Mode"] == "recall"
    assert f"the {omitted} records list" in served_message(proxy, h["X-PFlash-Session"], 2)
    stats = await (await proxy.get("/pflash/stats")).json()
    assert stats["pflash"]["scorer"] == then
