"""The typed stats serve the JSON ``/pflash/stats`` served as mappings: the compression stage's drafter and
attention heads appear only with a drafter, heads ``None`` (all) apart from no attention scorer."""

from __future__ import annotations

from pflash_proxy.stats import ByCause, CompressStats, DrafterStats, SavingsStats, ScoringStats


def _compress(scoring: ScoringStats | None) -> CompressStats:
    return CompressStats({"compressed": 2, "full-error": 1}, 900, 300, 1000, "head+attention", "probe", scoring)


def test_compress_stats_json_matches_the_mapping_it_replaced():
    drafter = DrafterStats("/m/d.gguf", passes=3, tokens=1200, seconds=0.25, cache_hits=1, aborts=0)
    plain = {"modes": {"compressed": 2, "full-error": 1}, "tokens_in": 900, "tokens_kept": 300, "threshold": 1000,
             "scorer": "head+attention", "segmenter": "probe"}
    assert _compress(None).as_json() == plain
    # a drafter without an attention scorer: no heads key
    assert _compress(ScoringStats("probe", "head", drafter=drafter)).as_json() == {
        **plain, "drafter": {"path": "/m/d.gguf", "passes": 3, "tokens": 1200, "seconds": 0.25, "cache_hits": 1,
                             "aborts": 0}}
    every = _compress(ScoringStats("probe", "attention", None, reads_heads=True, drafter=drafter)).as_json()
    assert "attention_heads" in every and every["attention_heads"] is None  # None: every head
    some = _compress(ScoringStats("probe", "attention", ["3.1", "5.0"], reads_heads=True, drafter=drafter))
    assert some.as_json()["attention_heads"] == ["3.1", "5.0"]
    assert _compress(None).served_whole == 1 and _compress(None).compressed == 2


def test_savings_stats_json_keeps_its_keys_and_cause_order():
    s = SavingsStats(2, 1, 1500, 300, 1200, 1000, 300, 0.2, ByCause(700, 1200), ByCause(0.5, 0.9), "estimate")
    out = s.as_json()
    assert list(out) == ["turns", "turns_timed", "prompt_tokens", "prefilled_tokens", "cached_tokens",
                         "message_tokens", "message_served_tokens", "prefill_s", "tokens_avoided", "seconds_saved",
                         "seconds_saved_note"]
    assert out["tokens_avoided"] == {"compression": 700, "cache": 1200}
    assert dict(s.seconds_saved.items()) == {"cache": 0.9, "compression": 0.5}
