"""The session index: what the proxy keeps about sessions, responses and snapshots, behind one protocol.

- ``base``: the ``SessionIndex`` protocol (and ``ClusterIndex``, the one several nodes share), the records it keeps
  (``SessionRecord``, ``SnapshotRecord``, ``TraceLog``), ``StoreError`` and ``run`` (where a call made from the
  event loop runs);
- ``codec``: the one stored format of the indexes' values (schema-versioned JSON, validated when read, never a
  pickle), and the parts a record keeps under keys of its own;
- ``local``: the embedded backend, ``SessionStore`` (one diskcache/SQLite directory per proxy);
- ``redis``: the shared backend, ``RedisIndex`` (``--index redis://HOST:PORT/DB``).

The backends import ``base`` and ``codec``, never this package's ``__init__``; ``open_index`` here picks one.
"""

from __future__ import annotations

from pathlib import Path

from pflash_proxy.sessions.index.base import (ClusterIndex, SessionIndex, SessionRecord, SnapshotRecord, StoreError,
                                              TraceLog, run)

__all__ = ["ClusterIndex", "SessionIndex", "SessionRecord", "SnapshotRecord", "StoreError", "TraceLog", "open_index",
           "run"]


def open_index(home: Path, url: str | None = None) -> SessionIndex:
    """The session index: the embedded diskcache one in the state directory ``home``, or, with ``url``
    (``--index redis://HOST:PORT/DB``), the one several nodes share (its client is imported only then)."""
    if url and url != "embedded":
        from pflash_proxy.sessions.index.redis import RedisIndex

        return RedisIndex(url)
    from pflash_proxy.sessions.index.local import SessionStore

    return SessionStore(home / "sessions")
