"""The typed counters ``/pflash/stats`` shows: each stage's, the server's, and the whole (``ProxyStats``).

Each is a frozen dataclass that its owner builds when asked (``Stage.stats``); readers (the metrics, the inspector)
read its fields. ``as_json`` is its part of ``/pflash/stats``: the fields by name, nested stats and mappings
converted. Imports nothing of the project at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pflash_proxy.contract import StageStats
    from pflash_proxy.jsontypes import JSONObject, JSONValue

def to_json(value: object) -> JSONValue:
    """``value`` as JSON: an object with ``as_json`` (the stats dataclasses) by it, mappings and sequences element
    by element, scalars as they are."""
    as_json = getattr(value, "as_json", None)
    if callable(as_json):
        out: JSONObject = as_json()
        return out
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"not JSON: {type(value).__name__}")


class Stats:
    """Base of the stats dataclasses: ``as_json`` is ``to_json`` of each field, by name."""

    def as_json(self) -> JSONObject:
        assert is_dataclass(self)
        return {f.name: to_json(getattr(self, f.name)) for f in fields(self)}


# The stages' -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DrafterStats(Stats):
    """The drafter the scorer reads (``drafter.runtime.Drafter``): its file and its passes since start."""

    path: str
    passes: int
    tokens: int
    seconds: float
    cache_hits: int
    aborts: int


@dataclass(frozen=True)
class ScoringStats(Stats):
    """What the compressor scores with (``stages.scorers.Scoring``): the segmenter, the scorer, the attention heads
    an attention scorer reads (None: all; absent for other scorers), and the drafter when one is loaded."""

    segmenter: str
    scorer: str
    attention_heads: list[str] | None = None
    reads_heads: bool = field(default=False, repr=False)  # whether ``attention_heads`` is shown (None means all)
    drafter: DrafterStats | None = None

    def as_json(self) -> JSONObject:
        out: JSONObject = {"segmenter": self.segmenter, "scorer": self.scorer}
        if self.reads_heads:
            out["attention_heads"] = self.attention_heads
        if self.drafter is not None:
            out["drafter"] = self.drafter.as_json()
        return out


@dataclass(frozen=True)
class CompressStats(Stats):
    """The compression stage's (``/pflash/stats`` under ``pflash``): new long messages by what compression did
    (``modes``), the tokens of those compressed and what was kept of them, the threshold and what scores."""

    modes: Mapping[str, int]
    tokens_in: int
    tokens_kept: int
    threshold: int
    scorer: str
    segmenter: str
    scoring: ScoringStats | None = None  # the drafter and attention heads, when a drafter is loaded

    @property
    def compressed(self) -> int:
        return self.modes.get("compressed", 0)

    @property
    def served_whole(self) -> int:
        """Messages served whole for any reason (the ``full-*`` modes)."""
        return sum(n for m, n in self.modes.items() if m.startswith("full-"))

    def as_json(self) -> JSONObject:
        out: JSONObject = {"modes": dict(self.modes), "tokens_in": self.tokens_in, "tokens_kept": self.tokens_kept,
                           "threshold": self.threshold, "scorer": self.scorer, "segmenter": self.segmenter}
        if self.scoring is not None and self.scoring.drafter is not None:
            out["drafter"] = self.scoring.drafter.as_json()
            if self.scoring.reads_heads:
                out["attention_heads"] = self.scoring.attention_heads
        return out


@dataclass(frozen=True)
class ByCause(Stats):
    """A quantity split by what saved it: compression cut it, or the slot's cache held it."""

    compression: float = 0
    cache: float = 0

    def items(self) -> tuple[tuple[str, float], ...]:
        """(cause, value) by cause name."""
        return ("cache", self.cache), ("compression", self.compression)

    @classmethod
    def from_json(cls, obj: object) -> ByCause:
        """Read back from ``as_json`` (a missing or null cause is 0)."""
        if not isinstance(obj, Mapping):
            return cls()
        return cls(_number(obj.get("compression")), _number(obj.get("cache")))


@dataclass(frozen=True)
class SavingsStats(Stats):
    """The savings stage's totals since start (``/pflash/stats`` under ``savings``): the chat turns of sessions,
    those the engine timed, their prompt tokens (prefilled + cached), the new long messages' tokens before and
    after compression, the prefill seconds reported, and the prefill avoided and its time saved (an estimate:
    ``seconds_saved_note``), by cause."""

    turns: int
    turns_timed: int
    prompt_tokens: int
    prefilled_tokens: int
    cached_tokens: int
    message_tokens: int
    message_served_tokens: int
    prefill_s: float
    tokens_avoided: ByCause
    seconds_saved: ByCause
    seconds_saved_note: str


@dataclass(frozen=True)
class SessionSavings(Stats):
    """What one session's timed turns saved: the inspector's session summary (``savings``), which
    ``pflash-proxy show`` reads back (``from_json``). Seconds are estimates (``note``)."""

    turns_timed: int
    prompt_tokens: int
    prefilled_tokens: int
    cached_tokens: int
    prefill_s: float
    rate_tps: float | None  # the session's prefill rate (tokens/s); None before a timed prefill
    tokens_avoided: ByCause
    saved_s: ByCause
    note: str

    @property
    def saved_total(self) -> float:
        """Seconds saved, both causes."""
        return self.saved_s.compression + self.saved_s.cache

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> SessionSavings:
        """Read back from ``as_json`` (missing counts are 0)."""
        rate = obj.get("rate_tps")
        note = obj.get("note")
        return cls(int(_number(obj.get("turns_timed"))), int(_number(obj.get("prompt_tokens"))),
                   int(_number(obj.get("prefilled_tokens"))), int(_number(obj.get("cached_tokens"))),
                   _number(obj.get("prefill_s")), None if rate is None else _number(rate),
                   ByCause.from_json(obj.get("tokens_avoided")), ByCause.from_json(obj.get("saved_s")),
                   note if isinstance(note, str) else "")


def _number(value: object) -> float:
    """A count or a time read back from JSON: a number, else 0 (absent, null)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class ChainStats(Stats):
    """The Responses chain stage's: ``previous_response_id`` expanded from the index, or unknown to it."""

    previous_response_expanded: int
    previous_response_unknown: int


@dataclass(frozen=True)
class JSONPart(Stats):
    """A part not typed yet, as JSON (the session service's counters until it gives its own dataclass)."""

    json: Mapping[str, object]

    def as_json(self) -> JSONObject:
        return {k: to_json(v) for k, v in self.json.items()}


# The server's ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestStats(Stats):
    """Requests answered since start, in all and by status."""

    total: int
    by_status: Mapping[str, int]


@dataclass(frozen=True)
class UpstreamStats(Stats):
    """The engine: where it is, whether it is ready and why not."""

    url: str
    ready: bool
    not_ready_reason: str | None


@dataclass(frozen=True)
class BodyStats(Stats):
    """Request bodies held in memory (``server.bodies``): the bytes held, the bound, the requests refused by it."""

    held_bytes: int
    limit_bytes: int
    refused: int


S = TypeVar("S")


@dataclass(frozen=True)
class ProxyStats:
    """All of ``/pflash/stats``: the server's counters and each stage's (by stage name, in stage order; a stage
    without counters is absent)."""

    requests: RequestStats
    upstream: UpstreamStats
    bodies: BodyStats
    stages: Mapping[str, StageStats] = field(default_factory=dict)

    def stage(self, kind: type[S]) -> S | None:
        """The stage counters of type ``kind`` (``CompressStats``...), None when no stage keeps them."""
        return next((s for s in self.stages.values() if isinstance(s, kind)), None)

    def part(self, name: str) -> JSONObject | None:
        """A stage's part as JSON, by stage name (the session service's, until it is typed)."""
        s = self.stages.get(name)
        return None if s is None else s.as_json()

    def as_json(self) -> JSONObject:
        return {"requests": self.requests.as_json(), "upstream": self.upstream.as_json(),
                "bodies": self.bodies.as_json(), **{name: s.as_json() for name, s in self.stages.items()}}
