"""``python -m evals code-reads`` end to end on a tiny ``--limit``: generated cases from a fixture
site-packages, each read in three shapes, warm and cold, through the real proxy routes against a real
llama-server (its tokenizer), nothing prefilled."""

from __future__ import annotations

import json

import pytest

from evals.__main__ import main

from .code_reads_site import make_site

pytestmark = pytest.mark.llama


@pytest.mark.timeout(180)
def test_bench_code_reads_end_to_end(llama_server, tmp_path, capsys):
    site = make_site(tmp_path)
    out = tmp_path / "out"
    assert main(["code-reads", "--site", str(site), "--limit", "3", "--upstream", llama_server.url,
                 "--out", str(out), "--seed", "1"]) == 0
    md = (out / "report.md").read_text()
    assert md.strip() in capsys.readouterr().out
    assert "(headline)" in md and "| lexical | warm | named |" in md
    command = (out / "command.txt").read_text()
    assert command.startswith("python -m evals code-reads --split all --seed 1 --threshold 2048")
    data = json.loads((out / "results.json").read_text())
    recs = data["records"]
    assert [c["kind"] for c in data["cases"]] == ["named", "qualified", "described"]
    assert len(recs) == 3 * 3 * 2 and {r["scorer"] for r in recs} == {"lexical"}
    assert {(r["shape"], r["variant"]) for r in recs} == {(s, v) for s in ("claude", "opencode", "cat")
                                                           for v in ("warm", "cold")}
    assert data["packages"] and all(v["version"] == "1.2.3" for v in data["packages"].values())
    for r in recs:
        assert r["status"] == 200 and r["mode"] in ("compressed", "full-flat"), r
        assert r["tokens_in"] >= 2048  # llama-server's count of the read, over the threshold
        if r["variant"] == "warm":
            assert r["mode"] == "compressed", r  # in a running session a flat ranking is still compressed
        if r["mode"] == "compressed":
            assert 0 < r["kept"] < 1 and r["gutter"] == {"claude": "N<TAB>", "opencode": "N: ", "cat": None}[
                r["shape"]]
        else:
            assert r["gold"] and r["kept"] == 1.0 and "flat" in r["reason"]
