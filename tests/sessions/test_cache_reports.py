"""The rules that turn llama-server's own numbers into what the proxy reports and keeps (no server needed)."""

from __future__ import annotations

from pflash_proxy.engine import CacheReport, SlotState
from pflash_proxy.sessions.liveness import disagreement
from pflash_proxy.sessions.service import reported_cache
from pflash_proxy.sessions.slots import SlotReport
from pflash_proxy.sessions.snapshots import too_short


def test_a_restore_or_hit_that_reused_nothing_is_a_miss_with_its_reason():
    assert reported_cache("restored", 3443, 0) == ("miss", "announced restored (~3443 tokens), llama-server reused 0")
    assert reported_cache("hit", 1000, 2)[0] == "miss"
    assert reported_cache("restored", 3443, 3442) == ("restored", None)
    assert reported_cache("hit", 1000, 1030) == ("hit", None)  # the answer's generated tokens are reused too


def test_a_miss_that_reused_a_prefix_says_so():
    assert reported_cache("miss", 0, 2864) == ("hit-prefix", None)
    assert reported_cache("miss", 0, 5) == ("miss", None)  # the chat template's first tokens: nothing to speak of


def test_saves_and_restores_of_no_tokens_are_refused():
    assert too_short(0, 3443) == "0 tokens"
    assert too_short(100, 3443) == "100 tokens"
    assert too_short(3440, 3443) is None
    assert too_short(None, 3443) is None  # a server that does not say: the file's size decides


def test_slots_records_that_contradict_the_table():
    assert disagreement(None, 1, -1, 100) == "slot 1 is gone"
    assert disagreement(SlotState(0, False, None, None), 0, 5, 100).startswith("no task has run")
    assert disagreement(SlotState(0, False, 3, None), 0, 9, 100).startswith("its task ids went back")
    assert disagreement(SlotState(0, False, 12, 2000), 0, 9, 1000).startswith("its last prompt")
    assert disagreement(SlotState(0, False, 12, 1004), 0, 9, 1000) is None


def test_the_session_layer_reads_an_answer_through_a_report_of_its_own():
    """``observe`` takes a ``SlotReport``, not the relay's result: a refused request leaves the slot as it was, an
    answer without a cache report makes its content unknown, a report says what the slot now holds."""
    assert SlotReport.of(500, None) == SlotReport(rejected=True)
    assert SlotReport.of(200, None) == SlotReport(rejected=False, cached_tokens=None)
    got = SlotReport.of(200, CacheReport(cached_tokens=90, new_tokens=10, generated_tokens=5))
    assert got == SlotReport(False, 90, 100, 5)
