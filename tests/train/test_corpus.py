"""The generated training data: structure labels, questions and their evidence, the held-out split."""

from __future__ import annotations

import ast
import random

import pytest

from pflash_proxy.train import corpus, tasks
from pflash_proxy.train.run import held_out


def test_code_units_start_at_top_level_definitions_and_docstrings_are_gone():
    path, src = next((p, s) for p, s in corpus.package_files() if p.endswith("json/decoder.py"))
    doc = corpus.code_doc(path, src, random.Random(0), 100_000)
    assert doc is not None and len(doc.units) >= 4
    defs = [i for i, line in enumerate(doc.lines) if line.startswith(("def ", "class "))]
    assert set(defs) <= {u for u in doc.units} | {u + k for u in doc.units for k in range(1, 4)}
    for name, summ, line in doc.functions:
        assert name in doc.lines[line]
        assert summ not in doc.text  # the question's words were removed from the evidence
    ast.parse(doc.text)  # still valid Python


@pytest.mark.parametrize("index", range(40))
def test_examples_are_consistent(index):
    ex = tasks.build(index, seed=5, lo=1500, hi=3000)
    d = ex.doc
    assert d.units[0] == 0 and d.units == sorted(set(d.units)) and d.units[-1] < len(d.lines)
    a, b = ex.request
    assert 0 <= a < b <= len(ex.query) and "?" in ex.query[a:b] or ex.query[a:b].endswith(".")
    assert ex.gold and all(0 <= g < len(d.units) for g in ex.gold)
    if ex.family in ("needle", "latent"):
        ends = d.units[1:] + [len(d.lines)]
        gold_text = "\n".join(d.lines[d.units[ex.gold[0]]:ends[ex.gold[0]]])
        assert any(n in gold_text for n in tasks.NAMES + ["The "])  # the planted line is in the gold unit
    if ex.family == "latent":
        needle = next(line for line in gold_text.split("\n") if any(n in line for n in tasks.NAMES))
        assert not (tasks.words(ex.query[a:b]) & tasks.words(needle)), (needle, ex.query)


def test_the_same_index_gives_the_same_example():
    a, b = tasks.build(7, seed=1), tasks.build(7, seed=1)
    assert a.doc.text == b.doc.text and a.query == b.query and a.gold == b.gold
    assert tasks.build(7, seed=2).doc.text != a.doc.text


def test_held_out_code_is_split_by_source_file():
    metas = [{"kind": "code", "source": p, "index": i} for i, (p, _) in enumerate(corpus.package_files())]
    out = [m["source"] for m in metas if held_out(m)]
    assert 0.05 < len(out) / len(metas) < 0.3
    assert all(held_out({"kind": "code", "source": s, "index": 999}) for s in out)  # index does not matter


def test_wordnet_pairs_share_no_word():
    pairs = tasks.wordnet_pairs()
    if not pairs:
        pytest.skip("WordNet (Debian wordnet-base) is not installed")
    for word, hyper, gloss in pairs[:200]:
        assert not tasks.words(word) & (tasks.words(hyper) | tasks.words(gloss))
