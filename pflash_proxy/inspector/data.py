"""The JSON behind the inspector's views, built from the read-only views it is handed (``InspectorViews``: the
engine, the sessions and slots, the typed counters of ``/pflash/stats``).

``overview`` is the upstream, every slot, the totals since start and the live counters; ``sessions`` the most
recently used sessions' summaries (cached for ``LIST_TTL_S``: listing reads the whole index; each summary kept
until the session's last use changes); ``session`` one session by its full id, with every served message and its
traces (units, scores, kept and omitted lines, recall excerpts, each turn's cache result and savings). Index
reads block: callers run ``sessions``, ``session`` and ``session_exists`` in an executor.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from pflash_proxy.compress.text import split_lines
from pflash_proxy.contract import SessionsView
from pflash_proxy.jsontypes import JSONObject, JSONValue
from pflash_proxy.models import message_text
from pflash_proxy.sessions.index import SessionRecord, TraceLog
from pflash_proxy.sessions.trace_records import CacheView, CompressionTrace, RecallView
from pflash_proxy.sessions.traces import ESTIMATE_NOTE, current, log_of, session_rate
from pflash_proxy.sessions.stats import SessionStats
from pflash_proxy.stats import ByCause, CompressStats, ProxyStats, SavingsStats, SessionSavings

SESSION_ID = re.compile(r"^[0-9a-f]{32}$")
LIST_LIMIT = 100
LIST_TTL_S = 5.0


class EngineView(Protocol):
    """What the overview shows of the engine (``engine.Engine`` has both): where it is, whether it is ready."""

    @property
    def address(self) -> str: ...
    @property
    def not_ready_reason(self) -> str | None: ...


@dataclass(frozen=True)
class InspectorViews:
    """What the proxy hands the inspector: read-only views, each read when a page asks."""

    engine: EngineView  # the engine seam (``engine.Engine``), not the transport
    sessions: Callable[[], SessionsView | None]  # None: the proxy runs without sessions
    stats: Callable[[], ProxyStats]  # what /pflash/stats shows (``server.control.collect_stats``)
    # awaited before a page is built: the trace writes of the turns answered so far have ended
    settled: Callable[[], Awaitable[None]] | None = None


class InspectorData:
    """Builds the views; keeps the session list (``LIST_TTL_S``) and per-session summaries between calls."""

    def __init__(self, views: InspectorViews):
        self.views = views
        self._lock = threading.Lock()
        self._listed: tuple[float, list[tuple[str, float]], int] | None = None
        self._summaries: dict[str, tuple[float, JSONObject]] = {}

    # Overview -------------------------------------------------------------------------------------------------
    def overview(self) -> JSONObject:
        """Everything but the sessions (``sessions``, from the index): in-memory state, on the event loop."""
        stats = self.views.stats()
        engine = self.views.engine
        sessions = self.views.sessions()
        upstream: JSONObject = {"url": engine.address, "ready": engine.not_ready_reason is None,
                                "not_ready_reason": engine.not_ready_reason}
        out: JSONObject = {
            "at": time.time(),
            "upstream": upstream,
            "slots": [], "queued": 0, "sessions": [], "sessions_total": 0,
        }
        if sessions is not None:
            upstream["model"] = sessions.identity_info
            upstream["model_identity"] = sessions.model_identity
            out["queued"] = sessions.queued
            out["slots"] = [{"id": s.id, "session": None if s.anonymous else s.session, "anonymous": s.anonymous,
                             "tokens": s.tokens, "prompt_tokens": s.prompt_tokens, "busy": s.busy, "known": s.known,
                             "snapshot_current": s.snapshot_current} for s in sessions.slots()]
        comp, saved = stats.stage(CompressStats), stats.stage(SavingsStats)
        sess = stats.stage(SessionStats)
        avoided, seconds = (saved.tokens_avoided, saved.seconds_saved) if saved is not None else (ByCause(), ByCause())
        out["totals"] = {
            "requests": stats.requests.total,
            "compressed": comp.compressed if comp is not None else 0,
            "served_whole": comp.served_whole if comp is not None else 0,
            # the new long messages compression looked at, compressed or served whole: what the session table's
            # "tokens in" counts per session
            "tokens_in": saved.message_tokens if saved else 0,
            "tokens_served": saved.message_served_tokens if saved else 0,
            "tokens_saved": avoided.compression,
            "turns": saved.turns_timed if saved else 0, "prompt_tokens": saved.prompt_tokens if saved else 0,
            "prefilled_tokens": saved.prefilled_tokens if saved else 0,
            "cached_tokens": saved.cached_tokens if saved else 0, "prefill_s": saved.prefill_s if saved else 0.0,
            "tokens_avoided": {"compression": avoided.compression, "cache": avoided.cache},
            "saved_s": {"compression": seconds.compression, "cache": seconds.cache},
            "saved_note": saved.seconds_saved_note if saved else None,
            "snapshots": sess.snapshots.snapshots if sess is not None else 0,
            "snapshot_bytes": sess.snapshots.snapshot_bytes if sess is not None else 0,
        }
        cluster = sess.cluster if sess is not None else None
        if cluster is not None:  # one node of several sharing an index (sessions/cluster.py)
            out["node"] = {"node": cluster.node, "url": cluster.url, "index": cluster.index,
                           "nodes": dict(cluster.nodes), "nodes_alive": cluster.nodes_alive,
                           "forwarded_out": cluster.forwarded_out, "forwarded_in": cluster.forwarded_in,
                           "forward_failures": cluster.forward_failures, "takeovers": cluster.takeovers,
                           "takeover_hit": cluster.takeover_hit, "takeover_restored": cluster.takeover_restored,
                           "takeover_miss": cluster.takeover_miss}
        out["counters"] = stats.as_json()
        return out

    def sessions(self, limit: int = LIST_LIMIT) -> tuple[list[JSONObject], int]:
        """The ``limit`` most recently used sessions (summaries, newest first) and how many there are."""
        store = self.views.sessions()
        if store is None:
            return [], 0
        with self._lock:  # two refreshing pages share one listing
            now = time.monotonic()
            if self._listed is None or now - self._listed[0] > LIST_TTL_S:
                used = store.last_uses()
                ranked = sorted(used.items(), key=lambda kv: -kv[1])[:limit]
                self._listed = (now, ranked, len(used))
            _, ranked, total = self._listed
            out: list[JSONObject] = []
            for sid, last_use in ranked:
                cached = self._summaries.get(sid)
                if cached is None or cached[0] != last_use:
                    rec = store.session(sid)
                    if rec is None:
                        continue
                    cached = (last_use, self.summary(rec, log_of(rec, store.trace_log(sid))))
                    self._summaries[sid] = cached
                out.append({**cached[1], **self._live(sid)})
            keep = {sid for sid, _ in ranked}
            for sid in [s for s in self._summaries if s not in keep]:
                del self._summaries[sid]
        return out, total

    def _live(self, sid: str) -> JSONObject:
        """What changes without a new turn: the slot holding the session, its snapshot."""
        sessions = self.views.sessions()
        if sessions is None:
            return {"slot": None, "snapshot": None}
        snap = sessions.snapshot(sid)
        return {"slot": sessions.resident_slot(sid), "node": sessions.holder(sid),
                "snapshot": None if snap is None else {"tokens": snap.tokens, "bytes": snap.size,
                                                        "last_use": snap.last_use, "hits": snap.hits}}

    def summary(self, rec: SessionRecord, kept: TraceLog) -> JSONObject:
        """One session's line of the list: ``kept`` is its traces and totals (``trace.log_of``)."""
        totals = kept.totals
        tokens_in, served = totals.get("tokens_in", 0), totals.get("tokens_served", 0)
        turns = [t for t in kept.traces if t.get("kind") == "turn"]
        last = turns[-1] if turns else {}
        rate = session_rate(totals)
        return {"id": rec.id, "created": rec.created, "last_use": rec.last_use, "turns": rec.turns,
                "messages": len(rec.served), "named": rec.explicit,
                "client": next((t["client"] for t in reversed(turns) if t.get("client")), None),
                "first_words": first_words(rec.served, kept.traces), "last_cache": last.get("cache"),
                "compressed": totals.get("compressed", 0), "served_whole": totals.get("served_whole", 0),
                "recalls": totals.get("recalls", 0),
                # the new long messages compression looked at (compressed or served whole), before and after
                "tokens_in": tokens_in, "tokens_served": served, "tokens_saved": tokens_in - served,
                "savings": SessionSavings(
                    totals.get("turns_timed", 0), totals.get("prefilled_tokens", 0) + totals.get("cached_tokens", 0),
                    totals.get("prefilled_tokens", 0), totals.get("cached_tokens", 0),
                    round(totals.get("prefill_ms", 0) / 1000, 3), None if rate is None else round(rate, 1),
                    ByCause(totals.get("avoided_compression", 0), totals.get("avoided_cache", 0)),
                    ByCause(round(totals.get("saved_ms_compression", 0) / 1000, 3),
                            round(totals.get("saved_ms_cache", 0) / 1000, 3)),
                    ESTIMATE_NOTE).as_json()}

    # One session ----------------------------------------------------------------------------------------------
    def session_exists(self, sid: str) -> bool:
        sessions = self.views.sessions()
        return sessions is not None and bool(SESSION_ID.match(sid)) and sessions.session(sid) is not None

    def session(self, sid: str) -> JSONObject | None:
        sessions = self.views.sessions()
        if sessions is None or not SESSION_ID.match(sid):
            return None
        rec = sessions.session(sid)
        if rec is None:
            return None
        kept = log_of(rec, sessions.trace_log(sid))
        traces = [current(t) for t in kept.traces if t.get("kind") != "turn"]
        turns = [current(t) for t in kept.traces if t.get("kind") == "turn"]
        messages: list[JSONObject] = []
        for i, m in enumerate(rec.served):
            role = m.get("role")  # a string (``models.ChatMessage``)
            entry: JSONObject = {"index": i, "role": role if isinstance(role, str) else None,
                                 "text": message_text(m.get("content")),
                                 "traces": [k for k, t in enumerate(traces) if t.get("message") == i]}
            listed = m.get("tool_calls") or []
            functions = [c.get("function", {}) for c in (listed if isinstance(listed, list) else ())
                         if isinstance(c, dict)]
            calls: list[JSONValue] = [fn.get("name") if isinstance(fn, Mapping) else None for fn in functions]
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
        return {"session": {**self.summary(rec, kept), **self._live(sid)}, "messages": messages,
                "traces": [view(t) for t in traces], "turns": [{k: v for k, v in t.items() if k != "v"}
                                                              for t in turns]}


FIRST_WORDS = 12


def first_words(served: Sequence[Mapping[str, object]], traces: Sequence[object] = ()) -> str | None:
    """The first words of the conversation: of its first user message (an agent's system prompt says little
    about the conversation), else of its first message; as the client wrote it (a compressed message's original,
    from its trace, not the note compression put at its top)."""
    first = next((i for i, m in enumerate(served) if m.get("role") == "user"), 0 if served else None)
    if first is None:
        return None
    original = next((t.get("text") for t in traces if isinstance(t, dict) and t.get("kind") == "compression"
                     and t.get("message") == first and t.get("text")), None)
    text = original or message_text(served[first].get("content"))
    if original is None and text.startswith("[pflash:"):  # an older trace lost its text: skip the note line
        text = text.partition("\n")[2]
    words = text.split()
    text = " ".join(words[:FIRST_WORDS])
    if len(text) > 80:
        text = text[:79].rstrip()
        return text + "…"
    return text + ("…" if len(words) > FIRST_WORDS else "")


RECALL_VIEW = tuple(RecallView.__annotations__)  # what the API shows of a recall trace, in this order
CACHE_VIEW = tuple(CacheView.__annotations__)  # of a cache trace


def view(trace: Mapping[str, JSONValue]) -> JSONObject:
    """A stored trace as the API shows it: a recall or cache trace less its version, a compression trace with its
    units as objects and the original as lines."""
    if trace.get("kind") == "recall":
        return {k: trace.get(k) for k in RECALL_VIEW}
    if trace.get("kind") == "cache":
        return {k: trace.get(k) for k in CACHE_VIEW}
    out = {k: v for k, v in trace.items() if k not in ("units", "kept", "pinned", "text", "v")}
    stored = cast(CompressionTrace, trace)  # as written; an older one may lack a field, hence ``get``
    cols = stored.get("units")
    units: list[JSONObject] = []
    if cols:
        kept, pinned = set(stored.get("kept") or ()), set(stored.get("pinned") or ())
        for i, (a, b, tok, score) in enumerate(zip(cols["start"], cols["end"], cols["tokens"], cols["score"])):
            units.append({"index": i, "lines": [a, b], "tokens": tok, "score": score, "kept": i in kept,
                          "pinned": i in pinned})
    out["units"] = units
    text = stored.get("text")
    out["lines"] = None if text is None else [s[:-1] if s.endswith("\n") else s for s in split_lines(text)]
    out["text_dropped"] = bool(stored.get("text_dropped"))
    return out
