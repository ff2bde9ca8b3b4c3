"""``previous_response_id`` for the Responses API, which llama-server refuses (400 "does not support").

A client that chains responses sends only the new items and the id of the previous response. The proxy keeps,
per session, the items of its conversation (what the client sent, then the answer's output items), and which
prefix of them each response id ends:
1. ``on_request`` (before the session stage): a known ``previous_response_id`` is replaced by the items it
   stands for, prepended to the new ``input``; the conversation is parsed again from the expanded body. The
   session stage then finds the session as for any client that sends its whole history (cache hit included).
   An id the proxy does not know is left for llama-server to answer.
2. ``on_response``: a Responses answer's ``id`` and ``output`` items are recorded with the session.
The items live under their own key per session (``("response-items", sid)``: the items and the length each
response id ends at), pruned with the session, and never rewrite the session's record: that write, after the
answer went out, would race the session's next turn.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pflash_proxy.server.pipeline import ProxyRequest, Stage
from pflash_proxy.server.relay import RelayResult
from pflash_proxy.sessions.manager import SessionManager
from pflash_proxy.sessions.store import StoreError

log = logging.getLogger("pflash_proxy.sessions")

_MAX_IDS = 256


class ResponseChainStage(Stage):
    name = "response-chains"

    def __init__(self, manager: SessionManager):
        self.manager = manager
        self.counters = {"expanded": 0, "unknown": 0}

    async def on_request(self, req: ProxyRequest) -> None:
        if req.dialect is None or req.dialect.name != "responses":
            return
        items = _items(req.body.get("input"))
        previous = req.body.get("previous_response_id")
        if isinstance(previous, str) and previous:
            try:
                found = await asyncio.get_running_loop().run_in_executor(None, self._lookup, previous)
            except StoreError as exc:
                self.manager.store_failed("looking up a previous response", exc)
                found = None
            if found is None:
                self.counters["unknown"] += 1
                return  # llama-server answers it (400: not supported)
            items = found + items
            body = {k: v for k, v in req.body.items() if k != "previous_response_id"}
            body["input"] = items
            req.set_body(body)
            req.conversation = req.dialect.parse(body)
            req.conversation_base = body
            req.served_messages = None
            req.log_fields["previous_response"] = previous[:16]
            self.counters["expanded"] += 1
        req.state[self.name] = items

    def _lookup(self, rid: str) -> list[dict] | None:
        store = self.manager.store
        where = store.read(("response", rid))
        stored = store.read(("response-items", where[0])) if where else None
        if not stored:
            return None
        n = stored["ids"].get(rid)
        return list(stored["items"][:n]) if n is not None and n <= len(stored["items"]) else None

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        items = req.state.get(self.name)
        ctx = req.state.get("sessions")
        final = result.final_json or {}
        response = final.get("response") if isinstance(final.get("response"), dict) else final
        if items is None or ctx is None or ctx.record is None or result.status != 200 or \
                not isinstance(response.get("id"), str) or not isinstance(response.get("output"), list):
            return
        sid, rid = ctx.record.id, response["id"]
        all_items = items + [o for o in response["output"] if isinstance(o, dict)]
        store = self.manager.store

        def save() -> None:
            old = store.read(("response-items", sid)) or {"ids": {}}
            ids = {**old["ids"], rid: len(all_items)}
            store.write(("response-items", sid), {"items": all_items, "ids": dict(list(ids.items())[-_MAX_IDS:])})
            store.write(("response", rid), (sid,))
        try:
            await asyncio.get_running_loop().run_in_executor(None, save)
        except StoreError as exc:
            self.manager.store_failed("recording a response", exc)

    def stats(self) -> dict[str, Any]:
        return {"previous_response_expanded": self.counters["expanded"],
                "previous_response_unknown": self.counters["unknown"]}


def _items(value: Any) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
