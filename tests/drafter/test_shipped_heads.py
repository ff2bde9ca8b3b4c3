"""The gemma drafter's retrieval heads ship with the package: its first start needs no calibration (issue #29)."""

from __future__ import annotations

import json
from types import SimpleNamespace


from pflash_proxy.drafter import calibrate, trained
from pflash_proxy.drafter.hashing import file_sha256


def _no_calibration(*a, **kw):
    raise AssertionError("calibrate() ran although the heads ship with the package")


def test_the_packaged_gemma_set_ships_its_heads(gemma, tmp_path, monkeypatch):
    sha = file_sha256(gemma)
    shipped = trained.attention_heads(sha)
    assert shipped is not None, "drafter/trained/gemma-3-270m-q4_k_m/attention-heads.json is missing"
    got = json.loads(shipped.read_text())
    assert got["drafter_sha256"] == sha and got["version"] == calibrate.VERSION
    assert all(len(h) == 2 for h in got["heads"])
    monkeypatch.setattr(calibrate, "calibrate", _no_calibration)
    scorer = SimpleNamespace(drafter=SimpleNamespace(path=gemma))
    assert calibrate.load_or_calibrate(scorer, tmp_path / "home", sha) == got  # an empty home: the shipped file


def test_another_drafter_still_calibrates_and_a_home_result_comes_first(tmp_path, monkeypatch):
    calls = []

    def fake(scorer, tasks):
        calls.append(1)
        return {"version": calibrate.VERSION, "heads": [[5, 1]], "chosen": ["5.1"], "held_out_mean_rank_selected": 1.0,
                "held_out_mean_rank_all": 2.0, "seconds": 0.0}

    monkeypatch.setattr(calibrate, "calibrate", fake)
    monkeypatch.setattr(calibrate, "calibration_tasks", lambda n, chars: [])
    scorer = SimpleNamespace(drafter=SimpleNamespace(path="other.gguf"))
    first = calibrate.load_or_calibrate(scorer, tmp_path, "0" * 64)
    again = calibrate.load_or_calibrate(scorer, tmp_path, "0" * 64)
    assert calls == [1] and first["heads"] == again["heads"] == [[5, 1]]
    assert trained.attention_heads("0" * 64) is None
