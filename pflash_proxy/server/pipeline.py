"""The request pipeline of the parsed routes: an ordered list of small stages, each one feature.

1. The route handler parses the body into a typed model and builds a ``ProxyRequest``.
2. Each stage's ``on_request`` runs in order; a stage may rewrite the body (``set_body``), add response headers,
   or short-circuit with an error.  When no stage changes the body the client's original bytes are forwarded.
3. The response is relayed; then each stage's ``on_response`` sees the ``RelayResult`` (final timings, usage).
4. ``on_finish`` runs for every stage whose ``on_request`` ran, in reverse order, whatever happened (release a
   slot, unlock a session).  Stage failures here are logged, never raised to the client.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from multidict import CIMultiDictProxy

from pflash_proxy.server.relay import RelayResult

log = logging.getLogger("pflash_proxy.pipeline")

RouteKind = Literal["chat", "completion", "generating"]  # generating: other routes that decode in a slot


@dataclass
class ProxyRequest:
    kind: RouteKind
    method: str
    path_qs: str
    headers: CIMultiDictProxy[str]
    raw_body: bytes
    body: dict[str, Any]
    model: Any  # ChatCompletionRequest | CompletionRequest
    received_at: float = field(default_factory=time.monotonic)
    changed: bool = False
    response_headers: dict[str, str] = field(default_factory=dict)
    log_fields: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # per-stage scratch space, keyed by stage name
    progress: str = "preparing the request"  # what the pipeline is doing now, for streaming clients' keep-alives
    # Fields added to an otherwise untouched body (e.g. ``id_slot``): spliced into the client's bytes.
    added_fields: dict[str, Any] = field(default_factory=dict)
    # The conversation routes (chat, Anthropic Messages, Responses): the dialect that translates the body, and
    # the internal conversation the stages work on (see ``pflash_proxy.dialects``).
    dialect: Any = None
    conversation: Any = None
    conversation_base: dict[str, Any] = field(default_factory=dict)  # the body the conversation was parsed from
    served_messages: list[dict] | None = None  # what set_messages last served (None: the client's own)

    @property
    def messages(self) -> list[dict]:
        return self.conversation.messages if self.served_messages is None else self.served_messages

    def set_messages(self, messages: list[dict]) -> None:
        """Serve ``messages`` (only their content may differ), written back into the client's own dialect.

        Always from the body as parsed, with the whole list: a write-back that merges text blocks shifts the
        positions later messages were parsed at, so changes are never stacked on an already rewritten body.
        Keys other stages set meanwhile (``id_slot``) are kept."""
        if messages == self.messages:
            return
        rewritten = self.dialect.write_back(self.conversation_base, self.conversation, messages)
        body = dict(self.body)
        body.update({k: v for k, v in rewritten.items() if self.conversation_base.get(k) is not v})
        self.set_body(body)
        self.served_messages = list(messages)

    def chat_body(self) -> dict:
        """The conversation as a chat-completions body (exact token counts for any dialect)."""
        return self.dialect.chat_body(self.body, self.messages)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def set_body(self, body: dict[str, Any]) -> None:
        self.body = body
        self.changed = True

    def set_field(self, key: str, value: Any) -> None:
        if key in self.body and self.body[key] == value:
            return
        new = dict(self.body)
        new[key] = value
        if key in self.body or self.changed:
            self.set_body(new)
        else:
            self.body = new
            self.added_fields[key] = value

    def forward_bytes(self) -> bytes:
        if self.changed:
            return json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if not self.added_fields:
            return self.raw_body
        # Keep the client's bytes (key order, escapes, spacing) and splice the new keys in after the "{".
        start = self.raw_body.index(b"{") + 1
        rest = self.raw_body[start:]
        added = json.dumps(self.added_fields, separators=(",", ":")).encode()[1:-1]
        sep = b"" if rest.strip() == b"}" else b","
        return self.raw_body[:start] + added + sep + rest


class Stage:
    """Base class: override what you need."""

    name = "stage"

    async def on_request(self, req: ProxyRequest) -> None:
        return None

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        return None

    async def on_finish(self, req: ProxyRequest) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}


class Pipeline:
    def __init__(self, stages: list[Stage] | None = None):
        self.stages: list[Stage] = list(stages or [])

    async def run_request(self, req: ProxyRequest) -> list[Stage]:
        """Run ``on_request`` in order; returns the stages that ran (for ``finish``), even on error."""
        ran: list[Stage] = []
        req.state["_ran"] = ran
        for stage in self.stages:
            ran.append(stage)
            await stage.on_request(req)
        return ran

    async def run_response(self, req: ProxyRequest, result: RelayResult) -> None:
        for stage in req.state.get("_ran", []):
            try:
                await stage.on_response(req, result)
            except Exception:
                log.exception("stage %s failed in on_response", stage.name)

    async def finish(self, req: ProxyRequest) -> None:
        for stage in reversed(req.state.get("_ran", [])):
            try:
                await stage.on_finish(req)
            except Exception:
                log.exception("stage %s failed in on_finish", stage.name)
