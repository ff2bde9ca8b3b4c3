"""The report writer: JSON + markdown always, a PNG only when matplotlib can be imported."""

from __future__ import annotations

import builtins
import json

from pflash_proxy.bench.report import Chart, Table, fmt, markdown_table, pct, write_report


def _no_matplotlib(monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib here")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_markdown_table_formats_cells():
    md = markdown_table(Table("T", ["a", "b", "c"], [[0.12345, None, True], ["x|y", 12.345, pct(3, 4)]]))
    lines = md.splitlines()
    assert lines[0] == "### T"
    assert lines[2] == "| a | b | c |" and lines[3] == "|---|---|---|"
    assert lines[4] == "| 0.123 | – | yes |"
    assert lines[5] == "| x\\|y | 12.3 | 3/4 (75%) |"
    assert fmt(float("nan")) == "–" and pct(0, 0) == "–"


def test_write_report_json_and_markdown_and_skipped_png(tmp_path, monkeypatch):
    _no_matplotlib(monkeypatch)
    tables = [Table("Retention", ["row", "gold"], [["full prefill", "2/2 (100%)"]])]
    chart = Chart("c", "%", ["16K"], {"full prefill": [100.0]})
    w = write_report(tmp_path / "out", "quality", "Title", {"records": [{"a": 1}]}, tables, ["a note"], chart)
    assert [p.name for p in w.paths] == ["quality.json", "quality.md"]
    assert not (tmp_path / "out" / "quality.png").exists()
    assert w.png_skipped and "matplotlib" in w.png_skipped
    md = (tmp_path / "out" / "quality.md").read_text()
    assert md.startswith("# Title") and "- a note" in md and "PNG chart skipped" in md
    assert "| full prefill | 2/2 (100%) |" in md
    data = json.loads((tmp_path / "out" / "quality.json").read_text())
    assert data["records"] == [{"a": 1}]
    assert data["tables"][0]["rows"] == [["full prefill", "2/2 (100%)"]]
    assert any("matplotlib" in n for n in data["notes"])


def test_png_written_when_matplotlib_is_available(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    chart = Chart("c", "%", ["16K", "32K"], {"a": [100.0, 90.0], "b": [50.0, None]})
    w = write_report(tmp_path, "x", "X", {}, [], [], chart)
    assert (tmp_path / "x.png").stat().st_size > 0 and w.png_skipped is None
