"""``/pflash/metrics`` (Prometheus, via ``prometheus_client``): one ``CollectorRegistry`` per app, every name
prefixed ``pflash_``, counters ending in ``_total``, every metric with HELP.

Latency histograms are observed as requests end (``observe_request``) and as snapshots are saved or restored
(``observe_snapshot``). The counters and gauges the stages keep are read at scrape time by ``StatsCollector``
from the same typed stats ``/pflash/stats`` shows (``stats.ProxyStats``), so the two never disagree.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pflash_proxy.contract import CompressionNote
from pflash_proxy.dialects.registry import dialect_paths
from pflash_proxy.llama.api import KNOWN_ROUTES as ENGINE_ROUTES
from pflash_proxy.sessions.stats import ClusterStats, SessionStats
from pflash_proxy.stats import CompressStats, ProxyStats, RequestStats, SavingsStats

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
KNOWN_ROUTES = {*dialect_paths(), *ENGINE_ROUTES}

# (stats section, key) -> (metric name without pflash_, help); counters get _total from the exposition
SESSION_COUNTERS = {
    "cache_mismatches": "Responses whose cached prompt tokens fell short of what the slot table expected",
    "upstream_restarts": "Times the proxy found llama-server restarted (state lost)",
    "slots_lost": "Hits refused because the engine's slot report no longer showed the session's prompt",
    "hits_vouched": "Hits announced without a slot report check: the upstream sentinel's connection vouched for them",
    "evicted_saves": "Snapshots written because a session lost its slot to another",
    "save_failures": "Snapshot saves that failed (the session is re-prefilled later)",
    "sessions_pruned": "Sessions forgotten by age, count or the index byte bound",
    "store_failures": "Session index reads or writes that failed (requests were served without saving)",
    "refused_queue_full": "Requests refused with 429 because --max-queue requests were already waiting",
    "refused_queue_timeout": "Requests that gave up with 503 after --queue-timeout-s without a slot",
}
SNAPSHOT_COUNTERS = {"snap_saves": "Snapshots saved", "snap_restores": "Snapshots restored",
                     "snap_restore_failures": "Snapshot restores that failed (served by full prefill)",
                     "snap_damaged": "Snapshots found missing, truncated or corrupt before a restore (dropped)",
                     "snap_evictions": "Snapshots evicted to stay under --max-cache-gb",
                     "snap_stray_temp_removed": "Temporary snapshot files of cancelled saves removed"}


def route_label(path: str) -> str:
    return path if path in KNOWN_ROUTES else "other"  # bounded label values


class StatsCollector:
    """Exposes the stages' own counters and gauges at scrape time, read from ``/pflash/stats``'s typed stats."""

    def __init__(self, stats: Callable[[], ProxyStats]) -> None:
        self.stats = stats

    def describe(self) -> list[Metric]:
        return []  # no fixed set: metrics appear with the stages that keep them

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        g = GaugeMetricFamily("pflash_upstream_ready", "1 when llama-server is reachable and ready")
        g.add_metric([], 1.0 if s.upstream.ready else 0.0)
        yield g
        sess = s.stage(SessionStats)
        if sess is not None:
            yield from _session_metrics(sess)
        comp = s.stage(CompressStats)
        if comp is not None:
            c = CounterMetricFamily("pflash_messages", "New messages by what compression did", labels=["mode"])
            for mode, n in sorted(comp.modes.items()):
                c.add_metric([mode], float(n))
            yield c
            yield _counter("compressed_tokens_in", "Tokens of the messages that were compressed", comp.tokens_in)
            yield _counter("compressed_tokens_kept", "Tokens kept of those messages", comp.tokens_kept)
        saved = s.stage(SavingsStats)
        if saved is not None:
            yield from _savings_metrics(saved)


def _savings_metrics(saved: SavingsStats) -> Iterator[Metric]:
    """What the turns saved (``stages.savings.SavingsStage``): prompt tokens not prefilled and the prefill time
    that cost, estimated from the prefill rate llama-server reported on each session, by cause."""
    tokens = CounterMetricFamily("pflash_prefill_tokens_avoided", "Prompt tokens llama-server did not prefill: "
                                 "cut by compression, or reused from the slot (cache)", labels=["cause"])
    seconds = CounterMetricFamily("pflash_prefill_seconds_saved", "Prefill seconds saved (an estimate: tokens "
                                  "avoided / the session's reported prefill rate), by cause", labels=["cause"])
    for cause, n in saved.tokens_avoided.items():
        tokens.add_metric([cause], float(n))
    for cause, v in saved.seconds_saved.items():
        seconds.add_metric([cause], float(v))
    yield tokens
    yield seconds
    yield _counter("prefill_tokens", "Prompt tokens the engine prefilled", saved.prefilled_tokens)
    yield _counter("prefill_seconds", "Seconds llama-server reported prefilling (its prompt_ms)", saved.prefill_s)


CLUSTER_COUNTERS = {
    "forwarded_out": "Turns of sessions another node holds, forwarded there by this node",
    "forwarded_in": "Turns another node forwarded to this one (this node held the session)",
    "forward_failures": "Forwards that found the holding node unreachable (the turn was then served here)",
    "takeovers": "Sessions this node took over from a node that was gone",
    "turn_waits": "Turns that waited for the session's turn lease held by another node",
    "heartbeat_failures": "Heartbeats this node could not write to the shared index",
}


def _session_metrics(sess: SessionStats) -> Iterator[Metric]:
    """The session service's (``sessions.stats.SessionStats``): turns by what the slot held, its counters, the
    slots, the queue, the snapshots on disk and the index's state; a node's cluster part when it has one."""
    sch, snap = sess.scheduler, sess.snapshots
    c = CounterMetricFamily("pflash_session_turns", "Chat turns by what the slot held (hit-prefix: a new "
                            "session whose opening llama-server found in the slot)", labels=["cache"])
    prefix = sess.prefix_hits  # misses that llama-server answered reusing a prefix: not counted twice
    for label, n in (("hit", sch.hits), ("restored", snap.restored), ("hit-prefix", prefix),
                     ("miss", max(0, sess.misses - prefix))):
        c.add_metric([label], float(n))
    yield c
    counters = {"cache_mismatches": sess.cache_mismatches, "upstream_restarts": sch.upstream_restarts,
                "slots_lost": sch.slots_lost, "hits_vouched": sch.hits_vouched, "evicted_saves": snap.evicted_saves,
                "save_failures": snap.save_failures, "sessions_pruned": sess.sessions_pruned,
                "store_failures": sess.store_failures, "refused_queue_full": sch.refused_queue_full,
                "refused_queue_timeout": sch.refused_queue_timeout, "snap_saves": snap.snap_saves,
                "snap_restores": snap.snap_restores, "snap_restore_failures": snap.snap_restore_failures,
                "snap_damaged": snap.snap_damaged, "snap_evictions": snap.snap_evictions,
                "snap_stray_temp_removed": snap.snap_stray_temp_removed}
    for key, help_ in {**SESSION_COUNTERS, **SNAPSHOT_COUNTERS}.items():
        yield _counter(key.replace("snap_", "snapshot_"), help_, counters[key])
    for key, help_, value in (("slots", "llama-server slots", sch.slots),
                              ("queued", "Requests waiting for a slot lease", sch.queued),
                              ("snapshots", "Snapshots on disk", snap.snapshots),
                              ("snapshot_bytes", "Bytes of snapshots on disk", snap.snapshot_bytes),
                              ("store_available", "1 while the session index can be written", sess.store_available),
                              ("slots_busy", "Slots leased to a running request", sch.busy)):
        gm = GaugeMetricFamily(f"pflash_{key}", help_)
        gm.add_metric([], float(value))
        yield gm
    if sess.cluster is not None:
        yield from _cluster_metrics(sess.cluster)


def _cluster_metrics(cluster: ClusterStats) -> Iterator[Metric]:
    """A node of several sharing one index (``sessions/cluster.py``): its name, the live nodes, its forwards and
    takeovers, and what the slot held on a takeover turn (restored from the shared directory, or cold)."""
    info = GaugeMetricFamily("pflash_node_info", "This proxy's node name in the shared session index",
                             labels=["node"])
    info.add_metric([cluster.node], 1.0)
    yield info
    alive = GaugeMetricFamily("pflash_nodes_alive", "Nodes whose heartbeat lasted at this node's last beat")
    alive.add_metric([], float(cluster.nodes_alive))
    yield alive
    counters = {"forwarded_out": cluster.forwarded_out, "forwarded_in": cluster.forwarded_in,
                "forward_failures": cluster.forward_failures, "takeovers": cluster.takeovers,
                "turn_waits": cluster.turn_waits, "heartbeat_failures": cluster.heartbeat_failures}
    for key, help_ in CLUSTER_COUNTERS.items():
        yield _counter(key, help_, counters[key])
    c = CounterMetricFamily("pflash_takeover_turns", "Takeover turns by what the slot held", labels=["cache"])
    for label, n in (("hit", cluster.takeover_hit), ("restored", cluster.takeover_restored),
                     ("miss", cluster.takeover_miss)):
        c.add_metric([label], float(n))
    yield c


def _counter(name: str, help_: str, value: float | None) -> CounterMetricFamily:
    c = CounterMetricFamily(f"pflash_{name}", help_)
    c.add_metric([], float(value or 0))
    return c


class Metrics:
    def __init__(self) -> None:
        self.by_status: Counter[int] = Counter()  # for the JSON view
        # the labelled metrics of a route+status
        self._children: dict[tuple[str, int], tuple[PromCounter, Histogram, Histogram]] = {}
        r = self.registry = CollectorRegistry()
        self.requests = PromCounter("pflash_requests", "Requests answered by the proxy", ["route", "status"],
                                    registry=r)
        self.request_seconds = Histogram("pflash_request_seconds", "Whole request: arrival to last byte",
                                         ["route"], buckets=LATENCY, registry=r)
        self.first_byte_seconds = Histogram("pflash_upstream_first_byte_seconds",
                                            "Arrival to the upstream's first response byte", ["route"],
                                            buckets=LATENCY, registry=r)
        self.queue_wait_seconds = Histogram("pflash_queue_wait_seconds", "Wait for a llama-server slot lease",
                                            buckets=LATENCY, registry=r)
        self.compression_seconds = Histogram("pflash_compression_seconds", "Compression of one new long message",
                                             ["mode"], buckets=LATENCY, registry=r)
        self.drafter_seconds = Histogram("pflash_drafter_seconds", "Drafter time (segment, represent, score) "
                                         "of one compressed message", buckets=LATENCY, registry=r)
        self.snapshot_seconds = Histogram("pflash_snapshot_seconds", "Slot snapshot save or restore", ["action"],
                                          buckets=LATENCY, registry=r)

    def bind(self, stats: Callable[[], ProxyStats]) -> None:
        self.registry.register(StatsCollector(stats))

    def count_request(self, status: int) -> None:
        self.by_status[status] += 1

    def observe_request(self, path: str, status: int, seconds: float, first_byte_s: float | None,
                        queue_ms: float | None = None, compression: CompressionNote | None = None) -> None:
        """A request's latencies: the whole, the upstream's first byte, its wait for a slot (``queue_ms``, the
        session stage's) and the compressor's time with its drafter's part (``compression``, the compression
        stage's note, when the compressor ran)."""
        self.count_request(status)
        route = route_label(path)
        children = self._children.get((route, status))
        if children is None:  # labels() takes a lock and builds its key each time: once per (route, status)
            children = (self.requests.labels(route, str(status)), self.request_seconds.labels(route),
                        self.first_byte_seconds.labels(route))
            self._children[(route, status)] = children
        requests, request_seconds, first_byte_seconds = children
        requests.inc()
        request_seconds.observe(seconds)
        if first_byte_s is not None:
            first_byte_seconds.observe(first_byte_s)
        if queue_ms is not None:
            self.queue_wait_seconds.observe(queue_ms / 1000)
        if compression is not None and compression.ms is not None:
            self.compression_seconds.labels(compression.mode).observe(compression.ms / 1000)
            if compression.scorer not in (None, "lexical"):
                ms = sum(compression.stage_ms.get(k, 0.0) for k in ("segment", "represent", "score"))
                self.drafter_seconds.observe(ms / 1000)

    def observe_snapshot(self, action: str, seconds: float) -> None:
        self.snapshot_seconds.labels(action).observe(seconds)

    def snapshot(self) -> RequestStats:
        return RequestStats(sum(self.by_status.values()), {str(k): v for k, v in self.by_status.items()})

    def prometheus(self) -> bytes:
        return generate_latest(self.registry)
