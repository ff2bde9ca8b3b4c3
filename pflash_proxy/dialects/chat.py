"""OpenAI chat completions: the internal conversation IS the ``messages`` list (identity translation).

Types are checked by ``models.ChatCompletionRequest`` before ``parse``; ``parse`` refuses a body nested deeper
than ``MAX_DEPTH`` (400).
"""

from __future__ import annotations

from pflash_proxy.dialects import Conversation, Dialect, changed_indices, check_depth


class ChatDialect(Dialect):
    name = "chat"

    def parse(self, body: dict) -> Conversation:
        check_depth(body)
        messages = [m if isinstance(m, dict) else dict(m) for m in body["messages"]]
        return Conversation(messages, list(range(len(messages))))

    def write_back(self, body: dict, conv: Conversation, messages: list[dict]) -> dict:
        changed_indices(conv.messages, messages)  # only content may change
        return {**body, "messages": list(messages)}

    def chat_body(self, body: dict, messages: list[dict]) -> dict:
        return {**body, "messages": messages}
