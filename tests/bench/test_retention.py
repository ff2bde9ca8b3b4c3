import re

import pytest

from pflash_proxy.bench.cases import (check_retention, default_count_tokens, gold_whole, head_tail_truncate,
                                      marker_line, random_units, shorten_longest)
from pflash_proxy.bench.cases.retention import split_units

MARKER_RX = re.compile(r"^\[… lines? (\d+)(?:–(\d+))? omitted …\]$")


def expand(shortened: str, original: str) -> str:
    """Undo a baseline: every marker line becomes the original lines it names (checks counts and ranges)."""
    src = original.split("\n")
    out = []
    for line in shortened.split("\n"):
        m = MARKER_RX.match(line)
        if m:
            a, b = int(m.group(1)), int(m.group(2) or m.group(1))
            assert 1 <= a <= b <= len(src) and (m.group(2) is None) == (a == b)
            out.extend(src[a - 1:b])
        else:
            out.append(line)
    return "\n".join(out)


def with_long_content(case, new_text):
    return shorten_longest(case.messages, lambda _text: new_text)


def long_text(case):
    return max((m["content"] for m in case.messages if isinstance(m.get("content"), str)), key=len)


def test_full_prompt_keeps_everything(bench_cases):
    for case in bench_cases:
        r = check_retention(case, case.messages)
        assert r.all_gold and r.gold_whole == r.gold_total == len(case.gold) and r.kept_fraction == 1.0
        assert r.case_id == case.case_id and r.missing == ()


def test_gold_kept_whole_amid_markers_is_accepted(by_family):
    case = by_family["code"][0]
    text = long_text(case)
    lines = text.split("\n")
    g0 = text[:text.index(case.gold[0])].count("\n")  # first line of the gold
    g1 = g0 + case.gold[0].count("\n")
    kept = (lines[:10] + [marker_line(g0 - 10, 11, g0)] + lines[g0:g1 + 1]
            + [marker_line(len(lines) - g1 - 11, g1 + 2, len(lines) - 10)] + lines[-10:])
    r = check_retention(case, with_long_content(case, "\n".join(kept)))
    assert r.all_gold and r.gold_whole == 1
    assert 0 < r.kept_fraction < 0.2


def test_gold_cut_in_half_by_a_marker_is_not_whole(by_family):
    case = by_family["code"][0]
    text = long_text(case)
    gold_lines = case.gold[0].split("\n")
    half = len(gold_lines) // 2
    cut = "\n".join(gold_lines[:half] + [marker_line(len(gold_lines) - half, 100, 99 + len(gold_lines) - half)])
    r = check_retention(case, with_long_content(case, text.replace(case.gold[0], cut)))
    assert not r.all_gold and r.gold_whole == 0 and r.missing == (0,)


def test_one_line_gold_truncated_mid_line_is_not_whole(by_family):
    case = by_family["ruler_single"][0]
    needle = case.gold[0]
    truncated = long_text(case).replace(needle, needle[: len(needle) // 2])
    assert not check_retention(case, with_long_content(case, truncated)).all_gold


def test_gold_removed_is_reported_missing(by_family):
    case = by_family["ruler_multiquery"][0]
    text = long_text(case).replace(case.gold[2] + "\n\n", marker_line(2, 50, 51) + "\n")
    r = check_retention(case, with_long_content(case, text))
    assert (r.gold_whole, r.gold_total, r.all_gold, r.missing) == (3, 4, False, (2,))


def test_only_line_endings_are_normalised(by_family):
    case = by_family["agent"][0]
    crlf = [dict(m) for m in case.messages]
    crlf[3]["content"] = crlf[3]["content"].replace("\n", "\r\n")
    assert check_retention(case, crlf).all_gold
    squeezed = [dict(m) for m in case.messages]
    squeezed[3]["content"] = squeezed[3]["content"].replace("    ", "  ")  # whitespace changed: not whole
    assert "    " in case.gold[0]
    assert not check_retention(case, squeezed).all_gold


def test_gold_split_across_two_messages_is_not_whole(by_family):
    case = by_family["code"][0]
    gold = case.gold[0]
    mid = len(gold) // 2
    received = [{"role": "user", "content": "..." + gold[:mid]}, {"role": "user", "content": gold[mid:] + "..."}]
    assert gold_whole([gold], received) == [False]
    assert gold_whole([gold], "..." + gold + "...") == [True]  # raw strings are accepted too


def test_kept_fraction_uses_the_same_estimator(by_family):
    case = by_family["ruler_single"][0]
    text = long_text(case)
    half = text[: len(text) // 2]
    r = check_retention(case, with_long_content(case, half))
    assert r.kept_fraction == pytest.approx(0.5, abs=0.02)
    words = lambda t: len(t.split())  # noqa: E731
    rw = check_retention(case, with_long_content(case, half), count_tokens=words)
    assert rw.kept_fraction == pytest.approx(0.5, abs=0.05) and rw.kept_fraction != r.kept_fraction


def test_followup_turn_checks_its_own_gold(by_family):
    case = by_family["multiturn"][0]
    msgs = case.turn_messages(2)
    assert check_retention(case, msgs, turn=2).all_gold
    doc = msgs[0]["content"]
    msgs[0] = dict(msgs[0], content=doc.replace(case.followups[1].gold[0], "[… line 9 omitted …]"))
    r2 = check_retention(case, msgs, turn=2)
    assert not r2.all_gold and r2.turn == 2
    assert check_retention(case, msgs, turn=1).all_gold  # follow-up 1's gold is still there
    recalled = msgs[:-1] + [{"role": "user", "content": f"(from message 1) {case.followups[1].gold[0]}\n\n"
                                                        f"{msgs[-1]['content']}"}]
    assert check_retention(case, recalled, turn=2).all_gold  # recall brings it back at the top of the turn


@pytest.mark.parametrize("budget", [1000, 4000, 8000])
def test_head_tail_respects_budget_and_markers(by_family, budget):
    text = long_text(by_family["agent"][0])
    out = head_tail_truncate(text, budget)
    assert 0.95 * budget <= default_count_tokens(out) <= 1.05 * budget
    markers = [line for line in out.split("\n") if MARKER_RX.match(line)]
    assert len(markers) == 1
    assert expand(out, text) == text
    lines = text.split("\n")
    assert out.startswith(lines[0]) and out.endswith(lines[-1])


@pytest.mark.parametrize("budget", [1000, 4000, 8000])
def test_random_units_respects_budget_and_keeps_whole_units(by_family, budget):
    text = long_text(by_family["nolima"][1])
    out = random_units(text, budget, seed=1)
    assert 0.95 * budget <= default_count_tokens(out) <= 1.05 * budget
    assert expand(out, text) == text  # kept lines are original lines in order; markers name exactly the gaps
    paragraphs = {p.strip("\n") for p in text.split("\n\n")}
    kept = [chunk.strip("\n") for chunk in re.split(r"^\[….*…\]$", out, flags=re.M)]
    for chunk in kept:
        for p in chunk.split("\n\n"):
            assert not p.strip() or p.strip("\n") in paragraphs  # whole units only
    assert random_units(text, budget, seed=1) == out
    assert random_units(text, budget, seed=2) != out


def test_baselines_leave_short_text_alone():
    text = "one\n\ntwo\nthree\n"
    assert head_tail_truncate(text, 1000) == text
    assert random_units(text, 1000, seed=0) == text


def test_split_units_covers_every_line_once():
    lines = ["", "a", "b", "", "", "c", "", "d"]
    units = split_units(lines)
    assert units == [(0, 1), (1, 5), (5, 7), (7, 8)]  # leading blanks alone; a unit takes its trailing blanks
    assert [i for s, e in units for i in range(s, e)] == list(range(len(lines)))


def test_shorten_longest_touches_only_the_tool_output(by_family):
    case = next(c for c in by_family["agent"] if c.meta["variant"] == "log")
    out = shorten_longest(case.messages, lambda t: head_tail_truncate(t, 2000))
    assert out[:3] == case.messages[:3]
    assert out[3]["tool_call_id"] == case.messages[3]["tool_call_id"]
    assert default_count_tokens(out[3]["content"]) <= 2100
    assert case.messages[3]["content"] != out[3]["content"]  # the case itself is not mutated


def test_a_long_paragraph_of_records_is_cut_into_lines():
    records = [f"REC-{i:05d} | team: growth | note: record number {i} of the export" for i in range(200)]
    lines = ["Below is an export.", "", *records, "", "Question?"]
    units = split_units(lines)
    assert units[0] == (0, 2) and units[-1] == (len(lines) - 1, len(lines))
    assert units[1:4] == [(2, 3), (3, 4), (4, 5)]  # one unit per record line
    assert units[-2] == (201, 203)  # the last record keeps the blank line after it
    assert [i for s, e in units for i in range(s, e)] == list(range(len(lines)))
    # so random whole units can keep part of a one-paragraph export instead of nothing
    text = "\n".join(lines)
    kept = random_units(text, 800, seed=1)
    assert 600 <= default_count_tokens(kept) <= 800 and sum(r in kept for r in records) >= 20
