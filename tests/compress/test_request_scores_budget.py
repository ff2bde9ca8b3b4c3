from __future__ import annotations

import pickle

import numpy as np
import pytest

from pflash_proxy.compress.budget import DEFAULT_CURVE, BudgetCurve, BudgetSelector, message_budget
from pflash_proxy.compress.request import RequestFinder
from pflash_proxy.compress.scores import InvalidScores, LexicalScorer, density, terms, validate_scores
from pflash_proxy.compress.spread import relevance_spread
from pflash_proxy.compress.text import TokenizedText
from pflash_proxy.compress.units import Unit, UnitSegmenter

from .corpus import NEEDLE, document_with_needle, prose_paragraphs

# ---------------------------------------------------------------- request


def test_user_message_tail_is_request_and_pinned():
    doc = "\n\n".join(prose_paragraphs(30))
    q = "Which paragraph talks about glaciers and meltwater?"
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": doc}, {"type": "text", "text": "\n" + q}]}]
    spec = RequestFinder(query_pin=512).find(msgs, 1)
    assert spec.source == "question" and spec.pinned_tail_tokens == 512
    assert spec.text.strip() == q  # the question by its form: no word of the document's tail dilutes it


def test_long_system_message_uses_latest_user():
    msgs = [{"role": "system", "content": "x " * 5000}, {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "what about glaciers"}]
    spec = RequestFinder().find(msgs, 0)
    assert spec.text == "what about glaciers" and spec.pinned_tail_tokens == 0 and spec.source == "latest-user"


def test_tool_message_request_is_task_plus_call():
    msgs = [{"role": "user", "content": "Find why the upload handler leaks file descriptors"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q": "open("}'}},
                {"id": "c2", "type": "function", "function": {"name": "read_file",
                                                              "arguments": '{"path": "upload.py"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "short"},
            {"role": "tool", "tool_call_id": "c2", "content": "big file " * 1000}]
    spec = RequestFinder().find(msgs, 3)
    assert spec.source == "tool-call" and spec.pinned_tail_tokens == 0
    assert "leaks file descriptors" in spec.text
    assert 'read_file({"path": "upload.py"})' in spec.text and "grep" not in spec.text


def test_completion_prompt_tail():
    prompt = "\n".join(prose_paragraphs(40)) + "\nQuestion: where do glaciers carve valleys?\nAnswer:"
    spec = RequestFinder(query_pin=64).find_in_prompt(prompt)
    assert spec.source == "question" and spec.pinned_tail_tokens == 64
    assert spec.text == "Question: where do glaciers carve valleys?\nAnswer:"
    assert TokenizedText.from_text(spec.text).total_tokens <= 64

# ---------------------------------------------------------------- scores


def _units(tt):
    return UnitSegmenter().segment(tt)


def test_lexical_needle_ranks_top():
    tt = TokenizedText.from_text(document_with_needle())
    units = _units(tt)
    sc = LexicalScorer()
    reps = sc.represent(tt, units)
    s = sc.score(reps, "What is the vault combination of the Zebulon archive?")
    top = int(np.argmax(density(s, [u.tokens for u in units])))
    assert NEEDLE in tt.range_text(units[top].start_line, units[top].end_line)
    assert (s >= 0).all() and s.shape == (len(units),)
    # reps are picklable and score the same after a round trip
    again = pickle.loads(pickle.dumps(reps))
    assert np.allclose(sc.score(again, "Zebulon vault"), sc.score(reps, "Zebulon vault"))


def test_no_overlap_scores_zero_and_terms():
    tt = TokenizedText.from_text(document_with_needle())
    units = _units(tt)
    sc = LexicalScorer()
    assert not sc.score(sc.represent(tt, units), "qwxzy plorbt").any()
    assert terms("parseHTTPHeader my_var x1 it's") == ["parse", "http", "header", "var", "1", "parsehttpheader", "myvar", "x1"]


def test_lexical_matches_bm25s_reference():
    bm25s = pytest.importorskip("bm25s")
    tt = TokenizedText.from_text(document_with_needle())
    units = _units(tt)
    sc = LexicalScorer()
    q = "dedent the common leading whitespace from text"
    mine = sc.score(sc.represent(tt, units), q)
    corpus = [terms(tt.range_text(u.start_line, u.end_line)) for u in units]
    bm = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    bm.index(corpus, show_progress=False)
    qt = [w for w in dict.fromkeys(terms(q)) if w in bm.vocab_dict]
    assert np.allclose(mine, bm.get_scores(qt), atol=1e-4)


@pytest.mark.parametrize("bad", [[1.0, float("nan"), 2.0], [1.0, 2.0], [1.0, -0.5, 2.0], [np.inf, 1, 1],
                                 [[1, 2, 3]], "abc"])
def test_validate_scores_rejects(bad):
    with pytest.raises(InvalidScores):
        validate_scores(bad, 3)


def test_validate_scores_accepts():
    assert validate_scores([0, 1, 2.5], 3).dtype == np.float64

# ---------------------------------------------------------------- budget


def test_curve_interpolation_and_flat_ends():
    c = BudgetCurve.parse("16384:0.315 32768:0.270 65536:0.270 120000:0.225")
    assert c.ratio(1000) == pytest.approx(0.315)
    assert c.ratio(16384) == pytest.approx(0.315)
    assert c.ratio(24576) == pytest.approx(0.2925)
    assert c.ratio(50000) == pytest.approx(0.270)
    assert c.ratio(92768) == pytest.approx(0.2475)
    assert c.ratio(500000) == pytest.approx(0.225)
    assert c.budget(40000) == 10800


@pytest.mark.parametrize("spec,msg", [("16384:0.3 8000:0.2", "ascend"), ("16384:1.5", r"\(0, 1\]"),
                                      ("16384:0", r"\(0, 1\]"), ("16384-0.3", "tokens:ratio"),
                                      ("abc:0.3", "integer"), ("", "at least one")])
def test_curve_parse_errors(spec, msg):
    with pytest.raises(ValueError, match=msg):
        BudgetCurve.parse(spec)


def test_message_budget_subtracts_rest_and_floors():
    c = BudgetCurve.parse("1000:0.5")
    assert message_budget(c, 10000, 9000) == 4000
    assert message_budget(c, 10000, 2000, floor_tokens=300) == 300
    assert message_budget(c, 100, 10) == 1


def test_a_message_keeps_at_most_the_default_curves_share_of_itself():
    """A cold agent read is nearly the whole prompt: 0.315 of the prompt less the rest gave it more than 0.3 of
    itself (measured: median kept 0.302 with llama-server's counts). The default curve caps a message of 16K
    tokens and more at 0.3 of itself (the seed's points from there on); where the rest of the prompt already takes
    the budget below that, nothing changes."""
    c = BudgetCurve.parse(DEFAULT_CURVE)
    assert str(c) == DEFAULT_CURVE.replace("0.270", "0.27") and BudgetCurve.parse(str(c)) == c
    seed = BudgetCurve.parse("16384:0.315 32768:0.270 65536:0.270 120000:0.225")  # the seed's: no cap
    assert seed.message_share is None and c.points[-len(seed.points):] == seed.points
    # a 20,000-token read in a 20,100-token prompt: the seed's formula gives 6,026 (0.301 of it)
    assert message_budget(seed, 20100, 20000) == 6026
    assert message_budget(c, 20100, 20000) == 6000
    for m in range(16384, 60000, 997):
        assert c.share(m) == pytest.approx(0.3)
        for rest in (0, 50, 150, 400, 2000):
            got = message_budget(c, m + rest, m, 256)
            assert got <= 0.3 * m
            assert got == min(message_budget(seed, m + rest, m, 256), int(0.3 * m))
    # the prompt's rest bites first: unchanged
    assert message_budget(c, 24000, 20000) == message_budget(seed, 24000, 20000) == 3058
    # at 32K and beyond the curve's ratio is under 0.3: unchanged
    assert message_budget(c, 40100, 40000) == message_budget(seed, 40100, 40000)
    # the floor still wins over the cap, and the message's own size over everything
    assert message_budget(c, 600, 500, floor_tokens=256) == 256
    assert message_budget(BudgetCurve.parse("1000:0.5 message:0.2"), 10000, 9900) == 1980


def test_the_default_curve_gives_a_small_read_more_of_itself():
    """Below 16K tokens a read saves little and has little room (issue 48: the needed definition of a 4-8K read
    did not fit 0.3 of it): the default curve keeps up to half of a message of 4K tokens, 0.35 at 8K, linear
    between and down to 0.3 at 14K (RULER QA's "16K" documents, 13-16K tokens, keep at most 0.3), never less; the
    prompt's points sit 0.02 above the message's, so a cold read gets its share (within 1 % of it)."""
    c = BudgetCurve.parse(DEFAULT_CURVE)
    assert [c.share(m) for m in (1000, 4096, 6144, 8192, 11264, 14336, 16384)] == pytest.approx(
        [0.5, 0.5, 0.425, 0.35, 0.325, 0.3, 0.3])
    shares = [c.share(m) for m in range(1000, 70000, 500)]
    assert shares == sorted(shares, reverse=True) and min(shares) == pytest.approx(0.3)
    # a cold read (a system line and a task beside it): the message's share, not the prompt's ratio, decides
    assert message_budget(c, 5100, 5000, 256) == 2334
    assert message_budget(c, 10100, 10000, 256) == 3352
    for m in range(4096, 16384, 331):
        for rest in (50, 150):  # the task and the narration beside it (the system prompt is cached)
            share = int(c.share(m) * m)
            assert share - 0.01 * m <= message_budget(c, m + rest, m, 256) <= share
    # a warm one, whose rest is most of the prompt, still gets the floor
    assert message_budget(c, 30000, 5000, 256) == 256


@pytest.mark.parametrize("spec,msg", [("1000:0.3 message:0", r"\(0, 1\]"), ("1000:0.3 message:1.5", r"\(0, 1\]"),
                                      ("1000:0.3 message:x", "message:number"),
                                      ("1000:0.3 message:0.2 message:0.3", "second")])
def test_message_share_parse_errors(spec, msg):
    with pytest.raises(ValueError, match=msg):
        BudgetCurve.parse(spec)


def _mk_units(tokens):
    out, line = [], 0
    for i, t in enumerate(tokens):
        out.append(Unit(i, line, line + 1, t, "prose"))
        line += 1
    return out


def test_selector_within_two_percent_and_deterministic():
    rng = np.random.default_rng(7)
    toks = rng.integers(32, 512, size=300).tolist()
    units = _mk_units(toks)
    dens = rng.random(300)
    dens[10] = dens[11] = 5.0  # a tie: lower index first
    for budget in (5000, 12345, 30000):
        kept = BudgetSelector().select(units, dens, budget, pinned={299})
        total = sum(toks[i] for i in kept)
        assert abs(total - budget) <= 0.02 * budget
        assert 299 in kept and kept == sorted(kept)
        assert kept == BudgetSelector().select(units, dens, budget, pinned={299})
    kept = BudgetSelector().select(units, dens, toks[10], pinned=())
    assert kept == [10]


def test_selector_pinned_over_budget_kept():
    units = _mk_units([100, 100, 100])
    assert BudgetSelector().select(units, np.array([3.0, 2.0, 1.0]), 50, pinned={1, 2}) == [1, 2]

# ---------------------------------------------------------------- spread


def test_spread_needle_not_flat_and_everyone_flat():
    n = 200
    needle = np.full(n, 0.05)
    needle[17] = 9.0
    sp = relevance_spread(needle, kept_units=60, fallback_spread=0.11)
    assert not sp.flat and sp.effective_units < 10
    flat = np.random.default_rng(0).uniform(0.8, 1.2, size=n)
    sp = relevance_spread(flat, kept_units=60, fallback_spread=0.11)
    assert sp.flat and sp.spread > 0.5
    assert relevance_spread(np.zeros(n), 60).flat


CHAIN = ["VAR_QWERT = 48213", "VAR_ZXCVB = VAR_QWERT", "VAR_POIUY = VAR_ZXCVB", "VAR_LKJHG = VAR_POIUY"]


def _chain_document() -> TokenizedText:
    paras = prose_paragraphs(40)
    for k, line in zip((3, 15, 27, 36), CHAIN):
        paras[k] += "\n" + line
    paras[20] += "\nVAR_MNBVC = 77777"  # another chain's head: never reached from 48213
    return TokenizedText.from_text("\n\n".join(paras))


def test_lexical_hops_follow_references_from_line_to_line():
    tt = _chain_document()
    units = _units(tt)
    q = "Find all variables that are assigned the value 48213, directly or through other variables."
    where = [next(i for i, u in enumerate(units) if line in tt.range_text(u.start_line, u.end_line))
             for line in CHAIN]
    other = next(i for i, u in enumerate(units) if "77777" in tt.range_text(u.start_line, u.end_line))
    plain = LexicalScorer().score(LexicalScorer().represent(tt, units), q)
    assert plain[where[0]] > 0 and not plain[where[1:]].any()  # BM25 alone sees only the value's line
    sc = LexicalScorer(hops=4)
    reps = sc.represent(tt, units)
    hop = sc.score(reps, q)
    assert (hop[where] > 0).all()
    assert hop[where[0]] > hop[where[1]] > hop[where[2]] > hop[where[3]]  # each hop ranks below its parent
    assert hop[other] == plain[other]
    assert np.allclose(sc.score(pickle.loads(pickle.dumps(reps)), q), hop)  # recall reads pickled reps
    assert np.allclose(LexicalScorer(hops=1).score(LexicalScorer(hops=1).represent(tt, units), q)[where[2:]], 0)


def test_a_message_share_by_the_messages_own_size():
    """``message:tokens:share`` points: a small read keeps more of itself (issue 48: budget by read size)."""
    c = BudgetCurve.parse("8192:0.42 16384:0.315 message:8192:0.4 message:16384:0.3")
    assert c.share(4000) == pytest.approx(0.4) and c.share(12288) == pytest.approx(0.35)
    assert c.share(40000) == pytest.approx(0.3)
    assert BudgetCurve.parse(DEFAULT_CURVE).share(5000) == pytest.approx(0.5 - 0.15 * 904 / 4096)
    assert message_budget(c, 6000, 5900) == int(0.4 * 5900)
    assert str(c) == "8192:0.42 16384:0.315 message:8192:0.4 message:16384:0.3"
    for bad in ("16384:0.3 message:0.3 message:8192:0.4", "16384:0.3 message:9000:0.4 message:8000:0.3",
                "16384:0.3 message:8192:1.5"):
        with pytest.raises(ValueError):
            BudgetCurve.parse(bad)
