"""``previous_response_id`` for the Responses API, which llama-server refuses (400 "does not support").

A client that chains responses sends only the new items and the id of the previous response; the session service
keeps each response the proxy relayed under its own id (``sessions/chains.py``).
- ``on_request`` (before the session stage): a ``previous_response_id`` recorded for the request's own owner
  (``identity.credential``) is replaced by the items it stands for (``SessionService.expand_chain``), prepended to
  the new ``input``; the conversation is parsed again from the expanded body. The session stage then finds the
  session as for any client that sends its whole history (cache hit included). An id the proxy does not know, or one
  recorded for another credential, is left for llama-server to answer (400: not supported).
- ``on_response``: a Responses answer (``store`` not false) is recorded (``SessionService.record_response``).
Nothing is written to the session's record: that write, after the answer went out, would race the session's next
turn.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pflash_proxy.contract import ProxyRequest, RelayResult, ResponseChain, Stage
from pflash_proxy.sessions.chains import Item
from pflash_proxy.sessions.service import SessionService
from pflash_proxy.stats import ChainStats

log = logging.getLogger(__name__)


class ResponseChainStage(Stage):
    name = "response-chains"

    def __init__(self, sessions: SessionService):
        self.sessions = sessions
        self.counters = {"expanded": 0, "unknown": 0}

    async def on_request(self, req: ProxyRequest) -> None:
        if req.dialogue.dialect is None or req.dialogue.dialect.name != "responses":
            return
        owner = self.sessions.owner(req.headers)
        items = _items(req.body.get("input"))
        previous = req.body.get("previous_response_id")
        parent: tuple[str, int] | None = None
        if isinstance(previous, str) and previous:
            found = await self.sessions.expand_chain(previous, owner)
            if found is None:
                self.counters["unknown"] += 1
                return  # llama-server answers it (400: not supported)
            parent = (previous, len(found))
            items = found + items
            body = {k: v for k, v in req.body.items() if k != "previous_response_id"}
            body["input"] = items
            req.set_body(body)
            req.dialogue.conversation = req.dialogue.dialect.parse(body)
            req.dialogue.base = body
            req.dialogue.served = None
            req.log_fields["previous_response"] = previous[:16]
            self.counters["expanded"] += 1
        req.notes.chain = ResponseChain(items, owner, parent)

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        pending, ctx = req.notes.chain, req.notes.session
        final: Mapping[str, object] = result.final_json or {}
        inner = final.get("response")
        response = inner if isinstance(inner, dict) else final
        rid, output = response.get("id"), response.get("output")
        if pending is None or ctx is None or ctx.turn.record is None or result.status != 200 or \
                req.body.get("store") is False or not isinstance(rid, str) or not isinstance(output, list):
            return
        all_items = pending.items + [o for o in output if isinstance(o, dict)]
        await self.sessions.record_response(rid, ctx.turn.record.id, pending.owner, all_items, pending.parent)

    def stats(self) -> ChainStats:
        return ChainStats(self.counters["expanded"], self.counters["unknown"])


def _items(value: object) -> list[Item]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
