"""The dialect registry: every API dialect the proxy parses, each with the routes it owns (``Dialect.paths``).

A new dialect is one entry in ``DIALECTS`` plus its own module; the server's routes (``server/routes.py``), the
path lookup (``dialect_for``, ``stream_style_for``) and the metrics' route labels (``server/metrics.py``) all read
this registry. The package (``dialects/__init__``) holds what the dialects share and imports none of them.
"""

from __future__ import annotations

from pflash_proxy.dialects import Dialect, OpenAIStream, StreamStyle
from pflash_proxy.dialects.anthropic import AnthropicDialect
from pflash_proxy.dialects.chat import ChatDialect
from pflash_proxy.dialects.responses import ResponsesDialect

DIALECTS: tuple[type[Dialect], ...] = (ChatDialect, AnthropicDialect, ResponsesDialect)
BY_PATH: dict[str, type[Dialect]] = {path: cls for cls in DIALECTS for path in cls.paths}


_PLAIN = StreamStyle()


def dialect_for(path: str) -> Dialect | None:
    """The dialect whose conversation a route carries (None: no conversation, e.g. ``/completion``)."""
    cls = BY_PATH.get(path)
    return cls() if cls is not None else None


def stream_style_for(path: str) -> StreamStyle:
    """How a route's answers stream: its dialect's style, OpenAI's for the completions routes, else plain."""
    dialect = dialect_for(path)
    if dialect is not None:
        return dialect.stream_style
    return OpenAIStream() if path in ("/v1/completions", "/completions") else _PLAIN


def dialect_paths() -> tuple[str, ...]:
    """Every route a registered dialect owns, in registry order."""
    return tuple(BY_PATH)
