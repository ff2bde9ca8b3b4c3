"""Configuration precedence and one-line errors."""

from __future__ import annotations

from pathlib import Path

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
    assert s.proxy.port == 3333 and s.compression.threshold == 8 and s.proxy.host == "0.0.0.0"
    assert s.upstream.url == "http://file:1"
    s = load_settings({}, environ=env, config_file=f)
    assert s.proxy.port == 2222


def test_seed_variable_names_are_accepted(tmp_path):
    env = {"PFLASH_UPSTREAM": "http://x:1", "PFLASH_FALLBACK_SPREAD": "0.2", "PFLASH_QUERY_PIN": "64",
           "PFLASH_CHAT_RECALL": "0.05", "PFLASH_SEGMENT_PROBE_GGUF": "/p.gguf"}
    s = load_settings({}, environ=env)
    c = s.compression
    assert c.fallback_spread == 0.2 and c.query_pin == 64 and c.theta == 0.05 and c.chat_recall
    assert str(s.drafter.segment_probe) == "/p.gguf"
    assert not load_settings({}, environ={**env, "PFLASH_CHAT_RECALL": "0"}).compression.chat_recall


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
    assert load_settings({"upstream": "http://x:1"}, environ={"PFLASH_HOME": str(tmp_path / "b")}).proxy.home \
        == tmp_path / "b"


def test_example_config_file_is_valid():
    from pathlib import Path

    s = load_settings({}, environ={}, config_file=Path(__file__).parent.parent / "configs" / "pflash-proxy.toml")
    assert s.compression.threshold == 16384 and s.compression.prefill_curve.startswith("16384:0.315")


def test_attention_heads_accept_auto_all_and_layer_head_pairs():
    from pflash_proxy.config import parse_heads
    base = {"upstream": "http://x:1"}
    assert load_settings(base, environ={}).drafter.attention_heads == "auto"
    assert load_settings({**base, "attention_heads": "ALL"}, environ={}).drafter.attention_heads == "all"
    assert parse_heads(load_settings({**base, "attention_heads": "5.0, 11.2"}, environ={}).drafter.attention_heads) \
        == [(5, 0), (11, 2)]


def test_a_drafter_without_a_scorer_gets_the_benchs_winner(tmp_path):
    from pflash_proxy.config import DRAFTER_DEFAULT_SCORER
    base = {"upstream": "http://x:1"}
    def scorer(cli, env):
        return load_settings({**base, **cli}, environ=env).compression.scorer

    assert scorer({}, {}) == "lexical"
    assert scorer({"drafter": "/d.gguf"}, {}) == DRAFTER_DEFAULT_SCORER
    assert scorer({"drafter": "/d.gguf"}, {"PFLASH_SCORER": "lexical"}) == "lexical"
    assert scorer({"drafter": "/d.gguf", "scorer": "attention"}, {}) == "attention"


def test_state_directories_are_created_or_tightened_to_0700(tmp_path):
    """Issue #13 item 10: mkdir(mode=0o700) left an existing 0755 state directory readable by everyone."""
    import os

    from pflash_proxy.config import private_dir
    from pflash_proxy.sessions.index.sqlite import SqliteIndex
    fresh = private_dir(tmp_path / "a" / "b")
    assert fresh.stat().st_mode & 0o777 == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    SqliteIndex(old).close()  # the index directory, as a user's existing state directory
    assert old.stat().st_mode & 0o777 == 0o700


def test_the_documented_toml_names_every_setting():
    import re
    from pathlib import Path

    from pflash_proxy.config import OPTIONS

    text = (Path(__file__).parent.parent / "configs" / "pflash-proxy.toml").read_text()
    named = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, re.M)) | set(re.findall(r"([a-z_]+)(?= /| ?:)", text))
    assert set(OPTIONS) <= named, sorted(set(OPTIONS) - named)


def test_settings_are_grouped_by_concern_and_built_from_option_names_too(tmp_path):
    from pflash_proxy.config import GROUPS, OPTIONS, CompressionOptions, Settings

    s = Settings(upstream="http://x:1", threshold=7, drafter=tmp_path / "d.gguf", sessions=False, max_queue=3)
    assert s.upstream.url == "http://x:1" and s.compression.threshold == 7 and s.drafter.path == tmp_path / "d.gguf"
    assert not s.sessions.enabled and s.limits.max_queue == 3
    assert list(GROUPS) == ["proxy", "upstream", "sessions", "compression", "drafter", "limits", "cluster",
                            "inspector"]
    assert {o.group for o in OPTIONS.values()} == set(GROUPS)
    assert sum(len(m.model_fields) for m in GROUPS.values()) == len(OPTIONS)  # each option in one group, once
    # a group given whole, with its options given flat on top; the group object given is not changed
    given = CompressionOptions(threshold=9, theta=0.5)
    s = Settings(upstream="http://x:1", compression=given, threshold=11, drafter="/d.gguf")
    assert (s.compression.threshold, s.compression.theta, s.compression.scorer) == (11, 0.5, "auto")
    assert (given.threshold, given.scorer) == (9, "lexical")
    # a copy with options replaced is validated again; a drafter's default scorer stays a default
    copy = s.with_options(port=5)
    assert copy.proxy.port == 5 and copy.compression.scorer == "auto" and "scorer" not in \
        copy.compression.model_fields_set
    assert s.with_options(scorer="lexical").compression.scorer == "lexical"
    with pytest.raises(ValueError, match="threshold"):
        s.with_options(threshold=0)


def test_an_invalid_option_inside_a_group_is_named_by_its_option(tmp_path):
    for cli, needle in (({"threshold": "0"}, "threshold (from --threshold)"),
                        ({"min_segment": "600"}, "min_segment (from --min-segment): must be smaller than max_segment"),
                        ({"public_host": ["http://x"]}, "public_host (from --public-host)"),
                        ({"port": "0", "host": "127.0.0.1,::1"}, "port (from --port): --port 0 is not supported")):
        with pytest.raises(ConfigError) as exc:
            load_settings({"upstream": "http://x:1", **cli}, environ={})
        assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_the_removed_cold_history_is_gone_from_flags_and_env_and_ignored_in_a_file(tmp_path, capsys):
    from pflash_proxy.config import OPTIONS, SEED_ENV_ALIASES

    assert "cold_history" not in OPTIONS and "PFLASH_COLD_HISTORY" not in SEED_ENV_ALIASES
    f = write(tmp_path, 'upstream = "http://x:1"\n[compression]\ncold_history = "raw"\n')
    assert load_settings({}, environ={}, config_file=f).upstream.url == "http://x:1"
    assert "ignoring cold_history" in capsys.readouterr().err
    load_settings({"upstream": "http://x:1"}, environ={"PFLASH_COLD_HISTORY": "raw"})
    assert "unknown environment variable PFLASH_COLD_HISTORY" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[1]


def test_every_option_has_one_description_and_no_default_written_into_it():
    """The description says what the option does; its default is the field's (or ``_shown``'s words), added by
    whatever shows it (``cli.options``), so it is written once."""
    import re

    from pflash_proxy.config import OPTIONS

    for name, option in OPTIONS.items():
        text = option.info.description or ""
        assert len(text.split()) >= 3, name
        assert not re.search(r"\bdefault\b", text), (name, text)


def test_the_toml_example_and_the_reference_table_are_what_the_model_makes():
    """configs/pflash-proxy.toml and the options table of docs/reference.md are generated from the settings model
    (``pflash-proxy options --write .`` rewrites both); an option edited in one place only fails here."""
    from pflash_proxy.cli import options

    assert (ROOT / options.TOML_PATH).read_text() == options.toml_example()
    doc = (ROOT / options.DOC_PATH).read_text()
    assert options.splice(doc, options.markdown_table()) == doc


def test_the_toml_example_sets_every_default_it_names():
    """Each key the example sets (not commented out) holds the option's default; ``upstream``, which it needs to
    load, its example."""
    import tomllib

    from pflash_proxy.cli.options import default_value
    from pflash_proxy.config import OPTIONS, _flatten_toml

    given = _flatten_toml(tomllib.loads((ROOT / "configs" / "pflash-proxy.toml").read_text()))
    assert given["upstream"] == "http://127.0.0.1:8080" and len(given) > 40
    for name, value in given.items():
        if name != "upstream":
            assert value == default_value(OPTIONS[name]), name


def test_the_options_command_prints_and_rewrites_both_files(tmp_path, capsys):
    from pflash_proxy.cli import main, options

    assert main(["options", "--format", "markdown"]) == 0
    assert capsys.readouterr().out == options.markdown_table() + "\n"
    assert main(["options"]) == 0
    assert capsys.readouterr().out == options.toml_example()
    (tmp_path / "configs").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "configs" / "pflash-proxy.toml").write_text("stale\n")
    (tmp_path / "docs" / "reference.md").write_text(f"# Reference\n\n{options.TABLE_BEGIN}\nstale\n{options.TABLE_END}\n\nrest\n")
    assert main(["options", "--write", str(tmp_path)]) == 0
    assert (tmp_path / "configs" / "pflash-proxy.toml").read_text() == options.toml_example()
    assert (tmp_path / "docs" / "reference.md").read_text() == \
        f"# Reference\n\n{options.markdown_table()}\n\nrest\n"


def test_a_help_text_shows_the_default_once():
    from pflash_proxy.cli.options import option_help

    assert option_help("threshold").endswith("(default 16384)")
    assert option_help("sessions").endswith("(flag; default on)")
    assert option_help("home").endswith("(default: $PFLASH_HOME or ~/.local/state/pflash-proxy)")
    assert option_help("upstream_timeout_s").endswith("(default 600)")
    assert option_help("cluster_peers").endswith("(default none)")
