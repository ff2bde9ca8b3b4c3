"""Types for JSON the proxy parses, builds or passes through without reading every field.

``JSONValue`` is what ``json.loads`` can return, and what ``json.dumps`` takes: the containers are read-only
(``Sequence``/``Mapping``), so a ``list[int]`` or a ``dict[str, str]`` built by the code is a ``JSONValue`` as it is.
``JSONObject`` is a JSON object being built or passed on (a mutable ``dict``). Code that reads a field narrows it
(``isinstance``) or, for a shape it knows, reads it through a ``TypedDict``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias, Union

JSONScalar: TypeAlias = Union[None, bool, int, float, str]
JSONValue: TypeAlias = Union[JSONScalar, Sequence["JSONValue"], Mapping[str, "JSONValue"]]
JSONObject: TypeAlias = dict[str, JSONValue]
JSONArray: TypeAlias = list[JSONValue]

__all__ = ["JSONArray", "JSONObject", "JSONScalar", "JSONValue"]
