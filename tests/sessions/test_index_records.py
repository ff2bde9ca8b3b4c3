"""The session index seam (``sessions/index/base.py``): typed per-feature fields of a record, records written before
them (one ``extra`` dict) still read, and the read-only view the inspector is handed."""

from __future__ import annotations

import json
import pickle

import pytest

from pflash_proxy.sessions.index import SessionIndex, SessionRecord, open_index
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.sessions.service import SessionService, TurnAsk
from pflash_proxy.sessions.slots import SlotReport
from pflash_proxy.sessions.index.sqlite import SqliteIndex
from tests.conftest import make_settings


def test_a_record_written_with_extra_reads_into_the_typed_fields(tmp_path):
    old = {"id": "a" * 32, "seed": "s", "client_hashes": ["h"], "served": [{"role": "user", "content": "x"}],
           "explicit": False, "owner": None, "created": 1.0, "last_use": 2.0, "turns": 1,
           "extra": {"pflash_recall": ["a source"], "pflash_inspector": [{"kind": "recall"}],
                     "pflash_inspector_totals": {"recalls": 1}, "something-else": 3}}
    rec = SessionRecord.from_stored(old)
    assert rec.served == old["served"] and rec.turns == 1
    assert rec.recall_sources == ["a source"] and rec.traces == [{"kind": "recall"}]
    assert rec.trace_totals == {"recalls": 1}
    store = SqliteIndex(tmp_path / "idx")
    rec.recall_sources = []
    rec.trace_totals["recalls"] = 2
    store.update_record(rec)
    data = store._conn().execute("SELECT data FROM session WHERE sid = ?", (rec.id,)).fetchone()[0]
    stored = json.loads(data)  # schema-versioned JSON (sessions/index/codec.py)
    assert "extra" not in stored["value"] and stored["value"]["trace_totals"] == {"recalls": 2}
    again = store.get(rec.id)
    assert again == rec
    # what older versions stored: a pickled dict, never read now
    store._conn().execute("UPDATE session SET data = ? WHERE sid = ?", (pickle.dumps(old), rec.id))
    store.close()
    store = SqliteIndex(tmp_path / "idx")
    assert store.get(rec.id) is None
    store.close()


@pytest.mark.parametrize("name", ["embedded", "sqlite"])
def test_the_embedded_index_is_a_session_index(tmp_path, name):
    index: SessionIndex = open_index(tmp_path, name)
    assert isinstance(index, SqliteIndex) and (tmp_path / "sessions").is_dir()
    rec = index.new_session("seed", False)
    index.save_session(rec, ["h1"], [{"role": "user", "content": "hi"}])
    assert index.get(rec.id) == SessionRecord.from_stored(rec.stored())
    index.close()


async def test_the_services_view_reads_without_changing(tmp_path):
    service = SessionService(make_settings("http://127.0.0.1:9", tmp_path), FakeEngine())
    view = service.view()
    turn = await service.begin(TurnAsk("anonymous", {}))
    assert turn.record is None and turn.slot == 0
    turn.observe(SlotReport(cached_tokens=0, prompt_tokens=8, generated_tokens=2))
    slot = view.slots()[0]
    sid = slot.session
    assert sid is not None and slot.anonymous and slot.tokens == 10 and slot.busy and view.queued == 0
    slot.tokens = 0
    slot.served_hashes.append("x")
    assert view.slots()[0].tokens == 10 and view.slots()[0].served_hashes == []  # a copy
    assert view.resident_slot(sid) == 0 and view.resident_slot("nobody") is None
    assert view.session("nobody") is None and view.snapshot("nobody") is None and view.last_uses() == {}
    await turn.close()
    assert not view.slots()[0].busy
    await service.stop()
