"""The spawned server's end-of-turn stops and generation cap (spawn.py, steps 2 and 3): which models get them, and
that a real llama-server started with them ends the bundled model's turn at its ``<|im_end|>`` text and caps an
answer whose request names no limit."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from pflash_proxy.config import Settings, UpstreamOptions
from pflash_proxy.llama.spawn import CHATML_STOPS, ModelFacts, gguf_facts, server_args, turn_cap, turn_flags
from tests.conftest import start_llama_server

BASE = ModelFacts(sliding_window=512, chat_template=False, chatml_end_token=False)  # the bundled gemma-3-270m
STOPS = ["-r", "<|im_end|>", "-r", "<|im_start|>"]


def _settings(tmp_path: Path, **kw) -> UpstreamOptions:
    return Settings(spawn=True, home=tmp_path, **kw).upstream


def test_a_model_without_a_template_or_an_im_end_token_gets_the_chatml_stops_and_the_cap(tmp_path):
    assert turn_flags(_settings(tmp_path), BASE) == [*STOPS, "-n", "256"]
    assert turn_flags(_settings(tmp_path, spawn_max_tokens=64), BASE) == [*STOPS, "-n", "64"]
    assert turn_flags(_settings(tmp_path, spawn_max_tokens=0), BASE) == STOPS  # 0: no cap


def test_a_model_with_its_own_template_or_end_token_gets_neither_unless_asked(tmp_path):
    chat = ModelFacts(chat_template=True, chatml_end_token=True)
    assert turn_flags(_settings(tmp_path), chat) == []
    assert turn_flags(_settings(tmp_path, spawn_max_tokens=512), chat) == ["-n", "512"]
    # no template, but <|im_end|> is a token: llama-server stops at it by itself
    assert turn_flags(_settings(tmp_path), ModelFacts(chatml_end_token=True)) == ["-n", "256"]
    # the user's own template: the ChatML stops no longer describe the model's turns
    for extra in (["--chat-template", "gemma"], ["--chat-template-file=t.jinja"]):
        assert turn_flags(_settings(tmp_path, llama_server_args=extra), BASE) == ["-n", "256"]


def test_only_a_spawned_base_model_has_a_turn_cap_for_the_proxy(tmp_path):
    assert turn_cap(_settings(tmp_path), BASE) == 256
    assert turn_cap(_settings(tmp_path, spawn_max_tokens=64), BASE) == 64
    assert turn_cap(_settings(tmp_path, spawn_max_tokens=0), BASE) == 0  # no cap: no rule
    # a model with its own template ends its turns itself: -n when asked, but never an answer reported as ended
    assert turn_cap(_settings(tmp_path, spawn_max_tokens=512), ModelFacts(chat_template=True)) == 0


def test_the_turn_flags_come_before_the_users_arguments(tmp_path):
    s = _settings(tmp_path, llama_server_args=["-n", "32"])
    args = server_args(s, tmp_path / "slots", Path("/bin/llama-server"), Path("m.gguf"), 9, True, turn_flags(s, BASE))
    assert args[-8:] == [*STOPS, "-n", "256", "-n", "32"]  # llama-server takes the last -n: the user's


@pytest.mark.llama
def test_the_bundled_gguf_reads_as_a_base_model_without_a_chatml_token(gemma_model):
    facts = gguf_facts(gemma_model)
    assert facts == ModelFacts(sliding_window=512, chat_template=False, chatml_end_token=False)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def turned_server(gemma_model, tmp_path_factory):
    s = Settings(spawn=True, home=tmp_path_factory.mktemp("turns"), spawn_max_tokens=12)
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("turns-llama"), parallel=1,
                                extra=turn_flags(s.upstream, gguf_facts(gemma_model)))
    yield server
    server.stop()


@pytest.mark.llama
def test_the_server_stops_at_the_im_end_text_the_model_writes(turned_server):
    # a pattern the model continues greedily with <|im_end|>; the request names no stop: the server's own apply
    d = _post(turned_server.url + "/completion", {"prompt": "A<|im_end|>\nA<|im_end|>\nA<|im_end|>\nA<|im_end|>\nA",
                                                  "temperature": 0, "n_predict": 64})
    assert d["stop_type"] == "word" and d["stopping_word"] in CHATML_STOPS, d
    assert "<|im_end|>" not in d["content"]


@pytest.mark.llama
def test_an_answer_without_a_limit_is_capped_and_one_with_a_limit_keeps_it(turned_server):
    prompt = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,"
    d = _post(turned_server.url + "/completion", {"prompt": prompt, "temperature": 0})
    assert d["stop_type"] == "limit" and d["tokens_predicted"] == 12, d  # the server's -n
    d = _post(turned_server.url + "/completion", {"prompt": prompt, "temperature": 0, "n_predict": 20})
    assert d["tokens_predicted"] > 12  # a request's own limit wins, as in llama-server
