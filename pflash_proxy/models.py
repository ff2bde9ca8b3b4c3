"""Typed views of the request bodies the pipeline understands.

Unknown fields are kept (``extra="allow"``) and the proxy forwards the client's own bytes unless a stage
changes the body, so these models never narrow what a client may send to llama-server. A slot pin the client
sends is checked against the engine's own pin fields (``server.routes.check_pin``), not typed here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

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

    @field_validator("content")
    @classmethod
    def _text_parts_hold_text(cls, v: Any) -> Any:
        if isinstance(v, list):
            for i, part in enumerate(v):
                if isinstance(part, dict) and part.get("type", "text") == "text" and not isinstance(
                        part.get("text"), str):
                    raise ValueError(f"part {i}: a text part's 'text' must be a string")
        return v

    @field_validator("tool_calls")
    @classmethod
    def _functions_are_objects(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, call in enumerate(v or ()):
            if "function" in call and not isinstance(call["function"], dict):
                raise ValueError(f"call {i}: 'function' must be an object with 'name' and 'arguments'")
        return v


class ChatCompletionRequest(_Open):
    messages: list[ChatMessage]
    model: str | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None


class CompletionRequest(_Open):
    prompt: Any = None
    stream: bool = False


def message_text(content: Any) -> str:
    """The text of a message's content (string or OpenAI content parts); non-text parts are skipped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
