"""Code is kept by definitions (``coderank``): a function or method is ranked as one document and kept whole,
not as the 512-token units the cutter made of it, whose density favours every short helper that mentions a word
of the question once (users'-words code tasks, dev split: the needed definition whole in 76 of 84 reads against
70 before, where an offline BM25 over definitions kept 75)."""

from __future__ import annotations

import numpy as np

from pflash_proxy.compress.coderank import (SIZE_POWER, UNSURE_WIDEN, WIDEN_CAP, WIDEN_CAP_FROM, AtomIndex,
                                            atoms, leader, margin, select_atoms, widen)
from pflash_proxy.compress.named import definition_atoms
from pflash_proxy.compress.pipeline import CompressionSettings, Compressor
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter


def helper(k: int) -> str:
    return (f"def helper_{k}(items, limit={k + 2}):\n"
            f"    out = [item for item in items if item is not None][:limit]\n"
            f"    return sorted(out, key=lambda item: (len(str(item)), {k}))\n")


def long_function(steps: int) -> str:
    lines = ["def resend_frames(link, frames, window):",
             '    """Send the frames again over a link whose uplink dropped, backing off between tries."""']
    for i in range(steps):
        lines.append(f"    chunk_{i} = frames.slice({i} * window, ({i} + 1) * window)  # part {i} of the batch")
        lines.append(f"    link.queue_later(chunk_{i}, delay=link.backoff({i}))")
    lines.append("    return link.flush()")
    return "\n".join(lines) + "\n"


def teaser(k: int) -> str:
    """A short helper that spells one word of the question once."""
    return f"def teaser_{k}(link):\n    return link.uplink_state({k})\n"


def file_text() -> str:
    parts = [helper(k) for k in range(120)] + [teaser(k) for k in range(40)]
    parts.insert(30, long_function(40))
    return "\n\n".join(parts)


class SpreadScorer:
    """The long function's units each score 3, a decoy 4, the teasers 0.5, the rest 0: by density the teasers
    come first."""

    name = "spread"

    def represent(self, tt, units):
        return tt, list(units)

    def score(self, reps, query):
        tt, units = reps
        out = np.zeros(len(units))
        for i, u in enumerate(units):
            text = tt.range_text(u.start_line, u.end_line)
            out[i] = 3.0 if ("chunk_" in text or "resend_frames" in text) else 0.5 if "teaser_" in text else 0.0
            if "def helper_7(" in text:
                out[i] = 4.0
        return out


def test_a_long_definition_ranked_second_is_kept_whole_over_dense_short_ones():
    text = file_text()
    tt = TokenizedText.from_text(text)
    comp = Compressor(CompressionSettings(threshold=256, curve="1000:0.3 20000:0.3"), scorer=SpreadScorer())
    out = comp.compress(tt, RequestSpec("Where are the frames sent again when the uplink drops?", 0, "tool-call"),
                        tt.total_tokens, True, "tool", "1")
    assert out.mode == "compressed" and out.units_kept < out.units_in
    assert long_function(40).rstrip("\n") in out.text  # before: the teasers, denser, took its place
    assert out.served_message_tokens <= out.budget_tokens


def test_bm25_over_definitions_ranks_the_function_whose_body_holds_the_words():
    text = file_text()
    tt = TokenizedText.from_text(text)
    units = UnitSegmenter(32, 512).segment(tt)
    groups = atoms(len(units), definition_atoms(tt, units, 4096))
    assert sorted(k for g in groups for k in g) == list(range(len(units)))  # every unit in one atom
    gold = next(g for g in groups if "def resend_frames(" in tt.range_text(units[g[0]].start_line,
                                                                              units[g[-1]].end_line))
    assert len(gold) > 1  # the long function is several units, one atom
    ranks = AtomIndex.build(tt, units, groups).score("frames sent again over the uplink, backing off")
    assert groups[int(np.argmax(ranks))] == gold


def test_the_selection_keeps_atoms_whole_and_stays_under_the_budget():
    toks = np.array([100, 300, 300, 300, 50, 50, 50, 50])
    groups = ((0,), (1, 2, 3), (4,), (5,), (6,), (7,))
    ranks = np.array([0.0, 9.0, 1.0, 1.0, 1.0, 1.0])
    scores = np.array([0.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0])
    kept = select_atoms(groups, ranks, scores, toks, 1000, set())
    assert {1, 2, 3} <= set(kept) and int(toks[kept].sum()) <= 1000
    kept = select_atoms(groups, ranks, scores, toks, 800, set())  # the long one does not fit: the rest, then a
    assert {0, 4, 5, 6, 7} <= set(kept) and int(toks[kept].sum()) <= 800  # unit of it fills the budget
    assert not {1, 2, 3} <= set(kept)


def test_the_raw_score_leader_is_kept_whole_before_the_size_damped_ranking():
    """A long definition with the best raw score, whose size-damped key is below a few short ones': the short
    ones would take the room it needs, and it would be skipped whole; the leader goes first."""
    toks = np.array([600, 100, 100, 100, 100])
    groups = ((0,), (1,), (2,), (3,), (4,))
    ranks = np.array([10.0, 7.0, 7.0, 7.0, 7.0])
    key = ranks / toks ** SIZE_POWER
    assert key[0] < key[1]  # ranked by the key alone, the short ones come first
    scores = ranks.copy()
    kept = select_atoms(groups, ranks, scores, toks, 800, set())
    assert 0 in kept and int(toks[kept].sum()) == 800
    assert leader(ranks) == 0 and leader(np.zeros(3)) is None


def test_an_unsure_ranking_widens_the_budget_and_a_clear_leader_does_not():
    toks = np.array([100, 100, 100, 100])
    groups = ((0,), (1,), (2,), (3,))
    unsure = np.array([5.0, 5.0, 5.0, 1.0])  # three atoms level at the top: no leader
    sure = np.array([9.0, 2.0, 1.0, 1.0])
    assert margin(groups, unsure, toks) == 1.0 and margin(groups, sure, toks) < 0.5
    assert widen(1000, 4000, groups, unsure, toks) == round(1000 * (1 + UNSURE_WIDEN)) > 1000
    assert widen(1000, 4000, groups, sure, toks) == 1000
    assert widen(1000, 4000, groups, None, toks) == 1000  # not ranked by BM25 (a drafter's scores): as it was
    assert widen(1000, 4000, groups, np.zeros(4), toks) == 1000  # nothing matched: no ranking to be unsure of
    assert widen(1000, 1050, groups, unsure, toks) == 1050  # never past the message
    big = WIDEN_CAP_FROM + 1000  # a large read: widened to at most WIDEN_CAP of itself, never narrowed
    assert widen(int(0.29 * big), big, groups, unsure, toks) == int(WIDEN_CAP * big)
    assert widen(int(0.31 * big), big, groups, unsure, toks) == int(0.31 * big)
    # the slot's context bounds the widening (room), never the curve's budget itself
    assert widen(1000, 4000, groups, unsure, toks, room=1100) == 1100
    assert widen(1000, 4000, groups, unsure, toks, room=900) == round(1000 * (1 + UNSURE_WIDEN))  # past it anyway


def test_a_code_read_with_no_clear_leader_gets_the_widened_budget():
    """Through the compressor: a read of many look-alike functions that the question matches alike is given more
    than the curve's budget; the same read asked about one of them is not."""
    from pflash_proxy.compress.budget import message_budget
    from pflash_proxy.compress.pipeline import CompressionOutcome, CompressionSettings, Compressor
    from pflash_proxy.compress.request import RequestSpec

    fns = [f"def sync_{k}(mirror, ledger):\n    \"\"\"Copy the ledger rows to mirror number {k}.\"\"\"\n"
           f"    for row in ledger.rows({k}):\n        mirror.put(row)\n    return mirror\n" for k in range(80)]
    fns[40] = ("def rotate_keys(vault, epoch):\n    \"\"\"Rotate the vault's signing keys at an epoch.\"\"\"\n"
               "    for key in vault.keys(epoch):\n        vault.retire(key)\n    return vault\n")
    text = "\n\n".join(fns)
    tt = TokenizedText.from_text(text)
    settings = CompressionSettings(threshold=256)
    comp = Compressor(settings)
    curve = message_budget(settings.curve, tt.total_tokens + 80, tt.total_tokens, settings.min_message_budget)

    def ask(q: str) -> CompressionOutcome:
        return comp.compress(tt, RequestSpec(q, 0, "tool-call"), tt.total_tokens + 80, True, "tool", "1")

    assert ask("where are the ledger rows copied to the mirror?").budget_tokens > curve
    bounded = comp.compress(tt, RequestSpec("where are the ledger rows copied to the mirror?", 0, "tool-call"),
                            tt.total_tokens + 80, True, "tool", "1", widen_room=curve + 5)
    assert bounded.budget_tokens == curve + 5  # no room in the slot's context: widened only as far as it allows
    assert ask("where are the vault's signing keys rotated at an epoch?").budget_tokens == curve
