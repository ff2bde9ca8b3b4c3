"""The dialect registry: every API dialect the proxy parses, each with the routes it owns (``Dialect.paths``).

A new dialect is one entry in ``DIALECTS`` plus its own module; the server's routes (``server/routes.py``), the
path lookup (``dialect_for``) and the metrics' route labels (``server/metrics.py``) all read this registry.
"""

from __future__ import annotations

from pflash_proxy.dialects import Dialect
from pflash_proxy.dialects.anthropic import AnthropicDialect
from pflash_proxy.dialects.chat import ChatDialect
from pflash_proxy.dialects.responses import ResponsesDialect

DIALECTS: tuple[type[Dialect], ...] = (ChatDialect, AnthropicDialect, ResponsesDialect)
BY_PATH: dict[str, type[Dialect]] = {path: cls for cls in DIALECTS for path in cls.paths}


def dialect_paths() -> tuple[str, ...]:
    """Every route a registered dialect owns, in registry order."""
    return tuple(BY_PATH)
