"""``benchmarks/gpu/``: the one-command GPU measurement's plan, time boxes and report, without a GPU or a build.

The end-to-end test of the script is ``bash benchmarks/gpu/run.sh --cpu-tiny`` (it compiles llama.cpp, so it
stays outside ``make test``; benchmarks/gpu/README.md).  Checked here, in milliseconds: the GPU plan is the
issue's (27B-shape target, 16K-128K lengths that fit the target's context, shapes the GGUF writer knows), the
tiny plan's drafter has a global-attention layer for the attention scorer, kept tokens follow the proxy's own
prefill curve, a step that does not fit the time left is skipped and recorded, the report renders partial
results and says what the numbers are, and the command fits the device tool's 600-second limit.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


measure = _load("gpu_measure", ROOT / "benchmarks" / "gpu" / "measure.py")
synthetic = _load("synthetic_target", ROOT / "benchmarks" / "gpu" / "synthetic_target.py")


def test_gpu_plan_is_the_issues_setup():
    p = measure.PLANS["gpu"]
    assert p["target"]["shape"] == "gemma3-27b"
    assert [d["shape"] for d in p["drafters"]] == ["gemma3-1b", "gemma3-270m"]
    assert p["lengths"][:3] == [16384, 32768, 65536] and 128000 <= p["lengths"][-1] < p["ctx"]
    assert p["ctx"] <= synthetic.SHAPES["gemma3-27b"].context
    assert p["proxy_tokens"] in p["lengths"] and p["proxy_tokens"] > p["threshold"]
    for plan in measure.PLANS.values():
        for spec in [plan["target"], *plan["drafters"]]:
            assert spec["shape"] in synthetic.SHAPES and spec["quant"] in synthetic.QUANTS


def test_tiny_drafter_has_a_global_layer_and_windows():
    p = measure.PLANS["cpu-tiny"]
    layers = p["drafters"][0].get("layers") or synthetic.SHAPES[p["drafters"][0]["shape"]].layers
    assert any((L + 1) % synthetic.SHAPES["tiny"].swa_pattern == 0 for L in range(layers))
    assert p["drafter_ctx"] < max(p["lengths"])  # the windowed drafter path, as at 128K on the GPU
    assert max(p["lengths"]) + 64 <= p["ctx"]


def test_kept_tokens_follow_the_prefill_curve():
    assert measure.kept_tokens(16384) == round(16384 * 0.315)
    assert measure.kept_tokens(65536) == round(65536 * 0.270)
    assert measure.kept_tokens(130048) == round(130048 * 0.225)


def test_a_step_that_does_not_fit_is_skipped_and_recorded(tmp_path):
    rep = measure.Report(tmp_path, "gpu", measure.PLANS["gpu"], budget=measure.RESERVE_S + 30)
    assert rep.fits("small", 5)
    assert not rep.fits("full prefill 130048", 60)
    skipped = rep.data["skipped"]
    assert [s["step"] for s in skipped] == ["full prefill 130048"] and skipped[0]["estimate_s"] == 60
    md = (tmp_path / "gpu-report.md").read_text()
    assert "Skipped (time box): full prefill 130048" in md
    assert (tmp_path / "gpu-report.json").is_file()


def test_report_renders_partial_rows_and_says_what_they_are(tmp_path):
    rep = measure.Report(tmp_path, "gpu", measure.PLANS["gpu"], budget=600)
    rep.data["rows"] = {"16384": {"kept_tokens": 5161, "full_s": 4.0, "kept_s": 1.0, "drafter_s": 1.0},
                        "32768": {"kept_tokens": 8847, "full_s": 9.0}}
    rep.step("full prefill 32768", 9.0, ok=False, error="timeout")
    md = (tmp_path / "gpu-report.md").read_text()
    assert "Random-weight GGUFs" in md and "noise" in md
    assert "| 16384 | 4.00 | 4096 | 5161 | 1.00 | 1.00 | 2.00 | 2.00× |" in md
    assert "| 32768 | 9.00 | 3641 | 8847 | – | – | – | – |" in md
    assert "Failed: full prefill 32768: timeout" in md
    tiny = measure.render({**rep.data, "mode": "cpu-tiny"})
    assert "say nothing about speed" in tiny


def test_the_command_fits_the_device_limit():
    run_sh = (ROOT / "benchmarks" / "gpu" / "run.sh").read_text()
    budget = int(re.search(r"BUDGET=(\d+)", run_sh).group(1))
    readme = (ROOT / "benchmarks" / "gpu" / "README.md").read_text()
    timeout = int(re.search(r'"timeout_s":\s*(\d+)', readme).group(1))
    assert budget + 20 <= timeout <= 600
    assert '"carry": [".gpu"]' in readme and "bash benchmarks/gpu/run.sh" in readme
