"""The inspector's trace records, one typed definition of each kind: what ``sessions.traces`` (compression, recall,
cache) and ``stages.savings`` (turn) build, the trace log stores, and the inspector (``inspector.data``, its page's
JS) and ``pflash-proxy show`` read. ``sessions/traces.py`` says what each field means.

They are ``TypedDict``s: at run time a record is the plain dict it always was (JSON values only, in the order its
writer lists them), so what the index stores and the API serves is unchanged; mypy checks that the writers build
every field and that the readers name fields that exist. A record that has been stored comes back as the JSON it was
(``TraceLog.traces``: a ``JSONObject``, possibly of version 1 or missing a field a later version added): readers
read it with ``.get`` through these types, never trusting a field to be there.

``sessions.index`` re-exports ``Trace`` beside ``TraceLog``: the contract's ``TurnTraces`` names it from there (the
contract names only the types the stages hand each other, ``tests/test_layout.py``).

The ``...View`` types are a kind as the session page's API serves it (``inspector.data``) and ``pflash-proxy show``
reads it: the stored record less its version ``v`` (a compression trace's units as objects, its text as lines).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict, cast

from pflash_proxy.jsontypes import JSONObject

__all__ = ["TraceRequest", "TraceUnits", "CompressionTrace", "UnitView", "CompressionView", "RecallExcerpt", "RecallView", "RecallTrace",
           "CacheView", "CacheTrace", "TurnMessage", "TokensByCause", "SecondsByCause", "TurnView", "TurnTrace",
           "Trace", "Cause", "as_stored"]

Cause: TypeAlias = Literal["compression", "cache"]  # the causes of tokens avoided (``stages.savings.CAUSES``)


class TraceRequest(TypedDict):
    """The request a compression aimed at: where it came from, its text (its last ``traces.REQUEST_CHARS``), the
    pinned tail tokens, the message's lines it occupies (0-based, end exclusive; None: not in the message)."""

    source: str
    pinned_tail_tokens: int
    text: str
    truncated: bool
    lines: list[int] | None


class TraceUnits(TypedDict):
    """A compressed message's units as columns: line ranges (0-based, end exclusive), tokens, score."""

    start: list[int]
    end: list[int]
    tokens: list[int]
    score: list[float]


class _CompressionHead(TypedDict):
    """What a compression trace and its view share."""

    kind: Literal["compression"]
    turn: int
    message: int  # 0-based
    role: str | None
    at: float
    mode: str
    reason: str | None
    scorer: str
    segmenter: str
    message_tokens: int
    served_tokens: int
    budget: int
    selection_budget: int
    prompt_tokens: int
    uncached_tokens: int
    gutter: str | None
    spread: float | None
    stage_ms: dict[str, float]
    n_lines: int
    request: TraceRequest


class CompressionTrace(_CompressionHead):
    """A compressed message, or one served whole with a reason (``traces.record_compression``)."""

    v: int
    text: str | None  # the original, once; None once dropped (``text_dropped``)
    units: TraceUnits | None
    kept: list[int]
    pinned: list[int]
    text_dropped: NotRequired[bool]  # set when the bounds dropped the text (``codec.drop_text``)


class UnitView(TypedDict):
    """A unit as the API serves it: its lines (0-based, end exclusive), tokens, score, kept and pinned."""

    index: int
    lines: list[int]
    tokens: int
    score: float
    kept: bool
    pinned: bool


class CompressionView(_CompressionHead):
    """A compression trace as the API serves it (``inspector.data.view``): units as objects, the original as lines
    (None once dropped)."""

    units: list[UnitView]
    lines: list[str] | None
    text_dropped: bool


class RecallExcerpt(TypedDict):
    from_message: str
    lines: list[int]
    tokens: int
    units: list[int]
    text: str


class RecallView(TypedDict):
    """A recall trace as the API serves it (its fields in this order: ``inspector.data.view``)."""

    kind: Literal["recall"]
    turn: int
    message: int
    at: float
    share: float
    excerpts: list[RecallExcerpt]


class RecallTrace(RecallView):
    """Recall excerpts prepended to a short turn's message (``traces.record_recall``)."""

    v: int


class CacheView(TypedDict):
    """A cache trace as the API serves it (its fields in this order: ``inspector.data.view``)."""

    kind: Literal["cache"]
    turn: int
    message: int
    at: float
    announced: str
    reported: str
    expected_tokens: int
    cached_tokens: int
    reason: str | None


class CacheTrace(CacheView):
    """A turn whose reuse of the engine's cache was not what the proxy expected (``traces.record_cache``)."""

    v: int


class TurnMessage(TypedDict):
    """A new long message of a turn: its mode, tokens before and served, why it was served whole."""

    message: int
    mode: str
    tokens: int
    served_tokens: int
    why: str | None


class TokensByCause(TypedDict):
    compression: int
    cache: int


class SecondsByCause(TypedDict):
    compression: float | None
    cache: float | None


class TurnView(TypedDict):
    """A turn trace as the API serves it (the session page's ``turns``)."""

    kind: Literal["turn"]
    turn: int
    at: float
    client: str | None
    status: int
    completed: bool
    cache: str
    expected_cached: int
    pflash: str | None
    why: str | None
    messages: list[TurnMessage]
    first_byte_ms: float | None
    queue_ms: float | None
    prepare_ms: float
    compression_ms: float
    cached_tokens: int | None  # the engine's counts and times: None when it reported none
    prefilled_tokens: int | None
    prefill_ms: float | None
    generated_tokens: int | None
    generate_ms: float | None
    tokens_avoided: TokensByCause
    saved_s: SecondsByCause
    rate_tps: float | None


class TurnTrace(TurnView):
    """What a turn saved (``stages.savings.SavingsStage.turn_trace``, priced by ``stages.savings.price``)."""

    v: int


Trace: TypeAlias = CompressionTrace | RecallTrace | CacheTrace | TurnTrace  # one of a turn's traces


def as_stored(trace: Trace) -> JSONObject:
    """A record as the trace log holds it: the same dict (it holds JSON values only), typed as stored JSON."""
    return cast(JSONObject, trace)
