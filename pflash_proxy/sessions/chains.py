"""``previous_response_id`` for the Responses API, which llama-server refuses (400 "does not support").

A client that chains responses sends only the new items and the id of the previous response. The proxy keeps,
per session, the items of its conversation (what the client sent, then the answer's output items), and which
prefix of them each response id ends:
1. ``on_request`` (before the session stage): a known ``previous_response_id`` is replaced by the items it
   stands for, prepended to the new ``input``; the conversation is parsed again from the expanded body. The
   session stage then finds the session as for any client that sends its whole history (cache hit included).
   An id the proxy does not know is left for llama-server to answer.
2. ``on_response``: a Responses answer's ``id`` and ``output`` items are recorded with the session.
The items live in the session's record (``extra``), so they are pruned with it.
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

ITEMS_KEY = "responses_items"  # SessionRecord.extra: the conversation as Responses items
IDS_KEY = "responses_ids"  # SessionRecord.extra: {response id: number of items it ends}
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
        where = self.manager.store.cache.get(("response", rid))
        if not where:
            return None
        rec = self.manager.store.get(where[0])
        if rec is None:
            return None
        items = rec.extra.get(ITEMS_KEY) or []
        n = (rec.extra.get(IDS_KEY) or {}).get(rid)
        return list(items[:n]) if n is not None and n <= len(items) else None

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        items = req.state.get(self.name)
        ctx = req.state.get("sessions")
        final = result.final_json or {}
        response = final.get("response") if isinstance(final.get("response"), dict) else final
        if items is None or ctx is None or ctx.record is None or result.status != 200 or \
                not isinstance(response.get("id"), str) or not isinstance(response.get("output"), list):
            return
        rec = ctx.record
        all_items = items + [o for o in response["output"] if isinstance(o, dict)]
        ids = dict(rec.extra.get(IDS_KEY) or {})
        ids[response["id"]] = len(all_items)
        rec.extra[ITEMS_KEY] = all_items
        rec.extra[IDS_KEY] = dict(list(ids.items())[-_MAX_IDS:])

        def save() -> None:
            self.manager.store.update_extra(rec)
            self.manager.store.cache.set(("response", response["id"]), (rec.id,))
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
