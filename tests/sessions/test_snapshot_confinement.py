"""Issue 50 item 2: a snapshot record's ``file`` comes from the index, which a shared one (Redis) lets anyone who
can write it set. It is confined to the snapshot folder (``SnapshotManager.confined``): a record that names
``..``, an absolute path, a separator, another session's file or a temporary file, and a file that is a symbolic
link out of the folder, are refused and logged, never acted on: nothing outside the folder is read, unlinked or
passed to llama-server's restore, on a restore, an eviction that an unrelated save triggers, a delete
(``pflash-proxy rm``, pruning) or the start-up reconciliation. On 19528cf each of these unlinked the victim.

Both indexes: the embedded one (the record written into its SQLite as a writer of the state directory would) and
the real redis-server (``tests/redis_server.py``), written with a plain Redis client as any Redis writer can."""

from __future__ import annotations

import json
import logging
import os

import pytest

from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.sessions.index import SnapshotRecord, open_index
from pflash_proxy.sessions.index.codec import encode
from pflash_proxy.sessions.snapshots import SnapshotManager
from tests.redis_server import RedisServer, binary

SID = "a" * 32
OTHER = "b" * 32


@pytest.fixture(params=["embedded", "redis"])
def index(request, tmp_path):
    if request.param == "redis":
        if binary() is None:
            pytest.skip("redis-server not installed (scripts/setup.sh)")
        server = RedisServer.start(tmp_path / "redis")
        request.addfinalizer(server.stop)
        idx = open_index(tmp_path, server.url)
    else:
        idx = open_index(tmp_path, request.param)
    yield idx
    idx.close()


def plant(index, sid: str, file: str, **fields) -> None:
    """Write a snapshot record under ``sid`` as a hostile writer of the index would (not through ``put_snapshot``:
    straight into the store's own keys)."""
    rec = SnapshotRecord(session=fields.pop("session", sid), file=file, tokens=10, served_hashes=[],
                         model_identity="m", size=fields.pop("size", 6), **fields)
    data = encode("snapshot", rec)
    if hasattr(index, "r"):  # Redis
        index.r.set(f"{index.p}snapshot:{sid}", data)
        index.r.sadd(f"{index.p}snapshots", sid)
    else:  # the SQLite index
        index._conn().execute("INSERT OR REPLACE INTO snapshot VALUES (?, ?)", (sid, data))
        index._snaps = None  # it reads its snapshot records once: as after a restart


@pytest.fixture
def setup(tmp_path, index):
    slots_dir = tmp_path / "slots"
    slots_dir.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"secret")
    engine = FakeEngine(n_slots=2, save_dir=slots_dir)
    for slot in engine.slots.slots:
        slot.tokens = ["k"] * 200
    mgr = SnapshotManager(index, engine.slots, slots_dir, max_bytes=10**9)
    return mgr, engine, victim


def hostile_names(victim, slots_dir) -> dict[str, str]:
    rel = os.path.relpath(victim, slots_dir)
    return {"dot-dot": rel, "absolute": str(victim), "separator": f"sub/pf-{SID}.bin",
            "dot-dot in a snapshot name": f"pf-{SID}.bin/../../outside/victim",
            "another session's file": f"pf-{OTHER}.bin", "a temporary file": "pf-tmp-0123.bin",
            "not a snapshot name": "victim"}


def victims_kept(victim, mgr) -> None:
    assert victim.read_bytes() == b"secret"
    assert (mgr.dir / f"pf-{OTHER}.bin").read_bytes() == b"other"


@pytest.mark.parametrize("kind", ["dot-dot", "absolute", "separator", "dot-dot in a snapshot name",
                                  "another session's file", "a temporary file", "not a snapshot name"])
async def test_a_record_naming_a_file_outside_its_own_is_never_acted_on(setup, index, kind, caplog):
    mgr, engine, victim = setup
    (mgr.dir / f"pf-{OTHER}.bin").write_bytes(b"other")  # another session's snapshot, indexed as its own
    index.put_snapshot(SnapshotRecord(session=OTHER, file=f"pf-{OTHER}.bin", tokens=10, served_hashes=[],
                                      model_identity="m", size=5))
    name = hostile_names(victim, mgr.dir)[kind]
    plant(index, SID, name)
    caplog.set_level(logging.WARNING)
    # a restore: refused before the file is read or named to llama-server
    assert mgr.restorable(SID, "m") is None
    rec = index.snapshot(SID)
    assert rec is not None
    assert await mgr.restore(0, rec) is False
    assert engine.calls.get("restore", 0) == 0
    victims_kept(victim, mgr)
    # a delete (pflash-proxy rm, pruning): the record goes, the file it names stays
    plant(index, SID, name)
    mgr.delete(SID)
    victims_kept(victim, mgr)
    # an eviction that an unrelated session's save triggers
    plant(index, SID, name, size=10**9, last_use=0.0)
    await mgr.save(1, "c" * 32, 200, [], "m")
    assert index.snapshot(SID) is None  # evicted: its record
    victims_kept(victim, mgr)
    # the start-up reconciliation: the record is dropped, what it names stays
    plant(index, SID, name)
    mgr.reconcile()
    assert index.snapshot(SID) is None
    victims_kept(victim, mgr)
    assert mgr.stats["refused_records"] >= 3
    assert "refused" in caplog.text


async def test_a_snapshot_file_that_is_a_symlink_out_of_the_folder_is_not_followed(setup, index):
    mgr, engine, victim = setup
    rec = await mgr.save(0, SID, 200, [], "m")
    path = mgr.dir / rec.file
    path.unlink()
    path.symlink_to(victim)  # planted by someone who can write the folder
    planted = SnapshotRecord(session=SID, file=rec.file, tokens=rec.tokens, served_hashes=[], model_identity="m",
                             size=6, checksum=rec.checksum)
    index.put_snapshot(planted)
    assert not mgr.on_disk(SID)
    assert mgr.restorable(SID, "m") is None  # not a regular file: dropped as missing
    assert await mgr.restore(0, planted) is False  # and a restore of the record itself reads nothing through it
    assert engine.calls.get("restore", 0) == 0
    index.put_snapshot(planted)
    assert mgr.delete(SID)
    assert victim.read_bytes() == b"secret"  # the link went, not what it pointed to
    assert not os.path.lexists(path)


async def test_a_record_under_another_sessions_key_is_absent(setup, index):
    """A record stored under session A's key that says it is session B's (B's file, B's record to evict) reads as
    absent: an eviction of it never drops or unlinks B's snapshot."""
    mgr, engine, victim = setup
    b = await mgr.save(0, OTHER, 200, [], "m")
    plant(index, SID, b.file, session=OTHER, size=10**9, last_use=0.0)
    assert index.snapshot(SID) is None
    assert [r.session for r in index.snapshots()] == [OTHER]
    mgr.evict()
    assert (mgr.dir / b.file).exists() and index.snapshot(OTHER) is not None


async def test_own_snapshots_still_save_restore_and_evict(setup, index):
    mgr, engine, victim = setup
    rec = await mgr.save(0, SID, 200, ["h"], "m")
    assert mgr.confined(rec) == mgr.dir / rec.file and mgr.on_disk(SID)
    assert await mgr.restore(1, mgr.restorable(SID, "m")) is True
    assert engine.calls["restore"] == 1
    versioned = SnapshotManager(index, engine.slots, mgr.dir, max_bytes=10**9, temp_tag="node1")
    rec2 = await versioned.save(0, SID, 200, ["h"], "m")
    assert rec2.file != rec.file and versioned.on_disk(SID) and not (mgr.dir / rec.file).exists()
    assert json.loads(encode("snapshot", rec2))["value"]["file"] == rec2.file
