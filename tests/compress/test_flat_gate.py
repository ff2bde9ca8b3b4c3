"""The flat gate: a pointed question over a cold document is compressed; "list every X" over it is served whole,
with a reason that gives the numbers the decision used."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from pflash_proxy.compress.pipeline import CompressionSettings, Compressor
from pflash_proxy.compress.request import RequestFinder
from pflash_proxy.compress.spread import SpreadCurve, asks_for_every, flat_gate
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.stages.scorers import SCORERS, default_spread

from .corpus import FLAT_CURVE


def asyncio_paste(chars: int = 14_000) -> str:
    """asyncio's first modules, concatenated: a cold document of ~3.7K tokens."""
    root = os.path.dirname(asyncio.__file__)
    text = "".join(open(os.path.join(root, f), encoding="utf-8").read()
                   for f in sorted(os.listdir(root)) if f.endswith(".py"))
    return text[:chars].rsplit("\n", 1)[0] + "\n"


def _cold(question: str, spread: str | float):
    msgs = [{"role": "user", "content": f"{asyncio_paste()}\n{question}"}]
    tt = TokenizedText.from_text(msgs[0]["content"])
    request = RequestFinder().find(msgs, 0, tt)
    comp = Compressor(CompressionSettings(threshold=1024, fallback_spread=spread))
    return tt, comp.compress(tt, request, tt.total_tokens, False, "paste", "1")


def test_a_pointed_question_over_a_cold_document_is_compressed_with_lexical():
    tt, out = _cold("How are the address infos interleaved by family when several families are returned?",
                    default_spread("lexical"))
    assert 3000 < tt.total_tokens < 4500 and 15 <= out.units_in <= 40
    assert out.mode == "compressed", out.reason
    assert out.served_message_tokens < 0.5 * tt.total_tokens
    assert "def _interleave_addrinfos(" in out.text


@pytest.mark.parametrize("question", [
    "List every function or method in this file that uses `self`, with its line.",
    "How many functions here raise an exception?",
])
def test_list_every_over_the_same_document_is_served_whole_with_its_numbers(question):
    tt, out = _cold(question, default_spread("lexical"))
    assert out.mode == "full-flat" and out.text == tt.text
    a = out.analysis
    free = np.ones(len(a.units), bool)
    free[list(a.pinned)] = False
    n_free = int(free.sum())
    # the reason's numbers are the formula's: over the unpinned units
    assert f"of the {n_free} unpinned units" in out.reason and "too flat" in out.reason
    assert out.reason.count(".") <= 3 and "\n" not in out.reason  # one sentence (decimals aside)
    assert f"spread per kept unit {out.spread:.3f} >" in out.reason


def test_the_seeds_spread_alone_would_have_served_the_pointed_question_whole():
    """What the gate replaced: this pointed question's relevance is spread over more units than a small budget
    keeps (spread over 0.11, the seed's number, which served such a request whole on every request); a pointed
    request is not gated, so even at 0.11 it is compressed."""
    from pflash_proxy.compress.spread import relevance_spread

    _, out = _cold("How are the address infos interleaved by family when several families are returned?", 0.11)
    a = out.analysis
    free = np.ones(len(a.units), bool)
    free[list(a.pinned)] = False
    assert relevance_spread(a.scores[free], 2).spread > 0.11
    assert out.mode == "compressed" and out.spread is not None


@pytest.mark.parametrize("text, every", [
    ("List every invoice.", True),
    ("List the ID of every record that mentions the product Nimbolt.", True),
    ("How many records mention the product Nimbolt?", True),
    ("Summarize the document.", True),
    ("What are all the options this parser accepts?", True),
    ("Give me all the lines that mention a timeout.", True),
    ("How are the address infos interleaved by family when several families are returned?", False),
    ("How many times does make_numbered_dir try before it gives up?", False),
    ("What does trimcoef return when every coefficient is small?", False),
    ("Which function returns all items of a list?", False),
    # identifiers are names, not every-words (the first: a prometheus_client code-reads question)
    ("In Summary.time, what happens step by step?", False),
    ("Read prometheus_client/metrics.py and answer: In Summary.time, what happens step by step?", False),
    ("What does the Summary class do with its quantiles?", False),
    ("What does `summary()` return when nothing was observed?", False),
    ("When is `Overview` rendered?", False),
    ("What does summarize_run do with the exit code?", False),
    ("Read summary.py and answer: where is the header parsed?", False),
    ("How does overview.render_page escape the title?", False),
    ("What does Report::summary return?", False),
    ("Where does buildSummary get its rows, and what does `list all` print?", False),
    # ... while the words around them still ask for every match
    ("Give me a summary of metrics.py.", True),
    ("Summarize the `Summary` class.", True),
    ("List every method of `Summary` that takes a lock.", True),
    ("In Summary.time, list all the steps it takes.", True),
    ("Read util.py and answer: how many functions raise?", True),
    ("metrics.py\nSummarize this file.", True),
])
def test_asks_for_every(text, every):
    assert asks_for_every(text) is every


def test_zero_relevance_is_flat_whatever_the_request():
    sp = flat_gate(np.zeros(10), 3, 0.5, "What does it do?")
    assert sp.flat and "none of the 10 unpinned units" in sp.reason


def test_spread_curve_by_prompt_length_and_the_registry_defaults():
    c = SpreadCurve.parse("4096:0.2 16384:0.02")
    assert c.at(1000) == 0.2 and c.at(100_000) == 0.02 and abs(c.at(10240) - 0.11) < 1e-9
    assert SpreadCurve.parse(0.11).at(50_000) == 0.11 and str(SpreadCurve.parse(0.11)) == "0.11"
    with pytest.raises(ValueError):
        SpreadCurve.parse("4096:0.2 1024:0.1")
    assert default_spread("plug-in") == "0.11"
    for e in SCORERS.values():
        SpreadCurve.parse(e.spread)  # every default parses


# ---------------------------------------------------------------- the every-clause and the measure per kept unit

@pytest.mark.parametrize("request_text, clause", [
    ("Which function parses the header? List all the steps it takes.", "List all the steps it takes."),
    ("Read util.py and answer: how many functions raise?\nRead({'file_path': 'util.py'})",
     "Read util.py and answer: how many functions raise?"),
    ("List every invoice.", "List every invoice."),  # one sentence: the request itself
    ("Which function parses the header?", "Which function parses the header?"),  # no every-words: itself
    ("Summarize the document. Then list every date.", "Summarize the document. Then list every date."),
    ("In Summary.time, what happens? List all the steps it takes.", "List all the steps it takes."),
])
def test_every_clause(request_text, clause):
    from pflash_proxy.compress.spread import every_clause

    assert every_clause(request_text) == clause


def test_the_spread_is_per_kept_unit_so_a_long_message_cannot_dilute_it():
    """20 equal units of relevance among 400 and a budget that keeps 10: twice what it keeps is relevant. The
    seed's (N_eff - k) / n read that as 0.025, under 0.11, and compressed a "list every X" that cannot fit."""
    s = np.zeros(400)
    s[::20] = 1.0
    sp = flat_gate(s, 10, 0.11, "List every record that mentions the harbour.")
    assert sp.effective_units == pytest.approx(20.0) and sp.spread == pytest.approx(1.0) and sp.flat
    assert "spread per kept unit 1.000 > 0.110" in sp.reason
    # the same request with a budget that keeps all of them is not flat
    assert not flat_gate(s, 20, 0.11, "List every record that mentions the harbour.").flat


def test_the_every_clause_is_measured_on_its_own_scores():
    s_request = np.ones(50)  # the whole request's words are everywhere
    s_clause = np.zeros(50)
    s_clause[7] = 5.0  # ... what the every-clause names sits in one unit
    q = "Which function interleaves the address infos? List all the steps it takes."
    assert flat_gate(s_request, 10, 0.11, q).flat  # without the clause's scores: the request's
    sp = flat_gate(s_request, 10, 0.11, q, s_clause)
    assert not sp.flat and sp.effective_units == pytest.approx(1.0)
    assert "'List all the steps it takes.'" in sp.reason
    # an every-clause whose words name nothing here asks for every part of what the rest points at
    assert not flat_gate(s_request, 10, 0.11, q, np.zeros(50)).flat
    # an every-clause whose words are everywhere is flat, and its reason says which clause was measured
    sp = flat_gate(np.zeros(50) + np.eye(50)[3], 10, 0.11, q, s_request)
    assert sp.flat and "List all the steps it takes." in sp.reason and sp.effective_units == pytest.approx(50.0)


class _Peaked:
    """A drafter-like scorer: all its relevance on one unit, whatever the query (it counts the queries)."""

    name = "peaked"

    def __init__(self, peak: int) -> None:
        self.peak = peak
        self.asked: list[str] = []

    def represent(self, tt, units):
        from pflash_proxy.compress.scores import UnitReps

        return UnitReps(self.name, len(units), np.array([u.tokens for u in units]), None)

    def score(self, reps, query):
        self.asked.append(query)
        out = np.full(reps.n_units, 1e-3)
        out[self.peak] = 10.0
        return out


def _tool_read(question: str):
    msgs = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Read base_events.py and answer: {question}"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "Read", "arguments": '{"file_path": "base_events.py"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": asyncio_paste()}]
    tt = TokenizedText.from_text(msgs[3]["content"])
    return tt, RequestFinder().find(msgs, 3, tt)


def test_the_gate_reads_bm25_of_the_every_clause_whatever_the_serving_scorer():
    """A scorer that puts everything on one unit does not decide the gate: a "list every X" whose X is in most
    units is flat (its own scores' spread is about 0), and the serving scorer is asked only for the request
    (no second drafter pass)."""
    question = "List every function or method in this file that uses `self`, with its line."
    msgs = [{"role": "user", "content": f"{asyncio_paste()}\n{question}"}]
    tt = TokenizedText.from_text(msgs[0]["content"])
    request = RequestFinder().find(msgs, 0, tt)
    scorer = _Peaked(5)
    # the flat curve's budget keeps 2 of the ~4.4 relevant units (the size-shaped default's keeps about 4: not flat)
    comp = Compressor(CompressionSettings(threshold=1024, fallback_spread=0.11, curve=FLAT_CURVE), scorer=scorer)
    out = comp.compress(tt, request, tt.total_tokens, False, "paste", "1")
    assert out.mode == "full-flat" and out.spread is not None and out.spread > 1.0, out.reason
    assert scorer.asked == [request.text]
    # a pointed question over the same read: no gate scores at all, compressed
    tt, pointed = _tool_read("Which function interleaves the address infos by family?")
    out = comp.compress(tt, pointed, tt.total_tokens, False, "tool", "4")
    assert out.mode == "compressed" and out.analysis is not None and out.analysis.gate_scores is None


def test_a_list_all_the_steps_clause_that_names_nothing_here_is_not_flat():
    tt, request = _tool_read("Which function interleaves the address infos by family? List all the steps it "
                             "takes.")
    # at -0.5 the whole request's BM25 reads as flat (about -0.25 here); its every-clause's words are in one or
    # two of the 25 units (about -0.8)
    comp = Compressor(CompressionSettings(threshold=1024, fallback_spread=-0.5))
    out = comp.compress(tt, request, tt.total_tokens, False, "tool", "4")
    assert out.mode == "compressed", out.reason
    assert "def _interleave_addrinfos(" in out.text


def test_spread_curve_takes_negative_thresholds():
    assert SpreadCurve.parse("4096:0.01 16384:-0.3").at(16384) == -0.3
    with pytest.raises(ValueError):
        SpreadCurve.parse("4096:-1.5")


# ---------------------------------------------------------------- one gate curve for every registered scorer

def _generated(target: int, seed: int, question: str | None = None):
    """The bench's generated "list every X" / "how many" case (one-line records, ~4 % naming the product) at
    ``target`` tokens, or the same records with ``question`` instead: the long message, its request, the case."""
    from pflash_proxy.bench.cases.generator import generate_case

    case = generate_case("aggregation", target, 0, seed)
    text = case.messages[0]["content"]
    if question is not None:
        text = text[:text.rindex(case.question)] + question
    msgs = [{"role": "user", "content": text}]
    tt = TokenizedText.from_text(text)
    return tt, RequestFinder().find(msgs, 0, tt), case


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("target", [16384, 32768])
def test_every_registered_scorer_serves_list_every_whole_and_a_pointed_question_compressed(target, seed):
    """The gate reads BM25 of the every-clause whatever the scorer, so each scorer's own part is its curve (and
    ``k``). A drafter scorer's curve chosen on four 4K cases (0.15-1.0 at every length) compressed these "list
    every X" at 16K and 32K; every entry must serve them whole and still compress a pointed question, a gated
    one included, over the same records. Model-free: the lexical scorer gives the gate's scores and ``k``."""
    tt, request, case = _generated(target, seed)
    rid = case.gold[0].split(" |", 1)[0]
    pointed = [f"Which team filed {rid}, and what does its note say?",
               f"What does {rid} say? Quote all of its fields."]  # "all": the gate applies
    for name, entry in SCORERS.items():
        comp = Compressor(CompressionSettings(threshold=8192, fallback_spread=entry.spread))
        out = comp.compress(tt, request, tt.total_tokens + 64, False, "paste", "1")
        assert out.mode == "full-flat", (name, out.reason)
        for q in pointed:
            ptt, preq, _ = _generated(target, seed, q)
            got = comp.compress(ptt, preq, ptt.total_tokens + 64, False, "paste", "1")
            assert got.mode == "compressed", (name, q, got.reason)
            assert rid in got.text


class _BySize:
    """A scorer that ranks every unit by its size alone (``small``: the shortest first, the most units a budget
    holds; else the longest first, the fewest): the two ends of what any scorer's ranking packs."""

    def __init__(self, small: bool):
        from pflash_proxy.compress.scores import LexicalScorer

        self.name, self.small, self.lexical = ("small-first" if small else "large-first"), small, LexicalScorer()

    def represent(self, tt, units):
        self.sizes = np.array([u.tokens for u in units], dtype=np.float64)
        return self.lexical.represent(tt, units)

    def score(self, reps, query):
        return 1.0 / self.sizes if self.small else self.sizes / self.sizes.max()


def _ledger(seed: int, question: str) -> str:
    import random

    rng = random.Random(seed)
    paras = []
    for i in range(60):
        words = " ".join(rng.choice(["cargo", "ledger", "crate", "tide", "clerk", "berth", "rope", "salt"])
                         for _ in range(rng.choice([6, 10, 40, 90])))
        place = "harbour" if rng.random() < 0.4 else "market"
        paras.append(f"Entry {i}: the {place} office noted {words}.")
    if "lighthouse" in question:
        paras.insert(30, "Entry 99: the lighthouse keeper logged a brass bell, a red lamp and a torn chart.")
    return "\n\n".join(paras) + "\n\n" + question


def _mode(text: str, scorer: object | None) -> str:
    comp = Compressor(CompressionSettings(threshold=100, fallback_spread=default_spread("lexical")),
                      scorer=scorer)  # type: ignore[arg-type]
    tt = TokenizedText.from_text(text)
    request = RequestFinder(query_pin=16).find([{"role": "user", "content": text}], 0, tt)
    return comp.compress(tt, request, tt.total_tokens + 64, False, "paste", "1").mode


@pytest.mark.parametrize("question", ["List every entry that mentions the harbour.",
                                      "What did the lighthouse keeper log? List all the items."])
def test_the_gate_decides_alike_whatever_the_scorers_ranking_packs(question):
    """The gate's ``k`` comes from BM25's selection for every scorer: a ranking that packs the most units (small
    first: an aggregation request reads as pointed) or the fewest (large first: a pointed one reads as flat) does
    not change whether a cold message is served whole. Ledger 3's harbour request was compressed by small-first
    when the gate counted the serving scorer's own ``k``."""
    for seed in range(8):
        text = _ledger(seed, question)
        lexical = _mode(text, None)
        assert lexical in ("compressed", "full-flat")
        assert [_mode(text, _BySize(small)) for small in (True, False)] == [lexical, lexical], (seed, lexical)
