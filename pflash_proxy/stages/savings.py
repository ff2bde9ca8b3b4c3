"""What each turn saved: ``SavingsStage`` records one ``turn`` trace per chat turn of a session, after the answer,
and keeps the totals since start (``/pflash/stats`` under ``savings``, the ``pflash_prefill_*`` metrics).

A turn trace (``sessions.trace_records.TurnTrace``) holds what the engine reported of the answer
(``Engine.cache_report``: cached and prefilled tokens, the prefill and generation times), what the proxy decided
(the slot's state before the turn, each new long message's mode and tokens, why one was served whole in plain
words: ``plain_reason``), the client (``client_name``), the status and the time to the first byte.

Tokens avoided, by cause: ``compression`` is a compressed message's tokens minus what was served of it; ``cache``
is the prompt tokens reused from the slot. Time saved is an estimate (``price``): tokens avoided divided by the
prefill rate the engine reported on this session (turns that prefilled at least ``MIN_TIMED_PROMPT`` tokens; the
turn's own when none did). The proxy's own costs are shown beside it, never taken off.

Writing: when a turn ends its traces join the session's next write to its trace log, a task the answer does not
wait for; it gathers the session's turns for ``FLUSH_AFTER_S`` and writes them in one pass, the session's writes in
turn order. The counters are complete when that write ends; ``settle`` (awaited before ``/pflash/stats``, the
metrics and the inspector read) and ``stop`` write what is gathered at once. Recording never fails a request: an
error is logged and the turn's traces are lost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from pflash_proxy.contract import AnswerNote, ProxyRequest, RelayResult, Stage, TurnNote, TurnTraces
from pflash_proxy.engine import CacheReport, Engine
from pflash_proxy.sessions.index import TraceLog
from pflash_proxy.sessions.trace_records import Cause, SecondsByCause, TurnMessage, TurnTrace
from pflash_proxy.sessions.traces import ESTIMATE_NOTE, VERSION, append, current, session_rate
from pflash_proxy.stats import ByCause, SavingsStats

if TYPE_CHECKING:
    from pflash_proxy.sessions.service import SessionService

__all__ = ["SavingsStage", "ESTIMATE_NOTE", "client_name", "plain_reason", "price", "session_rate"]

log = logging.getLogger(__name__)

Built = tuple[TurnTrace, dict[str, int]]  # a turn trace and what it adds to the session's totals

SETTLE_S = 5.0  # the longest ``settle`` waits for the trace writes in flight
FLUSH_AFTER_S = 2.0  # a session's turn traces wait this long for its next turns, then go in one write
MIN_TIMED_PROMPT = 64  # shorter prefills are mostly fixed cost: their rate says little about a long one
CAUSES: tuple[Cause, ...] = ("compression", "cache")
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


def client_name(headers: Mapping[str, str]) -> str | None:
    """The client, from its headers: Codex's ``originator`` (``codex_exec``), else the ``User-Agent``'s first
    product (``claude-cli``, ``opencode``, ``OpenAI``, ``curl``), with Claude Code's ``x-app`` (``cli``) when it
    says more; None without either."""
    return _client_name(headers.get("originator"), headers.get("User-Agent"), headers.get("x-app"))


@functools.lru_cache(maxsize=256)  # a client sends the same three headers turn after turn
def _client_name(originator_header: str | None, agent_header: str | None, app_header: str | None) -> str | None:
    def first(value: str | None) -> str | None:
        m = _TOKEN.match((value or "").strip())
        return m.group(0).split("/", 1)[0] if m else None

    originator, agent, app = first(originator_header), first(agent_header), first(app_header)
    if originator:
        return originator
    if agent:
        return agent if not app or app in agent else f"{agent} ({app})"
    return app


@functools.lru_cache(maxsize=256)  # a proxy serves few distinct modes and reasons
def plain_reason(mode: str | None, reason: str | None, threshold: int | None = None) -> str | None:
    """Why a message (or a turn) was served whole, for a person: None when it was compressed."""
    if mode == "compressed" or mode == "recall":
        return None
    if mode == "full-flat":
        return ("no part of the message stood out as more relevant to the request than the rest, so cutting it "
                "would have been a guess: served whole" + (f" ({reason})" if reason else ""))
    if mode == "full-error":
        return "compression failed, so the message went through unchanged" + (f" ({reason})" if reason else "")
    if mode == "full-cold":
        return ("the earlier conversation was not in the slot and is prefilled as it was served (only a new "
                "message is ever shortened)")
    if mode == "passthrough":
        long = f" of at least {threshold:,} tokens" if threshold else " long enough"
        return f"no new message{long} (--threshold): nothing to shorten"
    if mode is None:
        return "compression is off (--no-pflash)"
    return reason or mode


class Timings(TypedDict):
    """A turn's counts and times from the engine's cache report (times None when it reports none)."""

    cached_tokens: int
    prefilled_tokens: int
    generated_tokens: int
    prefill_ms: float | None
    generate_ms: float | None


def _timings(report: CacheReport | None) -> Timings | None:
    """The turn trace's counts and times from the engine's cache report of the answer (times None when
    it reports none)."""
    if report is None:
        return None
    timed = report.prompt_ms is not None

    def ms(v: float | None) -> float | None:
        return round(v or 0.0, 2) if timed else None
    return {"cached_tokens": report.cached_tokens, "prefilled_tokens": report.new_tokens,
            "generated_tokens": report.generated_tokens, "prefill_ms": ms(report.prompt_ms),
            "generate_ms": ms(report.generate_ms)}


def estimate(tokens: int, rate_tps: float | None) -> float | None:
    """Seconds ``tokens`` would have taken to prefill at ``rate_tps`` (None without a rate)."""
    return None if not rate_tps else round(tokens / rate_tps, 4)


@dataclass
class _Batch:
    """The turns one trace write of a session gathers (``SavingsStage.on_finish``)."""

    turns: list[tuple[TurnTraces, ProxyRequest | None]] = field(default_factory=list)  # a request: it was answered
    now: asyncio.Event = field(default_factory=asyncio.Event)  # set by ``settle``: write without waiting more


def price(turn: TurnTrace, totals: Mapping[str, int], before: Mapping[str, int]
          ) -> Built:
    """Copies of a turn trace and its totals with the time saved, at the prefill rate of the session's
    totals ``before`` the turn and the turn's own (a turn the engine did not time is returned as it is)."""
    out, added = turn.copy(), dict(totals)
    if out.get("prefilled_tokens") is None:
        return out, added
    prior = current(before)
    merged = {k: prior.get(k, 0) + added.get(k, 0) for k in ("timed_prefilled_tokens", "timed_prefill_ms")}
    rate = session_rate(merged, out)
    out["rate_tps"] = None if rate is None else round(rate, 1)
    avoided = out["tokens_avoided"]
    saved: SecondsByCause = {"compression": estimate(avoided["compression"], rate),
                             "cache": estimate(avoided["cache"], rate)}
    out["saved_s"] = saved
    for cause in CAUSES:
        added[f"saved_ms_{cause}"] = round((saved[cause] or 0.0) * 1000)
    return out, added


class SavingsStage(Stage):
    """After the compression stage, before the commit: notes the turn; after the answer, records it."""

    name = "savings"

    def __init__(self, sessions: SessionService, threshold: int | None, engine: Engine):
        self.sessions = sessions  # writes the turn's traces to the session's trace log
        self.threshold = threshold  # None: compression is off
        self.engine = engine  # reads the answer's cache report
        self.counters: dict[str, float] = {"turns": 0, "turns_timed": 0, "prompt_tokens": 0, "prefilled_tokens": 0,
                                           "cached_tokens": 0, "prefill_ms": 0.0, "message_tokens": 0,
                                           "message_served_tokens": 0}
        self.avoided = dict.fromkeys(CAUSES, 0)
        self.saved_s = dict.fromkeys(CAUSES, 0.0)
        self._batches: dict[str, _Batch] = {}  # session id -> the turns its next trace write gathers
        self._last: dict[str, asyncio.Task[None]] = {}  # session id -> its newest trace write (waiting or running)

    async def on_request(self, req: ProxyRequest) -> None:
        ctx = req.notes.session
        if req.kind != "chat" or ctx is None or ctx.turn.record is None:
            return
        # the commit (next stage) counts the turn; this is the number it gets
        req.notes.turn = TurnNote(ctx.turn.record.turns + 1, time.monotonic())

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        ctx = req.notes.session
        if req.notes.turn is None or ctx is None or ctx.turn.record is None:
            return
        req.notes.turn.answer = AnswerNote(result, time.time(), self.engine.cache_report(result.final_json))

    async def on_finish(self, req: ProxyRequest) -> None:
        """The turn's traces join its session's next trace write, after the answer."""
        ctx = req.notes.session
        answered = req if req.notes.turn is not None and req.notes.turn.answer is not None else None
        if ctx is None or ctx.turn.record is None or not ctx.forwarded:
            return  # never forwarded: the turn was not committed, and its number is the next one's
        pending: TurnTraces = ctx.traces
        if answered is None and not pending.items:
            return
        sid = ctx.turn.record.id
        batch = self._batches.get(sid)
        if batch is None:  # the session's next write: after the one in flight, if any
            batch = self._batches[sid] = _Batch()
            task = asyncio.get_running_loop().create_task(self._write(sid, batch, self._last.get(sid)))
            self._last[sid] = task
            task.add_done_callback(functools.partial(self._written, sid))
        batch.turns.append((pending, answered))

    def _written(self, sid: str, task: asyncio.Task[None]) -> None:
        if self._last.get(sid) is task:
            del self._last[sid]

    async def _write(self, sid: str, batch: _Batch, previous: asyncio.Task[None] | None) -> None:
        """One index write of the turns the batch gathered while it waited (``FLUSH_AFTER_S``, or until
        ``settle``), after the session's write before it; each turn priced at the session's rate up to it."""
        try:
            await asyncio.wait_for(batch.now.wait(), FLUSH_AFTER_S)
        except TimeoutError:
            pass
        if self._batches.get(sid) is batch:
            del self._batches[sid]  # a later turn starts the next batch
        if previous is not None:
            await asyncio.wait([previous])
        priced: list[TurnTrace] = []
        turns = [(pending, self._built(answered)) for pending, answered in batch.turns]

        def update(kept: TraceLog) -> TraceLog:  # in the index's transaction; may run again on a conflict
            priced.clear()
            # the batch's turns in one ``append`` (one pass over the log, not one per turn), each priced at the
            # totals the turns before it leave
            joined = TurnTraces(turns[0][0].turn)
            running = current(kept.totals)
            for pending, built in turns:
                items, counts = list(pending.items), dict(pending.counts)
                if built is not None:
                    turn, totals = price(built[0], built[1], running)
                    priced.append(turn)
                    items.append(turn)
                    for k, v in totals.items():
                        counts[k] = counts.get(k, 0) + v
                for k, v in counts.items():
                    running[k] = running.get(k, 0) + int(v)
                    joined.counts[k] = joined.counts.get(k, 0) + int(v)
                joined.items.extend(items)
            return append(kept, joined)

        try:
            written = await self.sessions.update_trace_log(sid, update)
        except Exception as exc:  # noqa: BLE001 - the index is unwritable: the answers went out, the traces are lost
            log.warning("inspector: could not save the traces of turns %s of session %s: %s",
                        ", ".join(str(p.turn) for p, _ in batch.turns), sid[:8], exc)
            written = None
        if written is None or len(priced) != sum(b is not None for _, b in turns):
            priced = [price(b[0], b[1], {})[0] for _, b in turns if b is not None]  # each at its own rate
        for turn in priced:
            self._count(turn)

    async def settle(self) -> None:
        """Write what the batches gathered now, and wait (at most ``SETTLE_S``) for the writes in flight."""
        for batch in self._batches.values():
            batch.now.set()
        if self._last:
            await asyncio.wait(list(self._last.values()), timeout=SETTLE_S)

    async def stop(self) -> None:
        await self.settle()

    def _built(self, answered: ProxyRequest | None) -> Built | None:
        if answered is None:
            return None
        try:
            return self.turn_trace(answered)
        except Exception:  # noqa: BLE001 - never cost the turn its other traces
            log.exception("inspector: could not build the turn trace")
            return None

    def turn_trace(self, req: ProxyRequest) -> Built:
        """The turn trace of an answered request (its ``session``, and its ``turn`` with the
        answer) and what it adds to the session's totals, before the session's rate prices its tokens (``price``)."""
        ctx, noted = req.notes.session, req.notes.turn
        if ctx is None or noted is None or noted.answer is None:
            raise ValueError("turn_trace of a request without a session's answered turn")
        n, result, at = noted.number, noted.answer.result, noted.answer.at
        timings = _timings(noted.answer.report)
        compression = req.notes.compression
        mode = compression.mode if compression is not None else None
        messages: list[TurnMessage] = []
        avoided_compression = 0
        for t in ctx.traces.items:
            if t["kind"] == "compression":
                tokens, served = t["message_tokens"], t["served_tokens"]
                if t["mode"] == "compressed":
                    avoided_compression += max(0, tokens - served)
                messages.append({"message": t["message"], "mode": t["mode"], "tokens": tokens,
                                 "served_tokens": served, "why": plain_reason(t["mode"], t["reason"])})
        compression_ms = (compression.ms if compression is not None else None) or 0.0
        reason = compression.reason if compression is not None else None
        prepare_ms = max(0.0, (noted.forwarding_at - req.received_at) * 1000 - (ctx.turn.queue_ms or 0.0))
        first = None if result.first_chunk_at is None else round((result.first_chunk_at - req.received_at) * 1000, 1)
        turn: TurnTrace = {
            "v": VERSION, "kind": "turn", "turn": n, "at": at, "client": client_name(req.headers),
            "status": result.status, "completed": result.completed and not result.client_gone,
            "cache": ctx.turn.cache, "expected_cached": int(ctx.turn.expected), "pflash": mode,
            "why": plain_reason(mode, reason, self.threshold) if not messages else None,
            "messages": messages, "first_byte_ms": first, "queue_ms": ctx.turn.queue_ms,
            "prepare_ms": round(prepare_ms, 1), "compression_ms": round(compression_ms, 1),
            "cached_tokens": None, "prefilled_tokens": None, "prefill_ms": None, "generated_tokens": None,
            "generate_ms": None,
            "tokens_avoided": {"compression": avoided_compression, "cache": 0},
            "saved_s": {"compression": None, "cache": None}, "rate_tps": None,
        }
        totals: dict[str, int] = {"turns_recorded": 1}
        if timings is None:
            return turn, totals
        cached, prefilled, prefill_ms = timings["cached_tokens"], timings["prefilled_tokens"], timings["prefill_ms"]
        turn["cached_tokens"], turn["prefilled_tokens"], turn["prefill_ms"] = cached, prefilled, prefill_ms
        turn["generated_tokens"], turn["generate_ms"] = timings["generated_tokens"], timings["generate_ms"]
        turn["tokens_avoided"]["cache"] = cached
        totals.update({"turns_timed": 1, "prefilled_tokens": prefilled, "cached_tokens": cached,
                       "avoided_compression": avoided_compression, "avoided_cache": cached})
        if prefill_ms:
            totals["prefill_ms"] = round(prefill_ms)
            if prefilled >= MIN_TIMED_PROMPT:
                totals["timed_prefilled_tokens"], totals["timed_prefill_ms"] = prefilled, max(1, round(prefill_ms))
        if ctx.turn.cache == "restored":
            totals["restore_prepare_ms"] = round(prepare_ms - compression_ms)
        return turn, totals

    def _count(self, turn: TurnTrace) -> None:
        c = self.counters
        c["turns"] += 1
        c["message_tokens"] += sum(m["tokens"] for m in turn["messages"])
        c["message_served_tokens"] += sum(m["served_tokens"] for m in turn["messages"])
        prefilled, cached = turn.get("prefilled_tokens"), turn.get("cached_tokens") or 0  # set together
        if prefilled is None:
            return
        c["turns_timed"] += 1
        c["prompt_tokens"] += prefilled + cached
        c["prefilled_tokens"] += prefilled
        c["cached_tokens"] += cached
        c["prefill_ms"] += turn.get("prefill_ms") or 0.0
        for cause in CAUSES:
            self.avoided[cause] += turn["tokens_avoided"][cause]
            self.saved_s[cause] += turn["saved_s"][cause] or 0.0

    def stats(self) -> SavingsStats:
        c = self.counters
        return SavingsStats(int(c["turns"]), int(c["turns_timed"]), int(c["prompt_tokens"]),
                            int(c["prefilled_tokens"]), int(c["cached_tokens"]), int(c["message_tokens"]),
                            int(c["message_served_tokens"]), round(c["prefill_ms"] / 1000, 3),
                            ByCause(self.avoided["compression"], self.avoided["cache"]),
                            ByCause(round(self.saved_s["compression"], 3), round(self.saved_s["cache"], 3)),
                            ESTIMATE_NOTE)
