"""The stage list and the scorer registry (``stages/``): one stage order for the app and the bench, and one list
of scorers that ``--scorer``'s choices, ``--help``, the stages' start-up check and ``build_scorer`` all read."""

from __future__ import annotations

import pytest

from pflash_proxy.cli import build_parser, main
from pflash_proxy.config import load_settings
from pflash_proxy.contract import Stage
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.llama.engine import LlamaServerEngine
from pflash_proxy.llama.upstream import Upstream
from pflash_proxy.sessions.index.sqlite import SqliteIndex
from pflash_proxy.stages import default_stages
from pflash_proxy.stages.scorers import (DRAFTER_SCORERS, SCORER_NAMES, SCORERS, DrafterSetupError, build_scorer,
                                         drafter_scorer)
from tests.conftest import make_settings


def test_exactly_the_registered_scorers_are_accepted(tmp_path, capsys, monkeypatch):
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    assert tuple(next(a for a in serve._actions if a.dest == "scorer").choices) == SCORER_NAMES
    assert SCORER_NAMES[0] == "lexical" and "lexical" not in DRAFTER_SCORERS
    assert set(DRAFTER_SCORERS) == {n for n, e in SCORERS.items() if e.needs.drafter}
    # the configuration layer sits below the registry: a name from the environment or a file is checked when the
    # stages are built (start-up), with one line naming the option; sessions or compression off change nothing
    settings = load_settings({"upstream": "http://127.0.0.1:9", "home": str(tmp_path)},
                             environ={"PFLASH_SCORER": "nope"})
    for off in ({}, {"pflash": False}, {"sessions": False}):
        with pytest.raises(DrafterSetupError, match="^scorer: unknown scorer 'nope' \\(one of lexical, "):
            default_stages(settings.with_options(**off), LlamaServerEngine(Upstream("http://127.0.0.1:9")))
    # serve stops before it listens or spawns anything: exit 2 and that one line
    monkeypatch.setenv("PFLASH_SCORER", "nope")
    assert main(["serve", "--upstream", "http://127.0.0.1:9", "--home", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("pflash-proxy: invalid configuration: scorer: unknown scorer 'nope' "
                                               f"(one of {', '.join(SCORER_NAMES)})")


def test_help_names_every_registered_scorer():
    serve = next(a for a in build_parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith("serve"))
    text = " ".join(serve.format_help().split())
    for name, entry in SCORERS.items():
        assert name in text and " ".join(entry.help.split()) in text


def test_drafter_scorer_refuses_a_model_free_or_unknown_name():
    for name in ("lexical", "nope"):
        with pytest.raises(ValueError, match="not a drafter scorer"):
            drafter_scorer(name, None)


def test_the_model_free_default_builds_without_a_drafter(tmp_path):
    built = build_scorer(make_settings("http://127.0.0.1:9", tmp_path))
    assert built.scorer is None and built.segmenter is None and built.drafter is None
    assert built.describe() == {"segmenter": "heuristic", "scorer": "lexical"}


class Marker(Stage):
    name = "marker"


def test_default_stages_writes_the_order_once(tmp_path):
    engine = LlamaServerEngine(Upstream("http://127.0.0.1:9"))
    names = [s.name for s in default_stages(make_settings("http://127.0.0.1:9", tmp_path), engine)]
    assert names == ["response-chains", "sessions", "pflash", "savings", "sessions-commit"]
    off_index = SqliteIndex(tmp_path / "b" / "index")
    off = default_stages(make_settings("http://127.0.0.1:9", tmp_path / "b", pflash=False), engine,
                         extra=[Marker()], index=off_index)
    assert [s.name for s in off] == ["response-chains", "sessions", "savings", "sessions-commit", "marker"]
    assert [s.name for s in default_stages(make_settings("http://127.0.0.1:9", tmp_path / "c", sessions=False),
                                           engine, extra=[Marker()])] == ["marker"]
    # the stages of one list share one session service (one index: the one it is handed here, closed below); the
    # commit stage calls the turn the session stage began, not the service
    index = SqliteIndex(tmp_path / "d" / "index")
    stages = default_stages(make_settings("http://127.0.0.1:9", tmp_path / "d"), engine, index=index)
    assert [s.name for s in stages if hasattr(s, "sessions")] == ["response-chains", "sessions", "savings"]
    assert len({id(s.sessions) for s in stages if hasattr(s, "sessions")}) == 1
    index.close()
    off_index.close()


def test_the_flat_gate_threshold_is_the_scorers_own_unless_one_is_given(tmp_path):
    """No ``--fallback-spread``: the scorer's registry curve; given: that one number at every length."""
    from pflash_proxy.compress.spread import SpreadCurve
    from pflash_proxy.stages.compress import CompressStage

    engine = FakeEngine()
    own = CompressStage(make_settings("http://127.0.0.1:9", tmp_path).compression, engine)
    assert own.compressor.settings.fallback_spread == SpreadCurve.parse(SCORERS["lexical"].spread)
    given = CompressStage(make_settings("http://127.0.0.1:9", tmp_path / "b", fallback_spread=0.11).compression,
                          engine)
    assert given.compressor.settings.fallback_spread == SpreadCurve.parse(0.11)

    class Head:  # a drafter scorer by name: its registry entry's thresholds
        name = "head"

    head = CompressStage(make_settings("http://127.0.0.1:9", tmp_path / "c").compression, engine, scorer=Head())
    assert head.compressor.settings.fallback_spread == SpreadCurve.parse(SCORERS["head"].spread)

    class PlugIn:  # a scorer the registry does not know: the seed's 0.11
        name = "plug-in"

    plug = CompressStage(make_settings("http://127.0.0.1:9", tmp_path / "e").compression, engine, scorer=PlugIn())
    assert plug.compressor.settings.fallback_spread.at(32768) == 0.11
    assert not hasattr(head, "csettings")  # one copy of the options: the stage's group, the compressor's form of it


def test_no_sessions_means_no_compression_either_and_says_so(tmp_path, caplog):
    """``--no-sessions`` forwards requests as they are: compression needs the session's served history (which
    message is new, what the slot holds), so it is off too, and start-up, ``--help`` and the reference's option
    table say so."""
    import logging
    from pathlib import Path

    engine = LlamaServerEngine(Upstream("http://127.0.0.1:9"))
    with caplog.at_level(logging.INFO, logger="pflash_proxy"):
        assert default_stages(make_settings("http://127.0.0.1:9", tmp_path, sessions=False), engine) == []
    assert "--no-sessions: requests are forwarded as they are, without compression or recall" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pflash_proxy"):
        default_stages(make_settings("http://127.0.0.1:9", tmp_path, sessions=False, pflash=False), engine)
    assert "--no-sessions" not in caplog.text  # nothing to say: compression was asked off as well
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    text = " ".join(next(a for a in serve._actions if a.dest == "sessions").help.split())
    assert "--no-sessions forwards requests as they are" in text and "no compression or recall either" in text
    reference = (Path(__file__).parents[2] / "docs" / "reference.md").read_text().splitlines()
    rows = [line for line in reference if line.startswith("| `--sessions`, `--no-sessions`")]
    assert len(rows) == 1 and "--no-sessions forwards requests as they are: no slot pinning, snapshots or history, " \
                              "and so no compression or recall either" in rows[0]
