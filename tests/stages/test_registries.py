"""The stage list and the scorer registry (``stages/``): one stage order for the app and the bench, and one list
of scorers that ``config``, ``--help`` and ``build_scorer`` all read."""

from __future__ import annotations

import typing

import pytest

from pflash_proxy.cli import build_parser
from pflash_proxy.config import ConfigError, Settings, load_settings
from pflash_proxy.contract import Stage
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.llama.upstream import Upstream
from pflash_proxy.stages import default_stages
from pflash_proxy.stages.scorers import DRAFTER_SCORERS, SCORER_NAMES, SCORERS, build_scorer, drafter_scorer
from tests.conftest import make_settings


def test_config_accepts_exactly_the_registered_scorers():
    assert typing.get_args(Settings.model_fields["scorer"].annotation) == SCORER_NAMES
    assert SCORER_NAMES[0] == "lexical" and "lexical" not in DRAFTER_SCORERS
    assert set(DRAFTER_SCORERS) == {n for n, e in SCORERS.items() if e.drafter}
    with pytest.raises(ConfigError, match="scorer"):
        load_settings({"upstream": "http://127.0.0.1:9", "scorer": "no-such-scorer"}, environ={})


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
    upstream = Upstream("http://127.0.0.1:9")
    names = [s.name for s in default_stages(make_settings("http://127.0.0.1:9", tmp_path), upstream)]
    assert names == ["response-chains", "sessions", "pflash", "savings", "sessions-commit"]
    off = default_stages(make_settings("http://127.0.0.1:9", tmp_path / "b", pflash=False), upstream,
                         extra=[Marker()])
    assert [s.name for s in off] == ["response-chains", "sessions", "savings", "sessions-commit", "marker"]
    assert [s.name for s in default_stages(make_settings("http://127.0.0.1:9", tmp_path / "c", sessions=False),
                                           upstream, extra=[Marker()])] == ["marker"]
    # the stages of one list share one session manager (and its index)
    stages = default_stages(make_settings("http://127.0.0.1:9", tmp_path / "d"), upstream)
    assert len({id(s.manager) for s in stages if hasattr(s, "manager")}) == 1
    for manager in {id(s.manager): s.manager for s in (*stages, *off) if hasattr(s, "manager")}.values():
        manager.store.close()


def test_the_flat_gate_threshold_is_the_scorers_own_unless_one_is_given(tmp_path):
    """No ``--fallback-spread``: the scorer's registry curve; given: that one number at every length."""
    from pflash_proxy.compress.spread import SpreadCurve
    from pflash_proxy.stages.compress import CompressStage

    engine = FakeEngine()
    own = CompressStage(make_settings("http://127.0.0.1:9", tmp_path), engine)
    assert own.csettings.fallback_spread == SpreadCurve.parse(SCORERS["lexical"].spread)
    given = CompressStage(make_settings("http://127.0.0.1:9", tmp_path / "b", fallback_spread=0.11), engine)
    assert given.csettings.fallback_spread == SpreadCurve.parse(0.11)

    class Head:  # a drafter scorer by name: its registry entry's thresholds (the seed's 0.11 for the head)
        name = "head"

    head = CompressStage(make_settings("http://127.0.0.1:9", tmp_path / "c"), engine, scorer=Head())
    assert head.csettings.fallback_spread.at(32768) == 0.11
