"""The stored format of the session indexes (``sessions/index/codec.py``): plain JSON with a schema version, nothing
unpickled, and every value that is not a record read as absent.

1. A session record round-trips whole: served history, hashes, traces, and recall sources made by each of the
   compressor's scorer shapes (lexical, lexical with hops, reference links, fused, routed): the decoded source
   scores a question exactly as the original.
2. Values that are not records decode to None (logged): a pickle, JSON of another kind or schema, a record of the
   wrong shape, a number, bytes that are not UTF-8, an unknown class in a recall source (that source alone is
   dropped).
"""

from __future__ import annotations

import json
import logging
import pickle

import numpy as np
import pytest

from pflash_proxy.compress import CompressionSettings, Compressor, LexicalScorer, RequestFinder, TokenizedText
from pflash_proxy.compress.fusion import FusedScorer
from pflash_proxy.compress.links import Linked
from pflash_proxy.compress.routed import RoutedScorer
from pflash_proxy.sessions.index import SessionRecord, SnapshotRecord
from pflash_proxy.sessions.index.codec import SCHEMA, decode, encode


class CreatesFile:
    """Unpickling this creates ``path``: what a writer of a shared store could plant."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _document() -> str:
    parts = []
    for i in range(40):
        parts.append(f"def handler_{i}(request):\n    value_{i} = compute_{i}(request)\n    return value_{i} * {i}\n")
    parts.append("The vault combination of the Zebulon archive is 48213.\n")
    return "\n".join(parts)


SCORERS = {"lexical": LexicalScorer(), "hops": LexicalScorer(hops=3), "linked": Linked(LexicalScorer()),
           "fused": FusedScorer(LexicalScorer(), LexicalScorer(hops=2)),
           "routed": RoutedScorer(LexicalScorer(), Linked(LexicalScorer()))}


@pytest.mark.parametrize("name", list(SCORERS))
def test_a_session_record_with_recall_sources_round_trips(name):
    text = _document()
    tt = TokenizedText.from_text(text)
    scorer = SCORERS[name]
    request = RequestFinder().find([{"role": "user", "content": text}], 0, tt)
    out = Compressor(CompressionSettings(threshold=100), scorer=scorer).compress(tt, request, tt.total_tokens + 50,
                                                                                True, "paste", "1")
    assert out.recall is not None
    rec = SessionRecord(id="a" * 32, seed="s", client_hashes=["h1", "h2"],
                        served=[{"role": "user", "content": text}, {"role": "assistant", "content": "é ok"}],
                        owner="o", turns=2, recall_sources=[out.recall], traces=[{"kind": "compress", "n": (1, 2)}],
                        trace_totals={"compressions": 1})
    data = encode("session", rec)
    assert b"pflash_proxy" in data and json.loads(data)["schema"] == SCHEMA  # JSON, the classes by name only
    back = decode("session", data)
    assert back is not None and back.served == rec.served and back.client_hashes == rec.client_hashes
    assert back.traces == [{"kind": "compress", "n": [1, 2]}] and back.trace_totals == rec.trace_totals
    (src,) = back.recall_sources
    assert src.unit_lines == out.recall.unit_lines and src.omitted_texts == out.recall.omitted_texts
    assert src.kept_texts == out.recall.kept_texts and src.line_tokens == out.recall.line_tokens
    assert src.unit_kinds == out.recall.unit_kinds and src.reps.version == out.recall.reps.version
    q = "What is the vault combination of the Zebulon archive?"
    assert np.array_equal(scorer.score(src.reps, q), scorer.score(out.recall.reps, q))


def test_snapshot_records_round_trip_and_old_plain_json_still_reads():
    snap = SnapshotRecord("s1", "f.bin", 10, ["h"], "model", 123, checksum="crc32:1")
    assert decode("snapshot", encode("snapshot", snap)) == snap
    from dataclasses import asdict

    assert decode("snapshot", json.dumps(asdict(snap)).encode()) == snap  # what the redis index wrote before


@pytest.mark.parametrize("value", [
    pickle.dumps({"id": "x", "seed": "s"}),
    pickle.dumps(CreatesFile("/nonexistent/never")),
    b"5", b"[]", b"null", b'"text"', b"\xff\xfe not utf-8", b"{",
    json.dumps({"schema": SCHEMA + 1, "kind": "session", "value": {"id": "x", "seed": "s"}}).encode(),
    json.dumps({"schema": SCHEMA, "kind": "snapshot", "value": {"id": "x", "seed": "s"}}).encode(),
    json.dumps({"schema": SCHEMA, "kind": "session", "value": {"id": 5, "seed": "s"}}).encode(),
    json.dumps({"schema": SCHEMA, "kind": "session", "value": {"id": "x", "seed": "s", "served": "no"}}).encode(),
    json.dumps({"schema": SCHEMA, "kind": "session", "value": 7}).encode(),
    12, None, ["a"],
], ids=lambda v: repr(v)[:30])
def test_what_is_not_a_record_reads_as_absent(value, caplog):
    caplog.set_level(logging.WARNING, "pflash_proxy.sessions")
    assert decode("session", value, "session:x") is None
    assert "treated as absent" in caplog.text


def test_records_are_written_as_schema_2_and_schema_1_still_reads():
    """A session record may keep its messages under keys of their own (schema 2): a version that reads schema 1
    only must read it as absent, not as a record with an empty history (it would forward the request without the
    messages that history covers); the records such a version wrote (everything inline) still read."""
    rec = SessionRecord(id="a" * 32, seed="s", client_hashes=["h1"], served=[{"role": "user", "content": "hi"}])
    rec.served_stored = 1  # an index stored the message under its own key
    doc = json.loads(encode("session", rec))
    assert doc["schema"] == 2 and doc["value"]["served"] == [] and doc["value"]["served_keyed"] == 1
    v1 = {"id": "b" * 32, "seed": "s", "client_hashes": ["h1"], "served": [{"role": "user", "content": "old"}]}
    old = decode("session", json.dumps({"schema": 1, "kind": "session", "value": v1}))
    assert old is not None and old.served == v1["served"] and old.served_keyed == 0


def test_an_unknown_class_in_a_recall_source_drops_that_source_only():
    value = {"id": "x", "seed": "s", "recall_sources": [{"$dc": "os.system", "f": {"command": "touch /tmp/x"}}]}
    rec = decode("session", json.dumps({"schema": SCHEMA, "kind": "session", "value": value}))
    assert rec is not None and rec.id == "x" and rec.recall_sources == []


def test_a_recall_source_that_cannot_be_stored_is_dropped_not_the_record(caplog):
    rec = SessionRecord(id="b" * 32, seed="s", served=[{"role": "user", "content": "x"}],
                        recall_sources=[object()])  # type: ignore[list-item]
    back = decode("session", encode("session", rec))
    assert back is not None and back.served == rec.served and back.recall_sources == []
    assert "not stored" in caplog.text
