"""Configuration precedence and one-line errors."""

from __future__ import annotations

import pytest

from pflash_proxy.config import ConfigError, load_settings, state_home


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_precedence_cli_over_env_over_file(tmp_path):
    f = write(tmp_path, 'upstream = "http://file:1"\n[proxy]\nport = 1111\nhost = "0.0.0.0"\n[compression]\nthreshold = 7\n')
    env = {"PFLASH_PORT": "2222", "PFLASH_THRESHOLD": "8"}
    s = load_settings({"port": "3333"}, environ=env, config_file=f)
    assert s.port == 3333 and s.threshold == 8 and s.host == "0.0.0.0" and s.upstream == "http://file:1"
    s = load_settings({}, environ=env, config_file=f)
    assert s.port == 2222


def test_seed_variable_names_are_accepted(tmp_path):
    env = {"PFLASH_UPSTREAM": "http://x:1", "PFLASH_FALLBACK_SPREAD": "0.2", "PFLASH_QUERY_PIN": "64",
           "PFLASH_CHAT_RECALL": "0.05", "PFLASH_SEGMENT_PROBE_GGUF": "/p.gguf"}
    s = load_settings({}, environ=env)
    assert s.fallback_spread == 0.2 and s.query_pin == 64 and s.theta == 0.05 and s.chat_recall
    assert str(s.segment_probe) == "/p.gguf"
    assert not load_settings({}, environ={**env, "PFLASH_CHAT_RECALL": "0"}).chat_recall


@pytest.mark.parametrize("cli,env,needle", [
    ({"port": "x"}, {}, "port (from --port)"),
    ({}, {"PFLASH_MAX_BODY_MB": "-1"}, "max_body_mb (from PFLASH_MAX_BODY_MB)"),
    ({"prefill_curve": "16384:0.3 1000:0.2"}, {}, "prefill_curve"),
    ({"upstream": "localhost:8080"}, {}, "upstream (from --upstream): must be an http"),
    ({"upstream": None}, {}, "upstream: give --upstream URL or --spawn"),
    ({"attention_heads": "5,11"}, {}, "attention_heads (from --attention-heads): expected 'auto', 'all' or LAYER"),
    ({}, {"PFLASH_ATTENTION_HEADS": "5.-1"}, "attention_heads (from PFLASH_ATTENTION_HEADS)"),
])
def test_invalid_values_name_the_option(cli, env, needle):
    cli = {"upstream": "http://x:1", **cli}
    with pytest.raises(ConfigError) as exc:
        load_settings(cli, environ=env)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_unknown_key_in_file_is_rejected(tmp_path):
    f = write(tmp_path, 'upstream = "http://x:1"\nthresold = 5\n')
    with pytest.raises(ConfigError, match="thresold: unknown option"):
        load_settings({}, environ={}, config_file=f)


def test_state_home_follows_env_at_call_time(monkeypatch, tmp_path):
    monkeypatch.setenv("PFLASH_HOME", str(tmp_path / "a"))
    assert state_home() == tmp_path / "a"
    monkeypatch.setenv("PFLASH_HOME", str(tmp_path / "b"))
    assert load_settings({"upstream": "http://x:1"}, environ={"PFLASH_HOME": str(tmp_path / "b")}).home == tmp_path / "b"


def test_example_config_file_is_valid():
    from pathlib import Path

    s = load_settings({}, environ={}, config_file=Path(__file__).parent.parent / "configs" / "pflash-proxy.toml")
    assert s.threshold == 16384 and s.prefill_curve.startswith("16384:0.315")


def test_attention_heads_accept_auto_all_and_layer_head_pairs():
    from pflash_proxy.config import parse_heads
    base = {"upstream": "http://x:1"}
    assert load_settings(base, environ={}).attention_heads == "auto"
    assert load_settings({**base, "attention_heads": "ALL"}, environ={}).attention_heads == "all"
    assert parse_heads(load_settings({**base, "attention_heads": "5.0, 11.2"}, environ={}).attention_heads) \
        == [(5, 0), (11, 2)]


def test_a_drafter_without_a_scorer_gets_the_benchs_winner(tmp_path):
    from pflash_proxy.config import DRAFTER_DEFAULT_SCORER
    base = {"upstream": "http://x:1"}
    assert load_settings(base, environ={}).scorer == "lexical"
    assert load_settings({**base, "drafter": "/d.gguf"}, environ={}).scorer == DRAFTER_DEFAULT_SCORER
    assert load_settings({**base, "drafter": "/d.gguf"}, environ={"PFLASH_SCORER": "lexical"}).scorer == "lexical"
    assert load_settings({**base, "drafter": "/d.gguf", "scorer": "attention"}, environ={}).scorer == "attention"


def test_state_directories_are_created_or_tightened_to_0700(tmp_path):
    """Issue #13 item 10: mkdir(mode=0o700) left an existing 0755 state directory readable by everyone."""
    import os

    from pflash_proxy.config import private_dir
    from pflash_proxy.sessions.store import SessionStore
    fresh = private_dir(tmp_path / "a" / "b")
    assert fresh.stat().st_mode & 0o777 == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    SessionStore(old).close()  # the index directory, as a user's existing state directory
    assert old.stat().st_mode & 0o777 == 0o700


def test_the_documented_toml_names_every_setting():
    import re
    from pathlib import Path

    from pflash_proxy.config import Settings

    text = (Path(__file__).parent.parent / "configs" / "pflash-proxy.toml").read_text()
    named = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, re.M)) | set(re.findall(r"([a-z_]+)(?= /| ?:)", text))
    assert set(Settings.model_fields) <= named, sorted(set(Settings.model_fields) - named)
