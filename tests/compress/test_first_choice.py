"""The unit the scorer ranks first reaches the model (issue 25, item 6).

A ~14,000-character source file pasted with a question at its end: the pinned request tail (512 tokens) reaches
into a 500-token function and pins all of it, so the pin grows to ~900 tokens of a ~1,190-token budget, and the
511-token function that a planted comment line is attached to -- the unit the scorer ranks first -- no longer
fits.  It is kept like a pinned unit: the budget is passed by at most its tokens.
"""

from __future__ import annotations

import numpy as np

from pflash_proxy.compress.budget import message_budget
from pflash_proxy.compress.pipeline import CLOSE_BUDGET, MIDDLE_SHARE, CompressionSettings, Compressor, first_choice
from pflash_proxy.compress.request import RequestFinder, RequestSpec
from pflash_proxy.compress.text import TokenizedText

from .corpus import FLAT_CURVE

PLANT = "# The launch code for the orbital relay is 7C-ALPHA-93."
QUESTION = "What is the launch code for the orbital relay?"
NAMES = ["parse_header", "load_config", "merge_ranges", "format_table", "read_chunks", "retry_call", "hash_file",
         "split_words", "normalize_path", "count_tokens", "window_pairs", "flatten_dict", "encode_row", "decode_row",
         "validate_port", "pick_slot", "drain_queue", "parse_range", "check_quota", "spill_cache", "emit_event"]


def small_function(k: int, name: str) -> str:
    return "\n".join([
        f"def {name}(items, limit={k + 2}, strict=False):",
        f'    """Return the first {k + 2} usable entries of ``items`` ({name.replace("_", " ")})."""',
        "    out = []",
        "    for i, item in enumerate(items):",
        "        if item is None:",
        "            continue",
        "        if strict and not isinstance(item, (str, bytes)):",
        f'            raise TypeError(f"{name}: item {{i}} has type {{type(item).__name__}}")',
        "        out.append(item if not strict else str(item).strip())",
        "        if len(out) >= limit:",
        "            break",
        "    return out"]) + "\n"


def large_function(name: str, steps: int = 7) -> str:
    lines = [f"def {name}(stations, window, *, retries=3, log=None):",
             f'    """Plan the {name.replace("_", " ")} for every station in ``stations`` within ``window``."""',
             "    plan = {}",
             "    for station in stations:",
             "        slots = []"]
    for s in range(steps):
        lines += [f"        if station.load > {s * 10} and window.start + {s} < window.end:",
                  f"            slots.append((window.start + {s}, station.name, {s % 4}))",
                  "            if log is not None:",
                  f'                log.debug("station %s slot %d at step {s}", station.name, len(slots))']
    lines += ["        plan[station.name] = slots[:retries * 4]", "    return plan"]
    return "\n".join(lines) + "\n"


def pasted_file() -> str:
    """Small functions, the planted comment on a large one, more small ones, a large one, three small ones, the
    question."""
    parts = ['"""Scheduling helpers for the relay network."""\n', "import math\nimport os\n"]
    parts += [small_function(k, name) for k, name in enumerate(NAMES[:8])]
    parts.append(PLANT + "\n" + large_function("relay_schedule"))
    parts += [small_function(k, name) for k, name in enumerate(NAMES[8:-3], 8)]
    parts.append(large_function("station_rotation"))
    parts += [small_function(k, name) for k, name in enumerate(NAMES[-3:], len(NAMES) - 3)]
    return "\n\n".join(parts) + "\n\n" + QUESTION + "\n"


class PlantedFirst:
    """Scores like the drafter's head attention did: the planted unit 0.59, one other 0.11, the rest ~0."""

    name = "planted-first"

    def represent(self, tt, units):
        return tt, list(units)

    def score(self, reps, query):
        tt, units = reps
        s = np.array([0.001 * (i % 5) for i in range(len(units))])
        s[1] = 0.11
        s[[i for i, u in enumerate(units) if PLANT in tt.range_text(u.start_line, u.end_line)]] = 0.59
        return s


def test_top_ranked_unit_survives_a_pin_that_grew_into_a_large_unit():
    text = pasted_file()
    assert 13_000 <= len(text) <= 15_000
    tt = TokenizedText.from_text(text)
    settings = CompressionSettings(threshold=1024, curve=FLAT_CURVE)  # the budget the premise is sized at
    request = RequestFinder(settings.query_pin).find([{"role": "user", "content": text}], 0, tt)
    assert request.source == "question" and request.text == QUESTION + "\n"
    assert request.pinned_tail_tokens == 512
    out = Compressor(settings, scorer=PlantedFirst()).compress(tt, request, tt.total_tokens, False, "paste")
    a = out.analysis
    units, pinned = a.units, a.pinned
    top = int(np.argmax(a.scores))
    pin_tokens = sum(units[i].tokens for i in pinned)
    # the case of the issue: the pin grew past 512 into a large unit; the top unit is as large and not pinned,
    # and pin + top do not fit the budget
    assert top not in pinned and 480 <= units[top].tokens <= settings.max_segment
    nominal = message_budget(settings.curve, tt.total_tokens, tt.total_tokens, settings.min_message_budget)
    assert pin_tokens > 800 and pin_tokens + units[top].tokens > nominal > pin_tokens
    assert out.mode == "compressed"
    assert PLANT in out.text and tt.range_text(units[top].start_line, units[top].end_line) in out.text
    # the pin left the ranked units less than half the budget: widened to the pin plus half of it, and said so
    assert out.budget_note == "insufficient_middle_budget"
    assert out.budget_tokens == pin_tokens + int(MIDDLE_SHARE * nominal)
    # past the widened budget by at most the top unit and the small rest of a definition the cutter had cut
    assert pin_tokens + units[top].tokens <= out.kept_tokens <= max(out.budget_tokens, pin_tokens + units[top].tokens) \
        + CLOSE_BUDGET * out.budget_tokens
    # the re-run with the analysis (the proxy's landing on budget) keeps it too, whatever the adjustment
    again = Compressor(settings, scorer=PlantedFirst()).compress(tt, request, tt.total_tokens, False, "paste",
                                                                 budget_adjust=300, analysis=a)
    assert PLANT in again.text


def test_top_ranked_large_unit_beats_many_denser_small_ones():
    """A tool output (no pin) where smaller units are denser and fill the budget: the scorer's first choice,
    one long function, is still served whole (an agent asking about one long function)."""
    text = pasted_file()
    tt = TokenizedText.from_text(text)
    scorer = PlantedFirst()
    units = Compressor(scorer=scorer).segmenter.segment(tt)
    top = next(i for i, u in enumerate(units) if PLANT in tt.range_text(u.start_line, u.end_line))

    class Dense(PlantedFirst):
        def score(self, reps, query):
            s = np.array([0.25 if u.tokens < 200 else 0.0 for u in reps[1]])
            s[top] = 0.59  # the highest score, but the lowest density of the scored units
            return s

    request = RequestSpec("what does relay_schedule plan?", 0, "tool-call")
    out = Compressor(scorer=Dense()).compress(tt, request, tt.total_tokens, True, "tool")
    dens = out.analysis.scores / np.array([u.tokens for u in out.analysis.units])
    assert (dens > dens[top]).sum() * 130 > out.budget_tokens  # the denser units alone fill the budget
    assert tt.range_text(units[top].start_line, units[top].end_line) in out.text
    assert out.kept_tokens <= out.budget_tokens + units[top].tokens


def test_first_choice():
    s = np.array([0.2, 0.9, 0.5, 0.9])
    assert first_choice(s, set()) == {1}  # ties: the first
    assert first_choice(s, {1}) == {3}  # a pinned unit is kept anyway: the best unpinned one
    assert first_choice(s, {1, 3}) == {2}
    assert first_choice(np.zeros(4), set()) == set()  # no score: no choice (a flat case stays flat)
    assert first_choice(s, {0, 1, 2, 3}) == set()
