"""``previous_response_id`` for the Responses API, which llama-server refuses (400 "does not support").

A client that chains responses sends only the new items and the id of the previous response. The proxy keeps
each response it relayed under its own id (``SessionIndex.put_response``), so an id stands for exactly the items
of its own chain, whoever else's conversation shares its beginning (two conversations that start alike share a
session record until they diverge; their responses never do):
1. ``on_request`` (before the session stage): a ``previous_response_id`` recorded for the request's own owner
   (``identity.credential``) is replaced by the items it stands for, prepended to the new ``input``; the
   conversation is parsed again from the expanded body. The session stage then finds the session as for any
   client that sends its whole history (cache hit included). An id the proxy does not know, or one recorded for
   another credential, is left for llama-server to answer (400: not supported).
2. ``on_response``: a Responses answer (``store`` not false) is recorded as its own entry: owner, session, and
   the items it adds to its parent, the response it continues inside the same session (the expanded
   ``previous_response_id``, or else the session's last response when its items, checked by digest, begin this
   request's items), or all of its items when it has none. So a chain costs its items once, and every entry a
   session recorded goes when that session is pruned, without breaking the chain of any other session.
3. Expansion walks the parents (at most ``_MAX_DEPTH``, every entry of the same owner) and concatenates.
Nothing is written to the session's record: that write, after the answer went out, would race the session's next
turn.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from pflash_proxy.contract import ProxyRequest, RelayResult, ResponseChain, Stage
from pflash_proxy.sessions.index import SessionIndex
from pflash_proxy.sessions.service import SessionService
from pflash_proxy.stats import ChainStats

log = logging.getLogger("pflash_proxy.sessions")

Item = dict[str, Any]  # one item of a Responses input or output (JSON)
_MAX_DEPTH = 100_000  # parents followed when expanding an id (a chain is one session's turns)


class ResponseChainStage(Stage):
    name = "response-chains"

    def __init__(self, sessions: SessionService):
        self.sessions = sessions
        self.counters = {"expanded": 0, "unknown": 0}

    async def on_request(self, req: ProxyRequest) -> None:
        if req.dialect is None or req.dialect.name != "responses":
            return
        owner = self.sessions.owner(req.headers)
        items = _items(req.body.get("input"))
        previous = req.body.get("previous_response_id")
        parent: tuple[str, int] | None = None
        if isinstance(previous, str) and previous:
            found = await self.sessions.index_work(lambda index: expand(index, previous, owner),
                                                   "looking up a previous response")
            if found is None:
                self.counters["unknown"] += 1
                return  # llama-server answers it (400: not supported)
            parent = (previous, len(found))
            items = found + items
            body = {k: v for k, v in req.body.items() if k != "previous_response_id"}
            body["input"] = items
            req.set_body(body)
            req.conversation = req.dialect.parse(body)
            req.conversation_base = body
            req.served_messages = None
            req.log_fields["previous_response"] = previous[:16]
            self.counters["expanded"] += 1
        req.chain = ResponseChain(items, owner, parent)

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        pending, ctx = req.chain, req.session
        final = result.final_json or {}
        inner = final.get("response")
        response: dict[str, Any] = inner if isinstance(inner, dict) else final
        if pending is None or ctx is None or ctx.record is None or result.status != 200 or \
                req.body.get("store") is False or \
                not isinstance(response.get("id"), str) or not isinstance(response.get("output"), list):
            return
        rid, sid = response["id"], ctx.record.id
        all_items = pending.items + [o for o in response["output"] if isinstance(o, dict)]
        await self.sessions.index_work(
            lambda index: record(index, rid, sid, pending.owner, all_items, pending.parent),
            "recording a response")

    def stats(self) -> ChainStats:
        return ChainStats(self.counters["expanded"], self.counters["unknown"])


def expand(store: SessionIndex, rid: str, owner: str | None) -> list[Item] | None:
    """The items response ``rid`` stands for (its chain's inputs and outputs, in order), or None when the proxy
    did not record it for ``owner`` (or a link of its chain is gone)."""
    parts: list[list[Item]] = []
    seen: set[str] = set()
    at: str | None = rid
    while at is not None:
        entry = store.response(at)
        items = entry.get("items") if entry is not None else None
        if entry is None or entry.get("owner") != owner or at in seen or len(seen) >= _MAX_DEPTH \
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


def _items(value: object) -> list[Item]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
