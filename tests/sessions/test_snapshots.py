"""SnapshotManager without a server: atomic naming, 0600, LRU eviction, start-up reconciliation. The engine's
slots are a stand-in of ``engine.Slots`` that writes files of a chosen size (the eviction bound is in bytes), and,
for the tests on the ``mgr`` fixture, also ``FakeEngine``'s slots holding as many tokens as make a file of that
size."""

from __future__ import annotations

import os

import pytest

from pflash_proxy.engine import EngineRefused, Slots
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.sessions.snapshots import SnapshotManager
from pflash_proxy.sessions.index.sqlite import SqliteIndex


class SizedSlots:
    """``Slots.save``/``restore`` writing and reading files of ``size`` bytes in the save directory."""

    def __init__(self, directory, size=1000):
        self.dir, self.size, self.calls = directory, size, []

    async def save(self, slot, name):
        self.calls.append((slot, "save", name))
        (self.dir / name).write_bytes(b"k" * self.size)
        return 123

    async def restore(self, slot, name):
        self.calls.append((slot, "restore", name))
        path = self.dir / name
        if not path.exists() or path.read_bytes()[:1] != b"k":
            raise EngineRefused(f"slot {slot} restore", 400, "bad file")
        return 123


FAKE_TOKENS = 200  # the fake writes a slot's tokens as a JSON list: 200 one-letter tokens are 1,000 bytes


def fake_slots(directory) -> Slots:
    """``FakeEngine``'s slots, each holding ``FAKE_TOKENS`` tokens: a save writes a file of 1,000 bytes, as
    ``SizedSlots`` does."""
    engine = FakeEngine(n_slots=2, save_dir=directory)
    for slot in engine.slots.slots:
        slot.tokens = ["k"] * FAKE_TOKENS
    return engine.slots


@pytest.fixture(params=["stand-in", "fake"])
def slots_kind(request) -> str:
    return request.param


@pytest.fixture
def mgr(tmp_path, slots_kind):
    slots = tmp_path / "slots"
    slots.mkdir()
    store = SqliteIndex(tmp_path / "idx")
    m = SnapshotManager(store, SizedSlots(slots) if slots_kind == "stand-in" else fake_slots(slots), slots,
                        max_bytes=2500)
    yield m
    store.close()


async def test_save_is_atomic_private_and_indexed(mgr, slots_kind):
    rec = await mgr.save(0, "a" * 32, 100, ["h1"], "model-x")
    path = mgr.dir / rec.file
    tokens = 123 if slots_kind == "stand-in" else FAKE_TOKENS  # what the engine says it wrote
    assert rec.file == f"pf-{'a' * 32}.bin" and rec.tokens == tokens and rec.size == 1000
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in mgr.dir.iterdir()] == [rec.file]  # no temporary file left
    if slots_kind == "stand-in":
        tmp_name = mgr.slots.calls[-1][2]
        assert tmp_name != rec.file and not (mgr.dir / tmp_name).exists()  # written under a temp name, renamed
    assert mgr.restorable("a" * 32, "model-x") is not None
    assert mgr.restorable("a" * 32, "other-model") is None  # never across model identities


async def test_lru_eviction_keeps_total_under_limit(mgr):
    for i, sid in enumerate(("a", "b", "c")):
        await mgr.save(i, sid * 32, 10, [], "m")
    names = sorted(p.name for p in mgr.dir.glob("pf-*.bin"))
    assert names == [f"pf-{'b' * 32}.bin", f"pf-{'c' * 32}.bin"]  # 'a' was least recently used
    assert mgr.stats["evictions"] == 1


async def test_failed_restore_deletes_the_snapshot(mgr):
    rec = await mgr.save(0, "d" * 32, 10, [], "m")
    (mgr.dir / rec.file).write_bytes(b"garbage")
    assert await mgr.restore(0, rec) is False
    assert not (mgr.dir / rec.file).exists() and mgr.store.snapshot("d" * 32) is None


async def test_reconcile_removes_orphans_and_drops_missing(mgr):
    keep = await mgr.save(0, "e" * 32, 10, [], "m")
    gone = await mgr.save(1, "f" * 32, 10, [], "m")
    os.unlink(mgr.dir / gone.file)
    (mgr.dir / "pf-tmp-123.bin").write_bytes(b"half")
    (mgr.dir / f"pf-{'9' * 32}.bin").write_bytes(b"orphan")
    (mgr.dir / "user-file.bin").write_bytes(b"not ours")
    result = mgr.reconcile()
    assert result == {"orphans_removed": 2, "entries_dropped": 1}
    assert sorted(p.name for p in mgr.dir.iterdir()) == sorted([keep.file, "user-file.bin"])


async def test_a_temp_file_left_by_a_cancelled_save_is_removed_and_counted(mgr):
    """Issue 13 item 10: llama-server may finish writing after the cancelled save cleaned up."""
    stray = mgr.dir / "pf-tmp-0123456789abcdef.bin"
    stray.write_bytes(b"k" * 2000)  # counted, it and 'a' (1000 bytes) would exceed the 2500-byte limit
    await mgr.save(0, "a" * 32, 10, [], "m")
    assert not stray.exists() and mgr.stats["stray_temp_removed"] == 1
    assert (mgr.dir / f"pf-{'a' * 32}.bin").exists()


async def test_a_shared_directory_keeps_the_previous_snapshot_until_the_new_one_is_indexed(tmp_path):
    """Several nodes (``temp_tag``): a node killed between the rename of a new snapshot and its index entry must
    leave the previous snapshot whole for the node that takes the session over (same-name files were replaced)."""
    slots = tmp_path / "slots"
    slots.mkdir()
    store = SqliteIndex(tmp_path / "idx")
    mgr = SnapshotManager(store, SizedSlots(slots), slots, max_bytes=10_000, temp_tag="node0")
    sid = "f" * 32
    first = await mgr.save(0, sid, 10, ["h1"], "m")
    assert first.file.startswith(f"pf-{sid}.") and mgr.on_disk(sid)
    assert mgr.slots.calls[-1][2].startswith("pf-tmp-node0-")

    def killed(rec):
        raise KeyboardInterrupt  # the process dies between the rename and the index write
    store.put_snapshot, put = killed, store.put_snapshot
    mgr.slots.size = 1500
    with pytest.raises(KeyboardInterrupt):
        await mgr.save(0, sid, 20, ["h1", "h2"], "m")
    store.put_snapshot = put
    rec = mgr.restorable(sid, "m")
    assert rec == first and await mgr.restore(1, rec)  # whole: size and checksum as recorded
    second = await mgr.save(0, sid, 20, ["h1", "h2"], "m")
    assert second.file != first.file and not (slots / first.file).exists()
    mgr.reconcile()  # the orphan of the killed save goes
    assert sorted(p.name for p in slots.glob("pf-*.bin")) == [second.file]
    store.close()


async def test_a_restore_waits_for_a_save_of_the_same_session(tmp_path):
    """A session displaced a moment ago may come back while its slot is still being saved: the restore waits and
    reads the index after the save (before, it restored the previous file or found it replaced)."""
    import asyncio

    slots = tmp_path / "slots"
    slots.mkdir()
    store = SqliteIndex(tmp_path / "idx")
    up = SizedSlots(slots)
    mgr = SnapshotManager(store, up, slots, max_bytes=10_000, temp_tag="n")
    sid = "g" * 32
    await mgr.save(0, sid, 10, ["h1"], "m")
    gate = asyncio.Event()
    plain = up.save

    async def slow(slot, name):
        await gate.wait()
        return await plain(slot, name)
    up.save = slow
    saving = asyncio.create_task(mgr.save(0, sid, 20, ["h1", "h2"], "m"))
    await asyncio.sleep(0.05)

    async def restore_latest():
        async with mgr.lock(sid):
            rec = mgr.restorable(sid, "m")
            return rec, await mgr.restore(1, rec)
    restoring = asyncio.create_task(restore_latest())
    await asyncio.sleep(0.05)
    assert not restoring.done()  # waits for the save
    gate.set()
    second = await saving
    rec, ok = await restoring
    assert ok and rec.file == second.file and rec.served_hashes == ["h1", "h2"]
    assert mgr._locks == {}
    store.close()


async def test_the_index_is_written_and_listed_off_the_event_loop(mgr):
    """A shared index answers over the network and the eviction lists every snapshot record: neither may stall
    the loop while a save or a restore is recorded."""
    import threading

    on_loop: list[str] = []
    store = mgr.store
    for name in ("snapshot", "put_snapshot", "drop_snapshot", "snapshots"):
        real = getattr(store, name)

        def spy(*a, _real=real, _name=name):
            if threading.current_thread() is threading.main_thread():
                on_loop.append(_name)
            return _real(*a)
        setattr(store, name, spy)
    for sid in ("a", "b", "c"):  # the third save evicts the first (2,500-byte bound)
        await mgr.save(0, sid * 32, 10, [], "m")
    rec = store.snapshot("c" * 32)
    on_loop.clear()
    assert await mgr.restore(1, rec)
    (mgr.dir / rec.file).write_bytes(b"garbage")  # a damaged file is dropped, off the loop too
    assert not await mgr.restore(1, rec)
    await mgr.save(0, "d" * 32, 10, [], "m")
    assert on_loop == [], on_loop
    assert mgr.stats["evictions"] >= 1 and mgr.stats["restores"] == 1 and mgr.stats["damaged"] == 1
