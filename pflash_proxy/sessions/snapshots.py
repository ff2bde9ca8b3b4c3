"""SSD snapshots of slots: one file per session in the engine's save directory (llama-server's
``--slot-save-path``), written and loaded through ``engine.Slots``.

1. Save: ``Slots.save`` to a temporary name; a file of 0 tokens, or clearly fewer than the slot holds (the tokens
   the engine says it wrote), is deleted and the previous snapshot kept (``SnapshotRejected``); otherwise ``os.replace``
   onto ``pf-<safe id>.bin`` (never a client string), ``chmod 0600``, and only then the index entry: a crash
   leaves an orphan temp file, never an index entry pointing at half a file. In a directory several nodes
   share, each save has a name of its own (``pf-<id>.<random>.bin``) and the previous file is removed once the
   index names the new one: a node killed in between leaves an orphan, and the index still names the previous,
   whole snapshot.
2. Restore only when the index says the file belongs to the running model identity (file, size, KV layout):
   llama-server itself does not check, and a failed restore wipes the slot.  A failed restore deletes the
   snapshot; the caller serves the request by full prefill, and so does a restore that loaded none or clearly
   fewer of the file's tokens than its record says (the tokens the engine says it loaded).  Before a restore the file is checked
   against the size and CRC-32 recorded when it was saved (about 0.25 s per GB): llama-server restores a file
   whose header is intact but whose KV data is damaged without complaint, and then answers from garbage.  A file that
   is missing, truncated or corrupt is dropped (``damaged`` in the stats) and never reaches llama-server.
3. LRU eviction keeps the total under ``--max-cache-gb``. Temporary files that no save is writing any more (a
   save cancelled while llama-server still wrote the file leaves one behind, after the cleanup ran) count
   against the limit and are removed first.
4. ``reconcile()`` at start-up: temp files and files without an index entry are removed, entries without a
   file are dropped. Nodes that share the directory (``cluster.py``) name their temporary files with their own
   tag, and each removes only its own.
5. A record's ``file`` is read from the index, which a shared one (Redis) lets anyone who can write it set, so it
   is never trusted as a path (``confined``): it must be a plain name in the snapshot folder of the form this
   module gives the record's own session (``pf-<session>.bin``, or ``pf-<session>.<12 hex>.bin`` in a shared
   folder), where the session is a plain id (letters, digits, ``-``, ``_``) and not a temporary file's. A
   record naming anything else (``..``, an absolute path, a separator, another session's file, a temporary
   file) is refused and logged: its file is never read, unlinked or passed to llama-server's restore, and the
   record is dropped from the index at start-up (``reconcile``). A file is read (its checksum before a restore)
   only when it is a regular file and not a symbolic link (``O_NOFOLLOW``, ``fstat``), so a link planted in the
   folder that points out of it is never followed; unlinking a name removes that directory entry only, never
   what a link points to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import stat
import time
import uuid
import zlib
from pathlib import Path
from collections.abc import AsyncIterator
from typing import Callable

from pflash_proxy.config import private_dir
from pflash_proxy.engine import EngineRefused, Slots
from pflash_proxy.sessions.index import SessionIndex, SnapshotRecord, StoreError

log = logging.getLogger("pflash_proxy.snapshots")

PREFIX = "pf-"
SUFFIX = ".bin"
# the names this module gives a session's snapshot (step 5): pf-<session>.bin, pf-<session>.<12 hex>.bin
_NAME = re.compile(r"pf-(?P<sid>[A-Za-z0-9_-]{1,128})(?:\.[0-9a-f]{12})?\.bin")


class SnapshotManager:
    def __init__(self, store: SessionIndex, slots: Slots | None, directory: Path, max_bytes: int,
                 temp_tag: str = ""):
        """``slots``: None where nothing is saved or restored (``pflash-proxy rm`` deletes snapshots)."""
        self.store = store
        # several nodes share the directory (cluster.py): each names its temporary files with its own tag and
        # removes only those (another node's may be in the middle of a save)
        self.temp_prefix = f"{PREFIX}tmp-{temp_tag}-" if temp_tag else f"{PREFIX}tmp-"
        # and each save gets a name of its own (step 1): a node killed between the rename and the index write
        # leaves an orphan, while the session's previous snapshot stays whole for the node that takes it over
        self.versioned = bool(temp_tag)
        self._slots = slots
        self.dir = directory
        self.max_bytes = max_bytes
        self._writing: set[str] = set()  # temporary names of saves in flight
        self.on_timing: Callable[[str, float], None] | None = None  # (save|restore, seconds) -> metrics
        # per session: a save and a restore of it never overlap (the lock, and how many hold or wait for it)
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.stats = {"saves": 0, "restores": 0, "restore_failures": 0, "damaged": 0, "evictions": 0,
                      "stray_temp_removed": 0, "save_ms_total": 0.0, "restore_ms_total": 0.0,
                      "refused_records": 0}

    @contextlib.asynccontextmanager
    async def lock(self, sid: str) -> AsyncIterator[None]:
        """Saves and restores of one session run one at a time (a restore reads the index after the save)."""
        entry = self._locks.setdefault(sid, (asyncio.Lock(), [0]))
        entry[1][0] += 1  # holders and waiters: the entry goes with the last of them
        try:
            async with entry[0]:
                yield
        finally:
            entry[1][0] -= 1
            if not entry[1][0] and self._locks.get(sid) is entry:
                del self._locks[sid]

    @property
    def slots(self) -> Slots:
        if self._slots is None:
            raise RuntimeError("this SnapshotManager has no engine to save or restore with")
        return self._slots

    def confined(self, rec: SnapshotRecord, sid: str | None = None) -> Path | None:
        """The path of ``rec``'s file in the snapshot folder, or None (logged) when the record names anything but
        a snapshot file of its own session (of ``sid`` too, where given) there (module docstring, step 5)."""
        name = rec.file
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
        why = None
        if match is None:
            why = "not a snapshot file name in the snapshot folder"
        elif match["sid"] != rec.session or (sid is not None and rec.session != sid):
            why = "the snapshot file of another session"
        elif rec.session.startswith("tmp-"):
            why = "a temporary file"
        if why is None:
            return self.dir / name
        self.stats["refused_records"] += 1
        log.warning("snapshot record of session %r names %r: %s; refused (the file is not read, restored nor "
                    "deleted)", str(rec.session)[:40], str(name)[:120], why)
        return None

    def filename(self, sid: str) -> str:
        if self.versioned:
            return f"{PREFIX}{sid}.{uuid.uuid4().hex[:12]}{SUFFIX}"
        return f"{PREFIX}{sid}{SUFFIX}"

    async def save(self, slot: int, sid: str, tokens: int, served_hashes: list[str], model_identity: str) -> SnapshotRecord:
        async with self.lock(sid):
            return await self._save(slot, sid, tokens, served_hashes, model_identity)

    async def _save(self, slot: int, sid: str, tokens: int, served_hashes: list[str], model_identity: str
                    ) -> SnapshotRecord:
        tmp = f"{self.temp_prefix}{uuid.uuid4().hex}{SUFFIX}"
        final = self.filename(sid)
        t0 = time.monotonic()
        self._writing.add(tmp)
        try:
            saved = await self.slots.save(slot, tmp)
            short = too_short(saved, tokens)
            if short is None and not (self.dir / tmp).stat().st_size:
                short = "an empty file"
            if short is not None:  # the previous snapshot, if any, stays: it is what the session had
                raise SnapshotRejected(f"llama-server saved {short} of slot {slot}, the table expected ~{tokens} "
                                       f"tokens of session {sid[:8]}")
            os.replace(self.dir / tmp, self.dir / final)
        except BaseException:
            (self.dir / tmp).unlink(missing_ok=True)
            raise
        finally:
            self._writing.discard(tmp)
        try:
            os.chmod(self.dir / final, 0o600)
        except PermissionError:  # written by a llama-server running as another user
            log.warning("cannot chmod %s to 0600 (run proxy and llama-server as one user)", final)
        loop = asyncio.get_running_loop()
        size, checksum = await loop.run_in_executor(None, file_checksum, self.dir / final)
        tokens = saved if saved is not None else tokens
        # the index (a shared one answers over the network) and the eviction's listing: in a worker thread
        rec, evicted, stray = await loop.run_in_executor(
            None, self._index_saved, SnapshotRecord(session=sid, file=final, tokens=tokens,
                                                    served_hashes=list(served_hashes), model_identity=model_identity,
                                                    size=size, checksum=checksum))
        self.stats["evictions"] += evicted
        self.stats["stray_temp_removed"] += stray
        self.stats["saves"] += 1
        self.stats["save_ms_total"] += (time.monotonic() - t0) * 1000
        if self.on_timing is not None:
            self.on_timing("save", time.monotonic() - t0)
        log.info("saved slot %d (session %s, %d tokens, %.1f MB) in %.0f ms", slot, sid[:8], tokens,
                 size / 1e6, (time.monotonic() - t0) * 1000)
        return rec

    def _index_saved(self, rec: SnapshotRecord) -> tuple[SnapshotRecord, int, int]:
        """Index a saved file (keeping the previous record's hit count), remove the file it replaces, evict
        beyond the bound. Blocking: run in a worker thread. Returns (record, snapshots evicted, stray temporary
        files removed)."""
        try:
            prev = self.store.snapshot(rec.session)
            if prev is not None:
                rec.hits = prev.hits
            self.store.put_snapshot(rec)
        except StoreError:  # an unindexed file would never be restored nor counted: do not keep it
            (self.dir / rec.file).unlink(missing_ok=True)
            raise
        if prev is not None and prev.file != rec.file:  # a versioned name: the previous file is not indexed any more
            _unlink(self.confined(prev, rec.session))
        evicted, stray = self.evict()
        return rec, evicted, stray

    def on_disk(self, sid: str) -> bool:
        """The session's snapshot file exists (a slot's ``snapshot_current`` is only true while it does: LRU
        eviction, pruning, a failed restore or ``pflash-proxy rm`` from another process delete it)."""
        if not self.versioned:
            return _regular(self.dir / self.filename(sid))
        try:
            rec = self.store.snapshot(sid)
        except StoreError:
            return False  # saved again: harmless
        path = self.confined(rec, sid) if rec is not None else None
        return path is not None and _regular(path)

    def restorable(self, sid: str, model_identity: str) -> SnapshotRecord | None:
        rec = self.store.snapshot(sid)
        if rec is None:
            return None
        path = self.confined(rec, sid)
        if path is None:
            return None
        if rec.model_identity != model_identity:
            log.info("snapshot of session %s belongs to another model/layout; not restoring", sid[:8])
            return None
        if not _regular(path):
            self.stats["damaged"] += 1
            log.warning("snapshot file of session %s is missing; dropped from the index", sid[:8])
            self.store.drop_snapshot(sid)
            return None
        return rec

    def _damage(self, rec: SnapshotRecord) -> str | None:
        """What is wrong with ``rec``'s file compared with what was saved, or None when it is intact."""
        path = self.confined(rec)
        if path is None:
            return "not a file of the snapshot folder"
        try:
            size, checksum = file_checksum(path)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return f"unreadable ({exc})"
        if size != rec.size:
            return f"truncated or rewritten ({size} bytes, {rec.size} when saved)"
        if rec.checksum and checksum != rec.checksum:  # records from before checksums have none
            return f"corrupt ({checksum}, {rec.checksum} when saved)"
        return None

    async def restore(self, slot: int, rec: SnapshotRecord) -> bool:
        """Restore into ``slot``; on any failure delete the snapshot and return False (slot is then empty)."""
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        problem = await loop.run_in_executor(None, self._damage, rec)
        if problem is not None:
            self.stats["damaged"] += 1
            log.warning("snapshot of session %s is %s; dropped without restoring it into slot %d", rec.session[:8],
                        problem, slot)
            await loop.run_in_executor(None, self.delete, rec.session)
            return False
        try:
            restored = await self.slots.restore(slot, rec.file)
        except EngineRefused as exc:
            self.stats["restore_failures"] += 1
            log.warning("restore of session %s into slot %d failed (%s); deleting the snapshot", rec.session[:8],
                        slot, exc)
            await loop.run_in_executor(None, self.delete, rec.session)
            return False
        short = too_short(restored, rec.tokens)
        if short is not None:  # e.g. a file saved from an emptied slot: nothing to announce, nothing to keep
            self.stats["restore_failures"] += 1
            log.warning("restore of session %s into slot %d loaded %s, its record says %d tokens; deleting the "
                        "snapshot", rec.session[:8], slot, short, rec.tokens)
            await loop.run_in_executor(None, self.delete, rec.session)
            return False
        rec.hits += 1
        rec.last_use = time.time()
        try:
            await loop.run_in_executor(None, self.store.put_snapshot, rec)
        except StoreError as exc:  # only the use statistics are lost; the slot was restored
            log.warning("could not record the use of session %s's snapshot: %s", rec.session[:8], exc)
        self.stats["restores"] += 1
        self.stats["restore_ms_total"] += (time.monotonic() - t0) * 1000
        if self.on_timing is not None:
            self.on_timing("restore", time.monotonic() - t0)
        log.info("restored session %s into slot %d (%s tokens) in %.0f ms", rec.session[:8], slot,
                 restored, (time.monotonic() - t0) * 1000)
        return True

    def delete(self, sid: str) -> bool:
        """Drop ``sid``'s snapshot record and unlink its file (only a file the record may name: ``confined``)."""
        rec = self.store.drop_snapshot(sid)
        if rec is None:
            return False
        _unlink(self.confined(rec, sid))
        return True

    def _stray_temp_bytes(self) -> tuple[int, int]:
        """Remove temporary files no save is writing; returns (bytes of those that could not be removed, files
        removed)."""
        left = removed = 0
        for path in self.dir.glob(f"{self.temp_prefix}*{SUFFIX}"):
            if path.name in self._writing:
                continue
            size = 0
            try:
                size = path.stat().st_size
                path.unlink()
                removed += 1
                log.info("removed a stray temporary snapshot %s (%.1f MB) of a cancelled save", path.name, size / 1e6)
            except FileNotFoundError:
                continue
            except OSError:
                left += size
        return left, removed

    def evict(self) -> tuple[int, int]:
        """Delete the least recently used snapshots beyond ``max_bytes`` (stray temporary files first). Blocking
        (the index lists every snapshot record): run in a worker thread. Returns (snapshots evicted, stray
        temporary files removed); the caller counts them."""
        stray, removed = self._stray_temp_bytes()
        snaps = sorted(self.store.snapshots(), key=lambda r: r.last_use)
        total = sum(r.size for r in snaps) + stray
        evicted = 0
        while snaps and total > self.max_bytes:
            victim = snaps.pop(0)
            total -= victim.size
            self.delete(victim.session)
            evicted += 1
            log.info("evicted snapshot of session %s (%.1f MB) to stay under the cache limit", victim.session[:8],
                     victim.size / 1e6)
        return evicted, removed

    def reconcile(self) -> dict[str, int]:
        private_dir(self.dir)
        indexed: dict[str, SnapshotRecord] = {}
        removed_files = dropped = 0
        for rec in self.store.snapshots():
            if self.confined(rec) is not None:
                indexed[rec.file] = rec
            else:  # the record alone goes: whatever it names stays untouched
                self.store.drop_snapshot(rec.session)
                dropped += 1
        for path in self.dir.glob(f"{PREFIX}*{SUFFIX}"):
            if path.name.startswith(f"{PREFIX}tmp-") and not path.name.startswith(self.temp_prefix):
                continue  # another node's save in flight
            if path.name not in indexed:
                path.unlink(missing_ok=True)
                removed_files += 1
        for name, rec in indexed.items():
            if not _regular(self.dir / name):
                self.store.drop_snapshot(rec.session)
                dropped += 1
        if removed_files or dropped:
            log.info("reconciled snapshots: %d orphan files removed, %d missing entries dropped", removed_files,
                     dropped)
        return {"orphans_removed": removed_files, "entries_dropped": dropped}


class SnapshotRejected(Exception):
    """A save that the engine answered with fewer tokens than the slot holds: the file is not kept."""


def too_short(n: object, expected: int) -> str | None:
    """``n`` tokens (what a save wrote, what a restore loaded) described when they are none, or clearly
    fewer than the ``expected`` ones (the last generated token is never in the cache: a few short is normal);
    None when ``n`` is fine or not reported (an older server)."""
    if not isinstance(n, int) or isinstance(n, bool):
        return None
    if n < 1:
        return "0 tokens"
    if n < expected * 0.9 - 8:
        return f"{n} tokens"
    return None


def file_checksum(path: Path) -> tuple[int, str]:
    """(size, ``crc32:…``) of a snapshot file: enough to catch truncation, bit rot and foreign writes."""
    crc = size = 0
    # never through a symbolic link, and never a FIFO or a device (O_NONBLOCK: opening a FIFO does not wait)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path.name} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        while block := f.read(8 << 20):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return size, f"crc32:{crc:08x}"


def _regular(path: Path) -> bool:
    """``path`` is a regular file itself (a symbolic link, even to one, is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _unlink(path: Path | None) -> None:
    """Remove the directory entry ``path`` (never what a link points to); nothing for None or a directory."""
    if path is None:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:  # a directory planted under the name, a read-only folder
        log.warning("could not remove %s: %s", path.name, exc)
