"""Recall of a message stored by another scorer (a ``--scorer`` change between runs, or an older reps layout):
the serving scorer makes its own reps from the stored text, never fails on the foreign payload."""

from __future__ import annotations

import dataclasses

import numpy as np

from pflash_proxy.compress.pipeline import CompressionSettings, Compressor
from pflash_proxy.compress.recall import RecallGate
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.scores import REPS_VERSION, LexicalScorer, UnitReps
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import Unit
from pflash_proxy.sessions.index import SessionRecord
from pflash_proxy.sessions.index.codec import decode, encode

from .corpus import NEEDLE, document_with_needle

QUESTION = "What was the vault combination of the Zebulon archive?"


class Counting:
    """A scorer of another name over lexical relevance, whose payload no other scorer can read."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = LexicalScorer()
        self.represented = 0

    def represent(self, tt: TokenizedText, units: list[Unit]) -> UnitReps:
        self.represented += 1
        inner = self.inner.represent(tt, units)
        return UnitReps(self.name, inner.n_units, inner.unit_tokens, {"inner": inner}, REPS_VERSION)

    def score(self, reps: UnitReps, query: str) -> np.ndarray:
        if reps.scorer != self.name:
            raise TypeError(f"reps of {reps.scorer!r}")
        return self.inner.score(reps.payload["inner"], query)


def _stored(scorer=None):
    """A compressed needle document's recall source, as a session stores and reads it back."""
    tt = TokenizedText.from_text(document_with_needle())
    out = Compressor(CompressionSettings(curve="1000:0.13"), scorer=scorer).compress(
        tt, RequestSpec("sourdough starter yeast acidity", 0, "latest-user"), tt.total_tokens, True, "paste", "1")
    assert out.mode == "compressed" and NEEDLE not in out.text
    rec = SessionRecord(id="a" * 32, seed="s", recall_sources=[out.recall])
    (src,) = decode("session", encode("session", rec)).recall_sources
    return src


def test_a_message_stored_by_lexical_is_recalled_under_another_scorer():
    src = _stored()
    assert src.reps.scorer == "lexical" and src.kept_texts and src.line_tokens and src.unit_kinds
    other = Counting()
    gate = RecallGate()
    hit = gate.decide([src], QUESTION, other)
    assert hit.recalled and any(NEEDLE in e.text for e in hit.recalled) and other.represented == 1
    assert gate.decide([src], QUESTION, other).recalled and other.represented == 1  # made once per conversation


def test_a_message_stored_by_another_scorer_is_recalled_by_lexical():
    src = _stored(Counting())
    assert src.reps.scorer == "counting"
    hit = RecallGate().decide([src], QUESTION, LexicalScorer())
    assert hit.recalled and any(NEEDLE in e.text for e in hit.recalled)


def test_reps_of_an_older_layout_are_made_again():
    src = _stored()
    old = dataclasses.replace(src, reps=dataclasses.replace(src.reps, version=REPS_VERSION - 1,
                                                            payload={"a layout": "no scorer reads now"}))
    hit = RecallGate().decide([old], QUESTION, LexicalScorer())
    assert hit.recalled and any(NEEDLE in e.text for e in hit.recalled)


def test_a_source_stored_without_its_text():
    """Stored before the text was kept: lexical reps are scored by a rebuilt lexical scorer; any other payload is
    left out of recall, and the question is answered without it (no error)."""
    src = _stored()
    bare = dataclasses.replace(src, kept_texts={}, line_tokens=(), unit_kinds=())
    hit = RecallGate().decide([bare], QUESTION, Counting())
    assert hit.recalled and any(NEEDLE in e.text for e in hit.recalled)
    foreign = dataclasses.replace(_stored(Counting()), kept_texts={}, line_tokens=(), unit_kinds=())
    miss = RecallGate().decide([foreign], QUESTION, LexicalScorer())
    assert not miss.recalled and miss.share == 0.0
