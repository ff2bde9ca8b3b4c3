"""The session index: what the proxy keeps about sessions, responses and snapshots, behind one protocol.

- ``base``: the ``SessionIndex`` protocol (``ClusterIndex``: the one several nodes share), its records,
  ``StoreError`` and ``run`` (where a call made from the event loop runs);
- ``codec``: the stored format of every value (schema-versioned JSON, validated when read, never a pickle);
- ``sqlite``: ``SqliteIndex``, this proxy's own index (SQLite tables in ``--home``);
- ``redis``: ``RedisIndex``, the index several nodes share (``--index redis://HOST:PORT/DB``);
- ``legacy``: ``DiskcacheReader``, which reads the diskcache index of older versions (migration, ``ls``/``rm``).

The modules import ``base`` and ``codec``, never this ``__init__``; ``open_index`` here picks a backend.
"""

from __future__ import annotations

from pathlib import Path

from pflash_proxy.sessions.index.base import (ClusterIndex, SessionIndex, SessionRecord, SnapshotRecord, StoreError,
                                              TraceLog, run)
from pflash_proxy.sessions.trace_records import Trace  # what a trace log holds, by kind

__all__ = ["ClusterIndex", "SessionIndex", "SessionRecord", "SnapshotRecord", "StoreError", "Trace", "TraceLog",
           "open_index", "run"]


def open_index(home: Path, url: str | None = None) -> SessionIndex:
    """The SQLite index in ``home/sessions`` (``url`` None, ``embedded`` or ``sqlite``), else the Redis index at
    ``url`` (its client is imported only then)."""
    if url in (None, "", "embedded", "sqlite"):
        from pflash_proxy.sessions.index.sqlite import SqliteIndex

        return SqliteIndex(home / "sessions")
    from pflash_proxy.sessions.index.redis import RedisIndex

    return RedisIndex(str(url))
