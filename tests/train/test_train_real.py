"""``pflash-proxy train`` end to end on gemma-3-270m, tiny: files the proxy loads, metrics, resume, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pflash_proxy.drafter.probes import load_request_probe, load_scorer_head, load_segment_probe

TINY = ["--examples", "14", "--epochs", "1", "--head-epochs", "2", "--min-chars", "1200", "--max-chars", "2000",
        "--ctx", "2048"]


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pflash_proxy.cli", "train", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(gemma, tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    r = _train("--drafter", gemma, "--out", str(out), *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    return out, r


def test_train_writes_three_files_the_proxy_loads(gemma, trained):
    out, r = trained
    seg = load_segment_probe(out / "segment-probe.gguf", gemma)  # checks the drafter's sha256 too
    req = load_request_probe(out / "request-probe.gguf", gemma)
    head = load_scorer_head(out / "scorer-head.gguf", gemma)
    assert seg.meta.tap_block == req.meta.tap_block == head.meta.tap_block == 10  # 7/12 of gemma's 18 blocks
    assert head.rank == 64 and round(seg.threshold, 3) in (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
    assert "pflash-proxy train --examples 14" in str(seg.meta.extra.get("trained_by"))
    m = json.loads((out / "metrics.json").read_text())
    assert m == json.loads(r.stdout)
    assert m["examples"]["train"] + m["examples"]["held_out"] == 14 and m["examples"]["held_out"] > 0
    for row in ("probe", "heuristic"):
        assert 0 <= m["boundary"][row]["f1"] <= 1
    assert 0 <= m["request_span"]["f1"] <= 1
    total = m["gold_kept_at_budget"]["all"]
    assert 0 <= total["head"] <= total["questions"] and 0 <= total["lexical"] <= total["questions"]
    assert "read" in r.stderr and "head" in r.stderr  # progress lines


def test_train_resumes_from_its_cache(gemma, trained):
    out, _ = trained
    cache = next((out / "cache").glob("*-b10-*"))
    files = sorted(cache.glob("*.npz"))
    assert len(files) == 14
    victim = files[5]
    before = {p.name: p.stat().st_mtime_ns for p in files if p != victim}
    victim.unlink()  # as if the run had been killed while reading example 5
    r = _train("--drafter", gemma, "--out", str(out), *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    assert victim.exists()
    assert {p.name: p.stat().st_mtime_ns for p in sorted(cache.glob("*.npz")) if p != victim} == before


def test_trained_probes_run_in_the_proxy_stages(gemma, trained, tmp_path):
    from pflash_proxy.compress.text import TokenizedText
    from pflash_proxy.config import Settings
    from pflash_proxy.stages.scorers import build_scorer

    out, _ = trained
    settings = Settings(upstream="http://127.0.0.1:9", home=tmp_path / "home", drafter=Path(gemma),
                        drafter_ctx=4096, segmenter="probe", scorer="head",
                        segment_probe=out / "segment-probe.gguf", request_probe=out / "request-probe.gguf",
                        scoring_head=out / "scorer-head.gguf")
    built = build_scorer(settings)
    try:
        text = "\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(60))
        tt = TokenizedText.from_text(text)
        from pflash_proxy.compress.units import UnitSegmenter

        units = UnitSegmenter().segment(tt)
        scores = built.scorer.score(built.scorer.represent(tt, units), "What does f7 return?")
        assert scores.shape == (len(units),) and np.all(np.isfinite(scores)) and np.all(scores >= 0)
    finally:
        built.close()


@pytest.mark.parametrize("args, needle", [
    (["--drafter", "/nonexistent.gguf", "--out", "x"], "does not exist"),
    (["--examples", "3"], "--examples >= 8"),
    (["--budget", "1.5"], "--budget"),
])
def test_bad_arguments_get_one_line_and_exit_2(gemma, tmp_path, args, needle):
    base = {"--drafter": gemma, "--out": str(tmp_path / "o")}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    r = _train(*[x for kv in base.items() for x in kv])
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_packaged_gemma_set_is_found_by_the_drafter_hash(gemma, tmp_path):
    from pflash_proxy.config import Settings
    from pflash_proxy.drafter.hashing import file_sha256
    from pflash_proxy.drafter.trained import for_drafter, for_drafter_file
    from pflash_proxy.stages.scorers import build_scorer

    found = for_drafter(file_sha256(gemma))
    assert found is not None, "the package ships a probe set for gemma-3-270m Q4_K_M"
    assert for_drafter("0" * 64) is None
    assert for_drafter_file(gemma, tmp_path / "hashes.json") == found
    stranger = tmp_path / "other.gguf"
    stranger.write_bytes(b"GGUF not gemma")
    assert for_drafter_file(stranger) is None
    settings = Settings(upstream="http://127.0.0.1:9", home=tmp_path / "home", drafter=Path(gemma),
                        drafter_ctx=2048, segmenter="probe", scorer="head")
    built = build_scorer(settings)  # no probe paths given: the packaged set is used
    try:
        assert built.describe()["segmenter"] == "probe" and built.describe()["scorer"] == "head"
        assert built.scorer.request is not None
    finally:
        built.close()
