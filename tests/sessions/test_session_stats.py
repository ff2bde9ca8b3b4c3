"""``SessionService.stats`` is typed (``SessionStats``: the service's counters, the scheduler's, the snapshot
store's, the cluster's and the engine's parts); ``as_json`` is the ``/pflash/stats`` object it always was."""

from __future__ import annotations

from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.sessions.service import SessionService, TurnAsk
from pflash_proxy.sessions.slots import SlotReport
from pflash_proxy.sessions.stats import SessionStats
from tests.conftest import make_settings

# the keys /pflash/stats showed under "sessions" before the stats were typed, in their order (a fake engine's own
# counters last: "epoch", "calls")
KEYS = ["misses", "cache_mismatches", "sessions_pruned", "store_failures", "prefix_hits", "hits", "hits_vouched",
        "slots_lost", "upstream_restarts", "idle_saves", "isolation_erases", "isolation_erases_unknown",
        "isolation_cold", "cache_isolation", "cache_isolation_active", "slots", "queued", "refused_queue_full",
        "refused_queue_timeout", "table", "restored", "evicted_saves", "evicted_saves_skipped", "saves_unchanged",
        "save_failures", "saves_refused", "restores_empty", "snapshots", "snapshot_bytes", "snapshot_bytes_written",
        "snap_saves", "snap_restores", "snap_restore_failures", "snap_damaged", "snap_evictions",
        "snap_stray_temp_removed", "snap_save_ms_total", "snap_restore_ms_total", "snap_refused_records",
        "store_available", "model_identity", "epoch", "calls"]


async def test_the_stats_are_typed_and_their_json_is_the_one_served_before(tmp_path):
    engine = FakeEngine()
    service = SessionService(make_settings("http://127.0.0.1:9", tmp_path), engine)
    await service.start()
    try:
        turn = await service.begin(TurnAsk("anonymous", {}))
        turn.observe(SlotReport(cached_tokens=0, prompt_tokens=8, generated_tokens=2))
        stats = service.stats()
        assert isinstance(stats, SessionStats) and stats.cluster is None
        assert stats.scheduler.slots == len(service.view().slots()) and stats.scheduler.busy == 1
        assert stats.snapshots.snapshots == 0 and stats.store_available
        data = stats.as_json()
        assert list(data) == KEYS
        assert data["table"][0] == {"id": 0, "session": turn_session(service), "tokens": 10, "busy": True,
                                    "known": True, "snapshot_current": False}
        assert data["slots"] == stats.scheduler.slots and data["calls"] == engine.stats().as_json()["calls"]
        await turn.close()
        assert service.stats().scheduler.busy == 0
    finally:
        await service.stop()


def turn_session(service: SessionService) -> str | None:
    """Slot 0's session, shortened as the table shows it."""
    session = service.view().slots()[0].session
    return session[:8] if session is not None else None
