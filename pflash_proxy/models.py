"""Typed views of the request bodies the pipeline understands.

Unknown fields are kept (``extra="allow"``) and the proxy forwards the client's own bytes unless a stage
changes the body, so these models never narrow what a client may send to llama-server.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ChatMessage", "ChatCompletionRequest", "CompletionRequest", "ValidationError", "message_text"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessage(_Open):
    # Only what the pipeline relies on is typed strictly; llama-server validates the rest itself, with its
    # own error messages, so a client sees the same errors through the proxy as without it.
    role: str
    content: Any = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionRequest(_Open):
    messages: list[ChatMessage]
    model: str | None = None
    stream: bool = False
    id_slot: int | None = None
    tools: list[dict[str, Any]] | None = None


class CompletionRequest(_Open):
    prompt: Any = None
    stream: bool = False
    id_slot: int | None = None


def message_text(content: Any) -> str:
    """The text of a message's content (string or OpenAI content parts); non-text parts are skipped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
