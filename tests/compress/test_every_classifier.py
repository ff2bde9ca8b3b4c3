"""The every-X classifier (``compress/intent.py``, issue 48): trained on dev phrasings only, shipped as JSON,
reproducible by its command; a factual "how many" about a document is pointed, a count of the message's parts is
not; "... ? Quote each of them." asks every match of the sentence before; in code, every match of what the code
does (no name spelled) is the whole message."""

from __future__ import annotations

import inspect
import json
import subprocess

import numpy as np

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText, intent
from pflash_proxy.compress.pipeline import CompressionSettings
from pflash_proxy.compress.spread import asks_for_every, every_clause, flat_gate

from evals import every_x, train_intent

from .every_dev import DOCUMENT_QUESTIONS, EVERY, POINTED

SOURCE = inspect.getsource(subprocess)


def test_the_shipped_weights_are_what_the_train_command_makes_of_the_dev_phrasings(tmp_path):
    data = train_intent.train(out=tmp_path / "intent.json")
    shipped = json.loads(intent.WEIGHTS.read_text())
    assert data["weights"] == shipped["weights"] and data["bias"] == shipped["bias"]
    assert shipped["crossval_5fold"]["every"] >= 0.9 and shipped["crossval_5fold"]["pointed"] >= 0.9
    intent.load.cache_clear()


def test_no_held_out_wording_is_trained_on():
    held = [str(w["wording"]) for kind in ("every", "pointed")
            for w in json.loads(every_x.WORDINGS.read_text())[kind] if w["split"] != "dev"]
    dev = json.loads(train_intent.DEV.read_text())
    trained = {t.lower() for k in ("every", "pointed", "pointed_documents") for t in dev[k]}
    for h in held:
        probe = max(h.split("{name}"), key=len).strip().lower()[:40]
        assert len(probe) < 20 or not any(probe in t for t in trained), h  # (under 20 characters says too little)
    assert all(t in dict(train_intent.examples()) for t in EVERY + POINTED + DOCUMENT_QUESTIONS)


def test_a_factual_how_many_about_a_document_is_pointed_a_count_of_its_parts_is_not():
    """RULER QA's "how many ..." questions (SQuAD) were read as every-X by the form rules and served whole."""
    for q in ("How many people lived in the valley in 1850?", "How many goals did the striker score that season?"):
        assert not asks_for_every(q), q
    for q in ("How many records mention the product Tallyframe?", "How many functions here take a callback?"):
        assert asks_for_every(q), q


def test_without_weights_the_form_rules_decide(tmp_path, caplog):
    assert intent.load(tmp_path / "missing.json") is None
    assert "no classifier weights" in caplog.text


def test_an_every_sentence_that_points_back_takes_the_sentence_before():
    q = "We got a complaint about shipping. Do any of the reports mention a delay? Quote each of them."
    assert every_clause(q) == "Do any of the reports mention a delay? Quote each of them."
    assert every_clause("Which function parses the header? List all the steps it takes.") == \
        "List all the steps it takes."


def test_in_code_every_match_of_what_it_does_is_the_whole_message():
    s = np.zeros(40)
    s[[2, 9, 30]] = 1.0
    q = "Find every spot where a pipe gets closed."
    assert flat_gate(s, 10, 0.11, q, s, code=True).whole
    assert not flat_gate(s, 10, 0.11, q, s).flat  # in prose: its three matches, which the budget holds
    assert not flat_gate(s, 10, 0.11, "Find every call to `_close_pipe_fds`.", s, code=True).whole  # a name
    text = SOURCE + "\n" + q + "\n"
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find([{"role": "user", "content": text}], 0, tt)
    out = Compressor(CompressionSettings(threshold=1024)).compress(tt, request, tt.total_tokens, True, "paste", "1")
    assert out.mode == "full-flat" and "whole message" in out.reason, out.reason


def test_everything_several_of_a_kind_and_a_singular_which():
    """'everything', 'more than one place', 'the different ways' ask for every match; a singular noun after which
    asks about one thing (each read the other way before these form signals)."""
    for q in ("show me everything that touches the database", "Is open_session called from more than one place?",
              "what are the different ways a request can fail here?"):
        assert asks_for_every(q), q
    assert not asks_for_every("Which argument controls the timeout?")
