"""Responses chains in the session index (``previous_response_id``, which llama-server refuses): each response the
proxy relayed is kept under its own id (``SessionIndex.put_response``), so an id stands for exactly the items of its
own chain, whoever else's conversation shares its beginning. ``expand`` reads a chain, ``record`` keeps one; both
block (the session service runs them in a worker thread: ``SessionService.expand_chain``/``record_response``).

An entry holds its owner (``identity.credential``), its session, and the items it adds to its parent: the response
it continues inside the same session (the expanded ``previous_response_id``, or else the session's last response
when its items, checked by digest, begin this one's), or all of its items when it has none. So a chain costs its
items once, and every entry a session recorded goes when that session is pruned, without breaking another
session's chain. Expansion walks the parents (at most ``MAX_DEPTH``, every entry of the same owner).
"""

from __future__ import annotations

import hashlib
import json

from pflash_proxy.sessions.index import SessionIndex

Item = dict[str, object]  # one item of a Responses input or output (JSON)
MAX_DEPTH = 100_000  # parents followed when expanding an id (a chain is one session's turns)


def expand(store: SessionIndex, rid: str, owner: str | None) -> list[Item] | None:
    """The items response ``rid`` stands for (its chain's inputs and outputs, in order), or None when the proxy
    did not record it for ``owner`` (or a link of its chain is gone)."""
    parts: list[list[Item]] = []
    seen: set[str] = set()
    at: str | None = rid
    while at is not None:
        entry = store.response(at)
        items = entry.get("items") if entry is not None else None
        if entry is None or entry.get("owner") != owner or at in seen or len(seen) >= MAX_DEPTH \
                or not isinstance(items, list):
            return None
        seen.add(at)
        parts.append(items)
        parent = entry.get("parent")
        at = parent if isinstance(parent, str) else None
    return [item for part in reversed(parts) for item in part]


def record(store: SessionIndex, rid: str, sid: str, owner: str | None, items: list[Item],
           parent: tuple[str, int] | None) -> None:
    """Record response ``rid`` of session ``sid``: ``items`` is its whole chain; ``parent`` the expanded
    ``previous_response_id`` and how many of ``items`` it stands for."""
    base: tuple[str, int] | None = None
    if parent is not None:
        entry = store.response(parent[0])
        if entry is not None and entry.get("session") == sid and entry.get("owner") == owner:
            base = parent
    if base is None and (last := store.last_response(sid)) is not None and last != rid:
        entry = store.response(last)  # a client that sends its whole history: the session's last answer
        n = entry.get("n") if entry is not None else None
        if entry is not None and isinstance(n, int) and 0 < n <= len(items) and entry.get("owner") == owner \
                and entry.get("digest") == digest(items[:n]):
            base = (last, n)
    start = base[1] if base is not None else 0
    store.put_response(rid, {"session": sid, "owner": owner, "parent": base[0] if base is not None else None,
                             "items": items[start:], "n": len(items), "digest": digest(items)})


def digest(items: list[Item]) -> str:
    blob = json.dumps(items, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()
