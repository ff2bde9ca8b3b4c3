"""Ranking inside a source file read by an agent: what the request's path and call say is left out of the scores,
the first choice is served with its whole definition and with the near-twins that score as high, and a
decorator stays with the definition it decorates when an oversize unit is split."""

from __future__ import annotations

import numpy as np

from pflash_proxy.compress.cuts import LineTable, split_priority
from pflash_proxy.compress.kinds import ContentKind
from pflash_proxy.compress.pipeline import NAMED_SHARE, TIE, CompressionSettings, Compressor, first_definitions
from pflash_proxy.compress.request import RequestSpec, without_paths
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import UnitSegmenter

PATH = "/work/orbital/relay/scheduler.py"


def helper(k: int) -> str:
    return (f"def helper_{k}(items, limit={k + 2}):\n"
            f"    out = [item for item in items if item is not None][:limit]\n"
            f"    return sorted(out, key=lambda item: (len(str(item)), {k}))\n")


def header() -> str:
    """A module header that spells the file's path words over and over, as licence headers and imports do."""
    return ('"""Orbital relay scheduler: the scheduler of the orbital relay.\n\n'
            "Part of orbital, the relay scheduler package (orbital.relay.scheduler).\n"
            '"""\n\nfrom orbital.relay import scheduler_base\nfrom orbital.relay.scheduler_base import relay_clock\n')


GOLD = ("def resend(link, frames):\n"
        '    """Send the frames again over a link whose uplink dropped, backing off between tries."""\n'
        "    for attempt in range(5):\n"
        "        if link.uplink_ok():\n"
        "            return link.transmit(frames)\n"
        "        link.backoff(attempt)\n"
        "    raise TimeoutError(attempt)\n")


def tool_request(question: str) -> RequestSpec:
    task = f"Read orbital/relay/scheduler.py and answer: {question}"
    return RequestSpec(task + "\n" + 'Read({"file_path": "' + PATH + '"})', 0, "tool-call")


def test_without_paths_leaves_out_the_path_the_call_and_its_keys():
    text = ('Read orbital/relay/scheduler.py and answer: how do request/response pairs of scheduler.py and '
            'Store.pop resend?\nRead({"file_path": "' + PATH + '"})\nshell({"command": ["cat", "' + PATH + '"]})')
    q = without_paths(text)
    for gone in ("orbital/relay/scheduler.py", PATH, "scheduler.py", "file_path", "command", "Read(", "shell("):
        assert gone not in q
    for kept in ("request/response", "Store.pop", "resend", "cat", "Read orbital"[:4]):
        assert kept in q
    assert without_paths("What does `Store.pop` do with self/other?") == "What does `Store.pop` do with self/other?"


def test_the_path_words_do_not_outrank_the_function_asked_about():
    text = header() + "\n\n" + "\n\n".join([helper(k) for k in range(30)] + [GOLD] + [helper(k) for k in range(30, 60)])
    tt = TokenizedText.from_text(text)
    comp = Compressor(CompressionSettings(threshold=256))
    out = comp.compress(tt, tool_request("what sends the frames again when the uplink dropped?"), tt.total_tokens + 80,
                        True, "tool", "1")
    assert out.mode == "compressed" and out.units_kept < out.units_in
    a = out.analysis
    top = a.units[int(np.argmax(a.scores))]
    assert "def resend(" in tt.range_text(top.start_line, top.end_line)  # not the header that spells the path
    assert GOLD.rstrip("\n") in out.text


def test_a_request_left_with_no_known_word_is_scored_whole():
    text = header() + "\n\n" + "\n\n".join(helper(k) for k in range(40))
    tt = TokenizedText.from_text(text)
    out = Compressor(CompressionSettings(threshold=256)).compress(tt, tool_request("Explain `zz_`?"),
                                                                  tt.total_tokens + 80, False, "tool", "1")
    assert out.analysis is not None and out.analysis.scores.any()  # the path's words, rather than nothing
    assert out.mode == "compressed"


def long_function(name: str, steps: int) -> str:
    lines = [f"def {name}(stations, window):",
             '    """Plan the uplink windows for every ground station, retrying busy ones."""']
    lines += [f"    slot_{i} = stations.pick({i}) or window.shift({i})" for i in range(steps)]
    return "\n".join(lines + ["    return window"]) + "\n"


def test_the_first_choice_is_served_with_its_whole_definition():
    fn = long_function("plan_passes", 62)  # longer than a unit: the cutter cuts it, the question matches its head
    text = "\n\n".join([helper(k) for k in range(60)] + [fn] + [helper(k) for k in range(60, 120)])
    tt = TokenizedText.from_text(text)
    out = Compressor(CompressionSettings(threshold=256)).compress(
        tt, RequestSpec("Which part plans the uplink windows for every ground station?", 0, "tool-call"),
        tt.total_tokens + 80, True, "tool", "1")
    a = out.analysis
    first = text[:text.index(fn)].count("\n")
    mine = [i for i, u in enumerate(a.units) if u.end_line > first and u.start_line < first + fn.count("\n")]
    assert len(mine) >= 2 and a.scores[mine[1:]].max() == 0  # cut, and only its head matches
    assert sum(a.units[k].tokens for k in mine) <= NAMED_SHARE * out.budget_tokens
    assert out.mode == "compressed" and fn.rstrip("\n") in out.text


def test_a_near_twin_that_scores_as_high_is_kept_too():
    scores = np.array([0.1, 2.0, 0.3, 2.0 * TIE + 0.01, 0.2, 2.0 * TIE - 0.2])
    toks = np.full(6, 100)
    assert TIE < 1
    got = first_definitions(scores, set(), {1}, (), toks, 1000)
    assert got == {1, 3}
    assert first_definitions(scores, {3}, {1}, (), toks, 1000) == {1}  # a pinned unit is not a choice


def test_a_split_cuts_above_the_decorators_of_a_method():
    methods = []
    for k in range(12):
        body = [f"        value_{i} = self.table.get({k * 10 + i}) or {i}" for i in range(6)]
        methods.append("\n".join(["    @property", f"    @cached(key={k})", f"    def field_{k}(self):"]
                                 + body + ["        return value_0"]))
    text = "class Record:\n    \"\"\"A record.\"\"\"\n\n" + "\n\n".join(methods) + "\n"
    tt = TokenizedText.from_text(text)
    units = UnitSegmenter(min_segment=32, max_segment=128).segment(tt, ContentKind.CODE)
    assert len(units) >= 4
    for u in units[1:]:
        assert not tt.lines[u.start_line - 1].lstrip().startswith("@"), tt.lines[u.start_line]
    pri = split_priority(LineTable.build(text), ContentKind.CODE)
    at = next(i for i, line in enumerate(tt.lines) if line.startswith("    @property"))
    assert pri[at] < pri[at + 1] and pri[at] < pri[at + 2]
