"""``OldIndex`` writes a session index as the diskcache backend of older versions did (``local.SessionStore`` before
it was removed; git history keeps it), with diskcache itself: its ``Disk`` pickles the tuple keys into the very
bytes that backend wrote, and keeps values of 32 KiB and more in files, as versions before every value was inline
did. The values are this version's records (``codec.encode``), under that backend's keys."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

import diskcache

from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.index.base import SessionRecord, SnapshotRecord, TraceLog, begin_save
from pflash_proxy.sessions.index.codec import RecordParts, TraceParts, encode


class OldIndex:
    def __init__(self, directory: Path):
        self.cache = diskcache.Cache(str(directory))
        self.cache.add(("salt",), secrets.token_hex(16))
        self.salt: str = self.cache.get(("salt",))
        self.parts = RecordParts()

    def close(self) -> None:
        self.cache.close()

    def save(self, seed: str, messages: Sequence[dict[str, object]], owner: str | None = None,
             recall_sources: Sequence[object] = ()) -> SessionRecord:
        """A new session of ``messages``, saved as that backend's ``save_session`` did."""
        rec = SessionRecord.new(seed, False, owner=owner)
        rec.recall_sources = list(recall_sources)  # type: ignore[arg-type]
        entries = begin_save(rec, [message_hash(m) for m in messages], [dict(m) for m in messages])
        with self.cache.transact():
            for key, value in self.parts.new(rec).values:
                self.cache.set(key, value)
            self.cache.set(("session", rec.id), encode("session", rec))
            self.cache.set(("used", rec.id), rec.last_use)
            for h in entries:
                self.cache.set(("chain", h), rec.id)
        return rec

    def update_trace_log(self, sid: str, update: Callable[[TraceLog], TraceLog]) -> TraceLog:
        write = TraceParts.update(sid, TraceLog(), update)
        for key, data in write.writes:
            self.cache.set(key, data)
        self.cache.set(("traces", sid), write.log)
        return write.new

    def put_response(self, rid: str, entry: dict[str, object]) -> None:
        sid = str(entry["session"])
        ids = [*self._ids(sid), rid]
        self.cache.set(("responses", sid), encode("ids", ids))
        self.cache.set(("response", rid), encode("response", entry))

    def _ids(self, sid: str) -> list[str]:
        from pflash_proxy.sessions.index.codec import decode

        data = self.cache.get(("responses", sid))
        return (decode("ids", data) or []) if data else []

    def put_snapshot(self, rec: SnapshotRecord) -> None:
        self.cache.set(("snapshot", rec.session), encode("snapshot", rec))
