"""``DiskcacheReader``: reads the session index older proxies kept with diskcache (``cache.db``), with ``sqlite3``.

``serve`` copies such an index into SQLite once (``sqlite.migrate``); ``ls``/``rm`` read it where it is while an
older proxy may still serve from it. The old index is diskcache's ``Cache`` table: each key a tuple of strings
stored as its pickle bytes, each value bytes, text or a number, inline or (values of 32 KiB and more, in versions
before every value was inline) in a file beside it. Keys are parsed from their bytes, never unpickled (one that
does not parse is skipped); a value stored pickled reads as None. The one write is ``drop_snapshot`` (``rm``).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from pflash_proxy.sessions.index.base import SnapshotRecord
from pflash_proxy.sessions.index.codec import Key, snapshot_records

log = logging.getLogger("pflash_proxy.sessions")

FILE = "cache.db"
_RAW, _BINARY, _TEXT, _PICKLE = 1, 2, 3, 4  # diskcache's value modes: inline, a file of bytes or text, a pickle
_STRING_OPS = {0x8C: 1, 0x58: 4}  # pickle's SHORT_BINUNICODE (1-byte length), BINUNICODE (4-byte length)


def parse_key(data: bytes) -> Key | None:
    """The tuple of 1-3 strings that protocol-5 pickle bytes spell (diskcache's key bytes, optimized or not),
    read without unpickling; None for any other bytes."""
    if data[:2] != b"\x80\x05":
        return None
    i = 2
    if data[i:i + 1] == b"\x95":  # FRAME + 8-byte length
        i += 9
    items: list[str] = []
    while i < len(data):
        op = data[i]
        if op in _STRING_OPS:
            n = _STRING_OPS[op]
            size = int.from_bytes(data[i + 1:i + 1 + n], "little")
            start = i + 1 + n
            raw = data[start:start + size]
            if len(raw) != size:
                return None
            try:
                items.append(raw.decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                return None
            i = start + size
        elif op == 0x94:  # MEMOIZE
            i += 1
        elif op in (0x85, 0x86, 0x87) and len(items) == op - 0x84 and data[i + 1:] in (b".", b"\x94."):
            return tuple(items)  # TUPLE1-3, then STOP
        else:
            return None
    return None


class DiskcacheReader:
    """The diskcache index in ``directory`` (module docstring). Opening raises ``sqlite3.DatabaseError`` for a
    file that is no database or has no ``Cache`` table."""

    remote = False

    def __init__(self, directory: Path):
        self.dir = directory
        self.conn = sqlite3.connect(directory / FILE, timeout=60, isolation_level=None, check_same_thread=False)
        try:
            self.conn.execute("SELECT rowid, key, raw, mode, filename, value FROM Cache LIMIT 0").fetchall()
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def as_cluster(self) -> None:
        return None

    def _rows(self, kind: str | None = None) -> Iterator[tuple[int, Key, object]]:
        """(rowid, key, value) of every key, or of those whose first part is ``kind``."""
        sql = "SELECT rowid, key, mode, filename, value FROM Cache WHERE raw = 0"
        args: tuple[bytes, ...] = ()
        if kind is not None:  # a key's bytes spell its parts: the rows that cannot be of ``kind`` are not read
            sql, args = sql + " AND instr(key, ?) > 0", (kind.encode(),)
        for rowid, key, mode, filename, value in self.conn.execute(sql, args).fetchall():
            parsed = parse_key(bytes(key)) if isinstance(key, bytes) else None
            if parsed is not None and (kind is None or parsed[0] == kind):
                yield rowid, parsed, self._value(mode, filename, value)

    def items(self) -> dict[Key, object]:
        """Every key with its value (None: stored pickled, or its file is gone or outside the directory)."""
        return {key: value for _, key, value in self._rows()}

    def _value(self, mode: object, filename: object, value: object) -> object:
        if mode == _RAW:
            return value
        if mode in (_BINARY, _TEXT) and isinstance(filename, str):
            path = (self.dir / filename).resolve()
            if not path.is_relative_to(self.dir.resolve()):
                return None
            try:
                return path.read_bytes() if mode == _BINARY else path.read_text("utf-8")
            except (OSError, UnicodeDecodeError):
                return None
        if mode == _PICKLE:
            log.warning("session index: a value stored pickled (by an older version) is ignored")
        return None

    def snapshots(self) -> list[SnapshotRecord]:
        rows = ((key[1], value) for _, key, value in self._rows("snapshot") if len(key) == 2)
        return list(snapshot_records(rows).values())

    def drop_snapshot(self, sid: str) -> SnapshotRecord | None:
        """Delete the session's snapshot record (its row, as diskcache does); returns it."""
        for rowid, key, value in self._rows("snapshot"):
            if key == ("snapshot", sid):
                self.conn.execute("DELETE FROM Cache WHERE rowid = ?", (rowid,))
                return snapshot_records([(sid, value)]).get(sid)
        return None
