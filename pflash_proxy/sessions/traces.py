"""The inspector's traces of a session: built here, by the stages that decide (compression, recall, the slot's
cache), written to the session's trace log by ``stages.savings.SavingsStage``, read by the inspector.

A turn's traces are collected in its ``contract.TurnTraces`` (``SessionContext.traces``) while it is served and
written to the session's ``TraceLog`` after the answer, in one index write (``stages.savings.SavingsStage``): the
session record, which every turn reads and writes, never carries them. ``record_compression`` (a compressed
message, or one served whole with a reason), ``record_recall`` (recall excerpts prepended to a short turn) and
``record_cache`` (a turn whose reuse of the engine's prefix cache was not what the session layer expected) add one
plain-data trace (dicts, lists, numbers, strings: nothing that is stored as a class of ours), typed by its kind's
``TypedDict`` in ``sessions.trace_records`` (``CompressionTrace``, ``RecallTrace``, ``CacheTrace``; the turn's is
``TurnTrace``). What a compression trace holds:
1. the message (0-based index, role, the turn it was served in), the mode, the reason when served whole;
2. the message's budget (and the one the last selection aimed at), the prompt tokens (all / the uncached part
   the budget is taken on), the message tokens before and after, the scorer and segmenter, the relevance
   spread, the stage timings;
3. the request (where it came from, its text cut to ``REQUEST_CHARS``, the pinned tail tokens, and the lines of
   the message it occupies when it is the message's own tail);
4. the units as columns (line ranges, tokens, score), the kept and pinned unit indices;
5. the original text, once: the served message holds only the kept lines, and the omitted ones are what a reader
   of the inspector wants to see.

The savings stage adds a ``turn`` trace last: what the slot held and what the engine reported
(``Engine.cache_report``: ``cached_tokens``, ``prefilled_tokens``, ``prefill_ms``, ``generated_tokens``,
``generate_ms``), the tokens compression kept from the prefill, why messages were served whole, and the time
saved, estimated (``stages.savings``; ``session_rate`` is the prefill rate it prices them at). Traces and totals of
version 1 named those counts after llama-server's ``timings`` (``TRACE_NAMES_V1``); ``current`` gives them the
names of version 2 when they are read.

``append`` adds a turn's traces to the log. Bounds per session: the newest ``MAX_TRACES`` compression and recall
traces and, apart from them, the newest ``MAX_TURNS`` turn traces; beyond ``MAX_TEXT_CHARS`` of original text in
all, the oldest traces lose their text (their units, scores and line ranges stay). An index stores each text and
unit table under a key of its own, written once (``sessions.index.codec.TraceParts``): the log ``append`` is given
names them there and counts the text's characters, and a reader gets them back in place. ``TraceLog.totals``
keeps the session's running totals (messages compressed, tokens in, tokens served; turns timed, tokens prefilled
and cached, tokens avoided and milliseconds saved by cause), which outlive dropped traces. ``log_of`` reads a
session's log together with what records written before the log kept of it.

Recording never fails a request: an error is logged and the trace skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
import operator
from typing import TYPE_CHECKING, TypeVar, cast

from pflash_proxy.compress.text import split_lines
from pflash_proxy.contract import TurnTraces
from pflash_proxy.sessions.index import TraceLog
from pflash_proxy.sessions.trace_records import (CacheTrace, CompressionTrace, RecallExcerpt, RecallTrace,
                                                 TraceRequest, TurnTrace, as_stored)
from pflash_proxy.sessions.index.codec import drop_text, text_chars

if TYPE_CHECKING:
    from pflash_proxy.compress import CompressionOutcome, RecallDecision, RequestSpec, Segmenter
    from pflash_proxy.compress.text import TokenizedText
    from pflash_proxy.sessions.index import SessionRecord

__all__ = ["TurnTraces", "record_compression", "record_recall", "record_cache", "append", "current", "log_of",
           "session_rate", "segmenter_name"]

log = logging.getLogger("pflash_proxy.inspector")

MAX_TRACES = 16
MAX_TURNS = 64
MAX_TEXT_CHARS = 4_000_000  # ~16 MB of UTF-8 at worst; ~1M tokens of original text
REQUEST_CHARS = 4000
VERSION = 2  # 1: a turn's counts under llama-server's timings names (``current`` renames them)
# The names version 1 gave a turn's counts (llama-server's ``timings``), and those of this version
TRACE_NAMES_V1 = {"cache_n": "cached_tokens", "prompt_n": "prefilled_tokens", "predicted_n": "generated_tokens",
                  "prompt_ms": "prefill_ms", "predicted_ms": "generate_ms",
                  "timed_prompt_n": "timed_prefilled_tokens", "timed_prompt_ms": "timed_prefill_ms"}
ESTIMATE_NOTE = ("estimate: tokens avoided ÷ the prefill rate (prompt tokens per second) the engine reported "
                 "on this session")


def record_compression(traces: TurnTraces, idx: int, msg: Mapping[str, object], tt: TokenizedText,
                       request: RequestSpec, outcome: CompressionOutcome, prompt_tokens: int, uncached: int,
                       scorer: str, segmenter: str, served_tokens: int, budget: int | None = None) -> None:
    """Add the trace of one compression outcome (compressed or served whole) to the turn's ``traces``:
    ``scorer`` and ``segmenter`` name what ranked and cut the message (``segmenter_name``).

    ``budget``: the message's budget (default the outcome's); a re-run that corrected the note/marker estimate
    selected against a lowered budget, which the trace keeps as ``selection_budget``."""
    try:
        trace = compression_trace(traces.turn, idx, msg, tt, request, outcome, prompt_tokens, uncached, scorer,
                                  segmenter, served_tokens, budget)
        compressed = outcome.mode == "compressed"
        traces.add(trace, {"compressed": int(compressed), "served_whole": int(not compressed),
                                "tokens_in": int(tt.total_tokens), "tokens_served": int(served_tokens)})
    except Exception:  # noqa: BLE001 - the inspector must never cost a request
        log.exception("inspector: could not record the compression trace of message %d", idx + 1)


def record_recall(traces: TurnTraces, idx: int, decision: RecallDecision) -> None:
    """Add the trace of recall excerpts prepended to message ``idx``."""
    try:
        excerpts: list[RecallExcerpt] = [{"from_message": e.label, "lines": [e.start_line, e.end_line],
                                       "tokens": int(e.tokens), "units": list(e.unit_indices), "text": e.text}
                                      for e in decision.recalled]
        trace: RecallTrace = {"v": VERSION, "kind": "recall", "turn": traces.turn, "message": idx,
                              "at": time.time(), "share": round(float(decision.share), 5), "excerpts": excerpts}
        traces.add(trace, {"recalls": 1, "recall_tokens": sum(int(e.tokens) for e in decision.recalled)})
    except Exception:  # noqa: BLE001
        log.exception("inspector: could not record the recall trace of message %d", idx + 1)


def record_cache(traces: TurnTraces, idx: int, announced: str, reported: str, expected: int, cached_tokens: int,
                 reason: str | None) -> None:
    """Add the trace of a turn whose reuse of the engine's cache differed from what the proxy expected:
    what it announced (``announced``, ``expected`` tokens), what the engine reused (``cached_tokens``) and what
    the proxy therefore reported (``reported``)."""
    try:
        trace: CacheTrace = {"v": VERSION, "kind": "cache", "turn": traces.turn, "message": idx, "at": time.time(),
                             "announced": announced, "reported": reported, "expected_tokens": int(expected),
                             "cached_tokens": int(cached_tokens), "reason": reason}
        traces.add(trace)
    except Exception:  # noqa: BLE001
        log.exception("inspector: could not record the cache trace of message %d", idx + 1)


def compression_trace(turn: int, idx: int, msg: Mapping[str, object], tt: TokenizedText,
                      request: RequestSpec, outcome: CompressionOutcome, prompt_tokens: int, uncached: int,
                      scorer: str, segmenter: str, served_tokens: int, budget: int | None = None) -> CompressionTrace:
    analysis = outcome.analysis
    role = msg.get("role")
    trace: CompressionTrace = {
        "v": VERSION, "kind": "compression", "turn": turn, "message": idx,
        "role": role if isinstance(role, str) else None, "at": time.time(), "mode": outcome.mode, "reason": outcome.reason,
        "scorer": scorer, "segmenter": segmenter,
        "message_tokens": int(tt.total_tokens), "served_tokens": int(served_tokens),
        "budget": int(outcome.budget_tokens if budget is None else budget),
        "selection_budget": int(outcome.budget_tokens), "prompt_tokens": int(prompt_tokens),
        "uncached_tokens": int(uncached), "gutter": getattr(outcome, "gutter", None),
        "spread": None if outcome.spread is None else round(float(outcome.spread), 5),
        "stage_ms": {k: round(float(v), 2) for k, v in outcome.stage_ms.items()},
        "n_lines": len(tt.lines), "text": tt.text,
        "request": _request(request, tt),
        "units": None, "kept": [], "pinned": [],
    }
    if analysis is not None:
        units = analysis.units
        line = analysis.pieces.line if analysis.pieces is not None else None  # units over pieces of long lines
        trace["units"] = {"start": [u.start_line if line is None else line[u.start_line] for u in units],
                          "end": [u.end_line if line is None else line[u.end_line - 1] + 1 for u in units],
                          "tokens": [int(u.tokens) for u in units],
                          "score": [float(f"{s:.4g}") for s in analysis.scores.tolist()]}
        trace["pinned"] = sorted(int(i) for i in analysis.pinned)
        omitted = set(outcome.recall.omitted) if outcome.mode == "compressed" and outcome.recall else set()
        trace["kept"] = [i for i in range(len(units)) if outcome.mode != "compressed" or i not in omitted]
    return trace


def segmenter_name(segmenter: Segmenter | None) -> str:
    """A segmenter's name (the model-free ``UnitSegmenter`` has none: ``heuristic``)."""
    return str(getattr(segmenter, "name", "heuristic"))


def _request(request: RequestSpec, tt: TokenizedText) -> TraceRequest:
    """The request and, when it is in the message itself (the question found by its form, or the message's own
    tail), the lines it occupies (0-based, end exclusive)."""
    text = request.text or ""
    out: TraceRequest = {"source": request.source, "pinned_tail_tokens": int(request.pinned_tail_tokens),
                           "text": text[-REQUEST_CHARS:], "truncated": len(text) > REQUEST_CHARS, "lines": None}
    if request.kept_lines is not None:  # the question's own lines in the message
        a, b = request.kept_lines
        out["lines"] = [max(0, min(a, len(tt.lines))), max(0, min(b, len(tt.lines)))]
    elif request.source == "message-tail" and text:  # the message's own tail: its last lines, byte for byte
        start = len(tt.lines) - len(split_lines(text))
        if start >= 0 and "".join(tt.lines[start:]) == text:
            out["lines"] = [start, len(tt.lines)]
    return out


V = TypeVar("V")


def current(stored: Mapping[str, V]) -> dict[str, V]:
    """A stored trace, or a session's ``trace_totals``, under the names of this version: a count a version 1
    trace kept under llama-server's ``timings`` name gets the proxy's (a total under both names is added up)."""
    out = dict(stored)
    for old, new in TRACE_NAMES_V1.items():
        if old in out:
            value = out.pop(old)
            prior = out.get(new)
            out[new] = value if prior is None else cast(V, operator.add(prior, value))  # two counts: numbers
    return out


def session_rate(totals: Mapping[str, int], turn: TurnTrace | None = None) -> float | None:
    """The prefill rate (tokens/s) the engine reported on the session: its timed prefilled tokens ÷ their
    milliseconds (turns that prefilled at least ``stages.savings.MIN_TIMED_PROMPT`` tokens), else ``turn``'s own."""
    n, ms = totals.get("timed_prefilled_tokens", 0), totals.get("timed_prefill_ms", 0)
    if n and ms:
        return n * 1000 / ms
    prefilled, prefill_ms = (turn.get("prefilled_tokens"), turn.get("prefill_ms")) if turn else (None, None)
    if prefill_ms and prefilled:
        return float(prefilled * 1000 / prefill_ms)
    return None


def _turn(trace: Mapping[str, object]) -> int:
    n = trace.get("turn")
    return n if isinstance(n, int) else 0


def append(kept: TraceLog, turn: TurnTraces) -> TraceLog:
    """``kept`` with the turn's traces added (the newest ``MAX_TRACES`` traces and ``MAX_TURNS`` turn traces kept,
    ``MAX_TEXT_CHARS`` of their texts) and its counts added to the totals. Traces stay in turn order: a session's
    turns are written in order by the node that served them, but a session that moved to another node may have
    its later turns written before the first node's last ones."""
    turns = [t for t in kept.traces if isinstance(t, dict) and t.get("kind") == "turn"]
    traces = [t for t in kept.traces if isinstance(t, dict) and t.get("kind") != "turn"]
    for trace in turn.items:
        (turns if trace["kind"] == "turn" else traces).append(as_stored(trace))
    turns.sort(key=_turn)  # stable (a turn's own traces keep their order), linear when already in order
    traces.sort(key=_turn)
    del traces[:-MAX_TRACES]
    del turns[:-MAX_TURNS]
    used = 0
    for t in reversed(traces):  # the newest keep their text
        n = text_chars(t)  # inline, or under a key of its own as an index stores it; 0 once dropped
        if used + n > MAX_TEXT_CHARS:
            drop_text(t)
        else:
            used += n
    totals = current(kept.totals)
    for k, v in turn.counts.items():
        totals[k] = totals.get(k, 0) + int(v)
    return TraceLog(turns + traces, totals)  # compression and recall traces last, newest last


def log_of(record: SessionRecord, kept: TraceLog | None) -> TraceLog:
    """A session's traces and totals: what its record kept (written before the trace log), then its log."""
    totals = current(record.trace_totals)
    for k, v in current(kept.totals if kept else {}).items():
        totals[k] = totals.get(k, 0) + v
    old = [t for t in record.traces if isinstance(t, dict)]
    return TraceLog(old + (kept.traces if kept else []), totals)
