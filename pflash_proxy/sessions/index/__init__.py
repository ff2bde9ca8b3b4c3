"""The session index: what the proxy keeps about sessions, responses and snapshots, behind one protocol.

- ``base``: the ``SessionIndex`` protocol (and ``ClusterIndex``, the one several nodes share), the records it keeps
  (``SessionRecord``, ``SnapshotRecord``, ``TraceLog``), ``StoreError`` and ``run`` (where a call made from the
  event loop runs);
- ``codec``: the one stored format of the indexes' values (schema-versioned JSON, validated when read, never a
  pickle), and the parts a record keeps under keys of their own;
- ``sqlite``: the embedded backend, ``SqliteIndex`` (plain SQLite tables in ``--home``; it reads a diskcache index
  it finds in its directory once);
- ``local``: the embedded backend before it, ``SessionStore`` (one diskcache directory: tuple keys, a lookup mirror
  in memory), kept as ``--index diskcache``;
- ``redis``: the shared backend, ``RedisIndex`` (``--index redis://HOST:PORT/DB``).

The backends import ``base`` and ``codec``, never this package's ``__init__``; ``open_index`` here picks one.
"""

from __future__ import annotations

from pathlib import Path

from pflash_proxy.sessions.index.base import (ClusterIndex, SessionIndex, SessionRecord, SnapshotRecord, StoreError,
                                              TraceLog, run)

__all__ = ["ClusterIndex", "EMBEDDED", "SessionIndex", "SessionRecord", "SnapshotRecord", "StoreError", "TraceLog",
           "open_index", "run"]

# the embedded backend ``--index embedded`` opens: SQLite tables, no slower than diskcache on any call of a turn and
# far faster to open, list and prune (tests/perf/index_backends.py; docs/results.md)
EMBEDDED = "sqlite"


def open_index(home: Path, url: str | None = None) -> SessionIndex:
    """The session index in the state directory ``home``: the embedded one (``--index embedded``: ``EMBEDDED``;
    ``sqlite`` or ``diskcache`` by name), or, with a URL (``--index redis://HOST:PORT/DB``), the one several nodes
    share (its client is imported only then)."""
    backend = EMBEDDED if url in (None, "", "embedded") else url
    if backend == "sqlite":
        from pflash_proxy.sessions.index.sqlite import SqliteIndex

        return SqliteIndex(home / "sessions")
    if backend == "diskcache":
        from pflash_proxy.sessions.index.local import SessionStore

        return SessionStore(home / "sessions")
    from pflash_proxy.sessions.index.redis import RedisIndex

    return RedisIndex(str(backend))
