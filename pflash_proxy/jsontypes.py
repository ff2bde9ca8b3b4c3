"""Types for JSON the proxy parses, builds or passes through without reading every field.

``JSONValue`` is what ``json.loads`` can return, and what ``json.dumps`` takes: the containers are read-only
(``Sequence``/``Mapping``), so a ``list[int]`` or a ``dict[str, str]`` built by the code is a ``JSONValue`` as it is.
``JSONObject`` is a JSON object being built or passed on (a mutable ``dict``). Code that reads a field narrows it
(``isinstance``) or, for a shape it knows, reads it through a ``TypedDict``: ``ChatMessage`` is an OpenAI chat
message as the proxy's own code writes one (the bench's cases, the agents' scripted turns); a client's message is
whatever it sent and stays a ``JSONObject``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias, TypedDict, Union

JSONScalar: TypeAlias = Union[None, bool, int, float, str]
JSONValue: TypeAlias = Union[JSONScalar, Sequence["JSONValue"], Mapping[str, "JSONValue"]]
JSONObject: TypeAlias = dict[str, JSONValue]
JSONArray: TypeAlias = list[JSONValue]



class FunctionCall(TypedDict):
    name: str
    arguments: str  # the arguments as a JSON text


class ToolCall(TypedDict):
    id: str
    type: str  # "function"
    function: FunctionCall


class ContentPart(TypedDict, total=False):
    type: str  # "text", "image_url", ...
    text: str


class ChatMessage(TypedDict, total=False):
    role: str
    content: str | list[ContentPart] | None
    tool_calls: list[ToolCall]
    tool_call_id: str
    name: str


__all__ = ["ChatMessage", "ContentPart", "FunctionCall", "JSONArray", "JSONObject", "JSONScalar", "JSONValue",
           "ToolCall"]
