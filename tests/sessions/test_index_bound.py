"""--max-index-mb bounds the session index on disk; the snapshot index is served from memory."""

from __future__ import annotations

from pflash_proxy.config import Settings
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.sessions.index import SnapshotRecord, open_index
from pflash_proxy.sessions.index.sqlite import SqliteIndex
from pflash_proxy.sessions.service import SessionService


async def test_the_index_is_pruned_to_its_byte_bound_oldest_first(tmp_path):
    settings = Settings(upstream="http://127.0.0.1:9", home=tmp_path, max_index_mb=0.5)
    store = open_index(settings.proxy.home, settings.cluster.index)
    service = SessionService(settings, FakeEngine(), index=store)
    try:
        ids = []
        for i in range(40):
            rec = store.new_session("seed", False)
            msgs = [{"role": "user", "content": f"{i} " + "lorem ipsum dolor sit amet " * 1000}]
            store.save_session(rec, [f"h{i}"], msgs)
            ids.append(rec.id)
        assert store.volume() > 0.5 * 2**20
        gone = await service.prune()
        assert gone and store.volume() <= 0.5 * 2**20
        assert set(gone) == set(ids[:len(gone)])  # least recently used first
        assert service.view().session(ids[-1]) is not None
    finally:
        store.close()


def test_snapshot_index_reads_do_not_scan_the_store(tmp_path, monkeypatch):
    settings = Settings(upstream="http://127.0.0.1:9", home=tmp_path)
    store = open_index(settings.proxy.home, settings.cluster.index)
    try:
        store.put_snapshot(SnapshotRecord("s1", "f1", 10, [], "m", 100))
        store.snapshots()
        calls = []
        assert isinstance(store, SqliteIndex)  # a read is a query on this thread's connection
        real_conn = store._conn
        monkeypatch.setattr(store, "_conn", lambda: calls.append(1) or real_conn())
        for _ in range(10):
            assert [r.session for r in store.snapshots()] == ["s1"]
            assert store.snapshot("s1").size == 100
        assert calls == []
        store.drop_snapshot("s1")
        assert store.snapshots() == [] and len(calls) <= 2  # put_snapshot's and drop_snapshot's own writes
    finally:
        store.close()
