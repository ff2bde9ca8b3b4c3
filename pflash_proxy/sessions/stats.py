"""The session service's stats, typed (``SessionService.stats``): its own counters and one part per collaborator
(the slot scheduler's, the snapshot store's, the cluster node's when several nodes share the index) and the
engine's own counters. ``as_json`` is what ``/pflash/stats`` shows under ``sessions``: one flat object, as the
parts' keys always were (the cluster's under ``cluster``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pflash_proxy.stats import Stats, to_json

if TYPE_CHECKING:
    from pflash_proxy.engine import EngineStats
    from pflash_proxy.jsontypes import JSONObject



@dataclass(frozen=True)
class SlotRow(Stats):
    """One slot of the table (``SlotTable.describe``): its session's id, shortened, and its state."""

    id: int
    session: str | None
    tokens: int
    busy: bool
    known: bool
    snapshot_current: bool


@dataclass(frozen=True)
class SchedulerStats(Stats):
    """The slot scheduler's (``scheduler.SlotScheduler``): hits and what it kept true against the engine, credential
    isolation, the slot table and its queue."""

    hits: int
    hits_vouched: int
    slots_lost: int
    upstream_restarts: int
    idle_saves: int
    isolation_erases: int
    isolation_erases_unknown: int
    isolation_cold: int
    cache_isolation: str
    cache_isolation_active: bool
    slots: int
    queued: int
    refused_queue_full: int
    refused_queue_timeout: int
    table: tuple[SlotRow, ...]

    @property
    def busy(self) -> int:
        """Slots leased to a running request."""
        return sum(1 for row in self.table if row.busy)


@dataclass(frozen=True)
class SnapshotStats(Stats):
    """The snapshot store's (``snapshot_store.SnapshotStore``): its saves and restores, the snapshots on disk, the
    bytes written, and the snapshot files' own counters (``snap_``)."""

    restored: int
    evicted_saves: int
    evicted_saves_skipped: int
    saves_unchanged: int
    save_failures: int
    saves_refused: int
    restores_empty: int
    snapshots: int
    snapshot_bytes: int
    snapshot_bytes_written: int
    snap_saves: int
    snap_restores: int
    snap_restore_failures: int
    snap_damaged: int
    snap_evictions: int
    snap_stray_temp_removed: int
    snap_save_ms_total: float
    snap_restore_ms_total: float
    snap_refused_records: int


@dataclass(frozen=True)
class ClusterStats(Stats):
    """This node's, when several nodes share the index (``cluster.ClusterNode``)."""

    node: str
    url: str
    index: str
    nodes_alive: int
    nodes: Mapping[str, str]  # live node -> URL
    forwarded_out: int
    forwarded_in: int
    forward_failures: int
    takeovers: int
    takeover_hit: int
    takeover_restored: int
    takeover_miss: int
    turn_waits: int
    heartbeat_failures: int
    foreign_holders: int


@dataclass(frozen=True)
class SessionStats:
    """The session service's own counters, its parts, and the engine's counters (the engine's own keys)."""

    misses: int
    cache_mismatches: int
    sessions_pruned: int
    store_failures: int
    prefix_hits: int
    store_available: bool
    model_identity: str
    scheduler: SchedulerStats
    snapshots: SnapshotStats
    engine: EngineStats
    cluster: ClusterStats | None = None

    def as_json(self) -> JSONObject:
        """The ``/pflash/stats`` object: the counters, then each part's keys (the cluster's under ``cluster``)."""
        out: JSONObject = {"misses": self.misses, "cache_mismatches": self.cache_mismatches,
                           "sessions_pruned": self.sessions_pruned, "store_failures": self.store_failures,
                           "prefix_hits": self.prefix_hits, **self.scheduler.as_json(), **self.snapshots.as_json(),
                           "store_available": self.store_available, "model_identity": self.model_identity,
                           **{k: to_json(v) for k, v in self.engine.as_json().items()}}
        if self.cluster is not None:
            out["cluster"] = self.cluster.as_json()
        return out
