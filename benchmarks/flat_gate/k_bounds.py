"""The flat gate's decision for ANY scorer's ranking: bounds on ``k`` from the units' sizes alone.

The gate (``compress/spread.py``, called in ``Compressor.compress``) reads BM25 of the request's every-clause for
every scorer, so for one case its ``N_eff`` and threshold are the same whatever the scorer; the scorer's own part
is ``k = len(set(kept) - pinned)``, the unpinned units its budget keeps, and ``spread = (N_eff - k) / max(1, k)``
does not increase with ``k``. So when ``k`` of every ranking lies in ``[k_lo, k_hi]``, the decision is the same
for every ranking when ``spread(k_lo) <= thr`` (compressed) or ``spread(k_hi) > thr`` (served whole).

What the code does with a ranking (``Compressor.compress``, ``_select_with_overhead``, ``BudgetSelector``), for
the message's budget ``B`` (``message_budget``, independent of the scorer), the pinned tail ``P`` (the units of
the request's tail, ``pinned_units``: not counted in ``k``, tokens ``p``) and the unpinned units ``U``:

1. Forced units ``F = P | keep_named | first``: the named definitions (``named``, fixed by the request), the
   optional named definitions taken whole while all named units stay within ``NAMED_SHARE * B`` (chosen by the
   ranking's density), the first choice (the unpinned unit of highest score, when one is positive) and, in code,
   the units scoring within ``TIE`` of it and the definitions they are part of, within ``NAMED_SHARE * B`` less
   the first choice's tokens (``first_definitions``). ``F`` is computed once, before the landing rounds.
2. Each landing round ``r`` selects with a room ``R_r`` (``R_1 = B``; then ``B - extra`` after a round at most on
   the budget, or ``R_r - (served - B)`` after one over it; ``extra`` = the note and marker lines, the names the
   markers show, and what ``close_blocks`` added): ``BudgetSelector.select(room=max(R_r, 1), pinned=F)`` keeps
   ``F`` and walks the rest by density keeping every unit that still fits (a unit that does not fit is skipped
   and the walk goes on; the final fill loop then finds nothing that fits). So, when ``F`` fits the room, the
   kept unpinned units are a *maximal packing* of ``U`` in ``R_r - p``: every unit left out is larger than the
   room left. ``close_blocks`` then adds at most ``CLOSE_BUDGET * B`` tokens of units (only when the message has
   cut definitions). The round kept (``landing_key``) is one of these rounds.

Bounds (``k_bounds``), with ``L_j`` the sum of the ``j`` largest unpinned units:

* Any maximal packing of capacity ``c`` has at least ``largest_first(c)`` units, the largest-first *prefix*
  that fits (``L_m <= c < L_{m+1}``): a packing ``C`` of ``j`` units has ``size(C) <= L_j``, and one of the
  ``j + 1`` largest units is outside it, so maximality needs ``L_{j+1} >= size(C) + min outside > c``. (The
  largest-first greedy that skips a unit that does not fit and goes on is *not* a lower bound: sizes 8 7 7 4 1
  in 14 give it 8 4 1, three units, where 7 7 is a maximal packing of two.) A set of more than ``c`` tokens has
  more than ``largest_first(c)`` units too.
* Every room is at least ``B - X`` once ``F`` fits it, ``X`` an upper bound of ``extra``: the note line at its
  longest, one marker per omitted run (at most ``k_r + 1`` runs, ``k_r <= k_hi``; each marker at most the
  longest a line range of this message gives), ``NAMES_SHARE * B`` when markers may show names, and
  ``CLOSE_BUDGET * B`` when there are cut definitions. So, whether ``F`` fits or not (then ``F``'s unpinned
  units alone hold more than the room's ``R - p > B - X - p`` tokens), every round keeps
  ``k >= largest_first(B - X - p)``; and ``k >=`` the unpinned named units, and ``>= 1`` (the first choice; a
  ranking with no positive unpinned score is step 1 of the gate: flat whatever the request).
  ``k_lo = max`` of these. It is a provable lower bound, not the exact minimum (finding the fewest units of a
  maximal packing is a knapsack-like search): ``X`` charges every omitted run a marker at its longest.
* When ``F`` fits, the kept unpinned units hold at most ``B - p`` tokens plus ``close_blocks``'s; the most units
  that do are the smallest-first prefix (``smallest_first``, exact for the count). When ``F`` does not fit,
  only ``F`` (and ``close_blocks``) is kept: the unpinned named units, the first choice, and at most
  ``NAMED_SHARE * B`` tokens of optional definitions and as much again of first-choice definitions (code).
  ``k_hi`` is the larger of the two counts (at most ``|U|``): exact when the smallest-first ranking lands in one
  round without ``close_blocks``, else an upper bound.

Assumed as the gate itself does: the same units and pinned tail for every scorer (the heuristic segmenter), the
budget of the first ``compress`` call (the proxy's ``Landing`` re-runs keep the first call's gate: a re-run that is
not compressed ends the landing), and some positive unpinned score (else step 1 serves any request whole).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from pflash_proxy.compress.pipeline import CLOSE_BUDGET, NAMED_SHARE, NAMES_SHARE
from pflash_proxy.compress.rewrite import marker_tokens_arrays, note_line
from pflash_proxy.compress.text import approx_tokens

Verdict = Literal["compressed", "whole", "depends"]


def largest_first(sizes: Sequence[int] | np.ndarray, cap: float) -> int:
    """Units of the largest-first prefix within ``cap`` (stops at the first that does not fit): the fewest units
    any maximal packing of capacity ``cap`` holds is at least this."""
    s = np.sort(np.asarray(sizes, dtype=np.int64))[::-1]
    return int(np.searchsorted(np.cumsum(s), cap, side="right")) if cap >= 0 else 0


def smallest_first(sizes: Sequence[int] | np.ndarray, cap: float) -> int:
    """The most units whose tokens sum to at most ``cap`` (the smallest-first prefix)."""
    s = np.sort(np.asarray(sizes, dtype=np.int64))
    return int(np.searchsorted(np.cumsum(s), cap, side="right")) if cap >= 0 else 0


@dataclass(frozen=True)
class Budgeting:
    """What the budget's selection of one message depends on, apart from the ranking."""

    sizes: tuple[int, ...]  # the unpinned units' tokens
    pinned_tokens: int  # p: the pinned tail's tokens
    budget: int  # B: the message's budget (``message_budget``)
    named_units: int = 0  # unpinned units of the named definitions (always kept)
    named_tokens: int = 0  # tokens of all the named definitions' units (named_keep's room is what they leave)
    optional: bool = False  # optional named definitions exist (kept while they fit, by density)
    code: bool = False  # ``is_code``: first_definitions applies
    blocks: bool = False  # cut definitions: close_blocks may add units
    names: bool = False  # an outline: the markers may show names
    note_tokens: int = 0  # the note line at its longest
    marker_tokens: int = 0  # one marker line at its longest

    def extra_max(self, k_hi: int) -> int:
        """``X``: the most a round's ``extra`` (note, markers, names, close_blocks) can be."""
        return (self.note_tokens + (k_hi + 1) * self.marker_tokens
                + (int(NAMES_SHARE * self.budget) if self.names else 0) + self.close_max)

    @property
    def close_max(self) -> int:
        return int(CLOSE_BUDGET * self.budget) if self.blocks else 0


def k_bounds(b: Budgeting) -> tuple[int, int]:
    """``(k_lo, k_hi)``: every ranking's ``k`` lies in between (module docstring)."""
    n = len(b.sizes)
    if n == 0:
        return 0, 0
    # k_hi: F fits -> at most B - p tokens kept (+ close_blocks); F does not fit -> F (+ close_blocks)
    fits = smallest_first(b.sizes, b.budget - b.pinned_tokens + b.close_max)
    opt_room = max(0.0, NAMED_SHARE * b.budget - b.named_tokens) if b.optional else 0.0
    first_room = max(0.0, NAMED_SHARE * b.budget - min(b.sizes)) if b.code else 0.0
    forced = b.named_units + 1 + smallest_first(b.sizes, opt_room + first_room + b.close_max)
    k_hi = min(n, max(fits, forced))
    x = b.extra_max(k_hi)
    k_lo = max(largest_first(b.sizes, b.budget - x - b.pinned_tokens), b.named_units, 1)
    return min(k_lo, k_hi), k_hi


def spread(n_eff: float, k: int) -> float:
    """``relevance_spread``'s value for ``k`` kept units."""
    return (n_eff - k) / max(1, k)


def threshold_k(n_eff: float, thr: float, n: int) -> int | None:
    """The fewest kept units the gate does not call flat (``spread <= thr``), None when even ``n`` is flat."""
    guess = max(0, int(math.floor(n_eff / (1.0 + thr))) - 2) if thr > -1.0 else n
    for k in range(min(guess, n), n + 1):
        if spread(n_eff, k) <= thr:
            return k
    return None


def verdict(k_lo: int, k_hi: int, n_eff: float, thr: float) -> Verdict:
    """The gate's decision for every ``k`` in ``[k_lo, k_hi]`` (a request it applies to, with relevance)."""
    if spread(n_eff, k_lo) <= thr:
        return "compressed"
    if spread(n_eff, k_hi) > thr:
        return "whole"
    return "depends"


# --- the cases, through the real pipeline (model-free) ---------------------------------------------------------


class _Other:
    """Not a ``LexicalScorer``: ``pipeline.gate_scores`` computes BM25 of the every-clause as it does for a drafter
    scorer (the lexical scorer reuses its own scores when the clause is the whole request: in code those are of the
    request without its paths)."""

    name = "other"


def budgeting(tt, analysis, budget: int, source: str, label: str) -> Budgeting:  # noqa: ANN001
    from pflash_proxy.compress.routed import is_code

    units, pinned = analysis.units, analysis.pinned
    toks = np.array([u.tokens for u in units], dtype=np.int64)
    free = np.ones(len(units), bool)
    free[list(pinned)] = False
    n_lines = len(tt.lines)
    marker = int(max(marker_tokens_arrays(np.array([n_lines - 1]), np.array([2 * n_lines - 1]))[0],
                     marker_tokens_arrays(np.array([n_lines - 1]), np.array([n_lines]))[0]))
    named = sorted(analysis.named)
    return Budgeting(tuple(toks[free].tolist()), int(toks[~free].sum()), int(budget),
                     sum(1 for i in named if free[i]), int(toks[named].sum()) if named else 0,
                     bool(analysis.named_optional), is_code(units), bool(analysis.blocks), bool(analysis.outline),
                     approx_tokens(note_line(source, n_lines, n_lines, label)), marker)


def rankings(toks: np.ndarray, count: int) -> dict[str, np.ndarray]:
    """Scores that rank the units adversarially for ``k`` (density = score / tokens): smallest first (the most
    units), largest first (the fewest), the message's first units first and its last ones first (contiguous: one
    marker), and ``count`` uniform random rankings (scattered: a marker per omitted run)."""
    t = np.maximum(toks.astype(np.float64), 1.0)
    pos = np.arange(len(t), dtype=np.float64)
    out = {"smallest-first": 1.0 / t, "largest-first": t * t, "front-first": t * (len(t) - pos),
           "back-first": t * (1.0 + pos)}
    for seed in range(count):
        out[f"random-{seed}"] = np.random.default_rng(seed).uniform(0.01, 1.0, len(t))
    return out


def measure(case, random_rankings: int = 4) -> dict:  # noqa: ANN001 - a gate_cases.GateCase
    """One case: its budgeting, ``[k_lo, k_hi]``, the gate's ``N_eff`` and threshold, the lexical pipeline's own
    ``k`` and decision, and ``k`` / decision of adversarial rankings through the real selection."""
    from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText
    from pflash_proxy.compress.gutter import bare_text, find_gutter
    from pflash_proxy.compress.pipeline import gate_scores
    from pflash_proxy.compress.spread import SpreadCurve, asks_for_every
    from pflash_proxy.stages.scorers import default_spread

    text = case.messages[case.long_index]["content"]
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find(case.messages, case.long_index, tt)
    source = "tool" if case.messages[case.long_index]["role"] == "tool" else "paste"
    label = str(case.long_index + 1)
    prompt = tt.total_tokens + 64  # as run.py's measure
    # lexical, the proxy's defaults and the registry's gate curve (shared by every scorer)
    comp = Compressor(CompressionSettings(fallback_spread=default_spread("lexical")))
    cold = comp.compress(tt, request, prompt, False, source, label)
    out = comp.compress(tt, request, prompt, True, source, label)  # the gate off: what it keeps
    a = out.analysis
    if out.mode != "compressed" or a is None:
        return {"mode": out.mode, "reason": out.reason}
    assert isinstance(comp.settings.fallback_spread, SpreadCurve)
    thr = comp.settings.fallback_spread.at(max(prompt, tt.total_tokens))  # as Compressor.compress reads it
    g = find_gutter(tt.lines)
    work = tt if g is None else bare_text(tt, g)
    any_gate = gate_scores(_Other(), work, a.units, a.reps, a.scores, request.text,  # type: ignore[arg-type]
                           request.text)[0]
    free = np.ones(len(a.units), bool)
    free[list(a.pinned)] = False
    bud = budgeting(tt, a, out.budget_tokens, source, label)
    k_lo, k_hi = k_bounds(bud)
    gated = asks_for_every(request.text)
    row: dict = {"mode": "compressed", "tokens": tt.total_tokens, "budget": out.budget_tokens,
                 "pinned_tokens": bud.pinned_tokens, "free": len(bud.sizes), "gated": gated, "thr": thr,
                 "k_lo": k_lo, "k_hi": k_hi, "extra_max": bud.extra_max(k_hi), "code": bud.code,
                 "named_free": bud.named_units, "optional": bud.optional, "blocks": bud.blocks,
                 "lexical_k": out.units_kept - len(a.pinned), "lexical_cold": cold.mode}
    row["lexical_flat"] = cold.mode == "full-flat"
    clause_zero = False
    n_eff = None
    if gated and any_gate is not None:
        sc = np.asarray(any_gate, np.float64)[free]
        tot = float(sc.sum())
        clause_zero = tot <= 0
        n_eff = tot * tot / float(sc @ sc) if tot > 0 else 0.0
        # the lexical scorer's own gate scores (its scores of the request without paths, in code, when the
        # clause is the whole request): the bound for the lexical scorer itself where they differ
        lex = np.asarray(a.gate_scores, np.float64)[free] if a.gate_scores is not None else sc
        row["gate_same_as_lexical"] = bool(np.allclose(lex, sc))
        if not row["gate_same_as_lexical"]:
            lt = float(lex.sum())
            row["lexical_gate_verdict"] = "compressed" if lt <= 0 else verdict(
                k_lo, k_hi, lt * lt / float(lex @ lex), thr)
    row.update(n_eff=n_eff, clause_zero=clause_zero)
    if not gated or clause_zero:
        row.update(verdict="compressed", k_thr=None)
    else:
        assert n_eff is not None
        row.update(verdict=verdict(k_lo, k_hi, n_eff, thr), k_thr=threshold_k(n_eff, thr, len(bud.sizes)),
                   spread_lo=spread(n_eff, k_lo), spread_hi=spread(n_eff, k_hi))
    # adversarial rankings through the real selection (warm: the gate off, so k is known; decision from spread)
    ks, flats = {}, {}
    toks = np.array([u.tokens for u in a.units], dtype=np.int64)
    for name, scores in rankings(toks, random_rankings).items():
        an = dataclasses.replace(a, scores=scores, gate_scores=any_gate)
        o = comp.compress(tt, request, prompt, True, source, label, analysis=an)
        if o.mode != "compressed":
            continue
        ks[name] = o.units_kept - len(a.pinned)
        flats[name] = bool(gated and not clause_zero and o.spread is not None and o.spread > thr)
    row.update(sampled_k=ks, sampled_flat=flats)
    return row


# --- the report ----------------------------------------------------------------------------------------------


def problems(rows: list[dict]) -> list[str]:
    """Where a ranking run through the real selection contradicts the bound (there should be none)."""
    out = []
    for r in rows:
        if r.get("mode") != "compressed":
            continue
        ks = {"lexical": r["lexical_k"], **r["sampled_k"]}
        for name, k in ks.items():
            if not r["k_lo"] <= k <= r["k_hi"]:
                out.append(f"{r['case']}: {name} keeps k={k} outside [{r['k_lo']}, {r['k_hi']}]")
        for name, flat in r["sampled_flat"].items():
            if r["verdict"] != "depends" and flat != (r["verdict"] == "whole"):
                out.append(f"{r['case']}: {name} {'flat' if flat else 'compressed'} against {r['verdict']}")
        lex_verdict = r.get("lexical_gate_verdict", r["verdict"])
        if lex_verdict != "depends" and r["lexical_flat"] != (lex_verdict == "whole"):
            out.append(f"{r['case']}: lexical {'flat' if r['lexical_flat'] else 'compressed'} against {lex_verdict}")
    return out


def _lengths(rows: list[dict]) -> list[int]:
    return sorted({r["band"] for r in rows})


def report(rows: list[dict], command: str = "") -> str:
    """Per length, test split: the share compressed (pointed, agent reads) and served whole (aggregation) for
    every ranking (lower bound) and for some ranking (upper bound), the lexical pipeline's own, and the sampled
    rankings' range; then every case whose decision depends on the ranking."""
    every = [r for r in rows if r.get("mode") == "compressed"]
    ok = [r for r in every if r["split"] == "test"]
    lost = [r for r in rows if r.get("mode") != "compressed"]
    out = ["# Flat gate: the decision for any scorer's ranking (bounds on k)", ""]
    if command:
        out += ["    " + command, ""]
    out += ["Per kind and length (test split): `every` = the decision is the same for every ranking of the "
            "unpinned units (the lower bound for any scorer), `some` = for at least one ranking `k` can take "
            "(upper bound); `lexical` = the lexical pipeline's own decision (cold run); `sampled` = the fewest and "
            "most of the adversarial rankings run through the real selection (smallest first, largest first, "
            "random). [gated: the questions the gate applies to]. Pointed and agent reads: compressed; "
            "aggregation: served whole.", "",
            "| length | pointed compressed: every / some [gated] | lexical | sampled | "
            "agent reads compressed: every / some [gated] | lexical | sampled | "
            "aggregation whole: every / some | lexical | sampled |", "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(rs: list[dict], good: str) -> list[str]:
        if not rs:
            return ["-", "-", "-"]
        n = len(rs)
        every = sum(r["verdict"] == good for r in rs)
        some = sum(r["verdict"] in (good, "depends") for r in rs)
        g = [r for r in rs if r["gated"]]
        gtxt = f" [{sum(r['verdict'] == good for r in g)}-{sum(r['verdict'] in (good, 'depends') for r in g)}" \
            f"/{len(g)}]" if good == "compressed" else ""
        lex = sum(r["lexical_flat"] == (good == "whole") for r in rs)
        names = sorted({k for r in rs for k in r["sampled_flat"]})
        per = [sum(r["sampled_flat"].get(k) == (good == "whole") for r in rs) for k in names]
        pct = f" ({every / n:.0%}-{some / n:.0%})"
        return [f"{every} / {some} of {n}{pct}{gtxt}", f"{lex}/{n}",
                f"{min(per)}-{max(per)}" if per else "-"]

    for b in _lengths(ok):
        mine = [r for r in ok if r["band"] == b]
        cells = (cell([r for r in mine if r["kind"] == "pointed"], "compressed")
                 + cell([r for r in mine if r["kind"] == "agent_read"], "compressed")
                 + cell([r for r in mine if r["kind"] == "aggregation"], "whole"))
        out.append(f"| {b // 1024}K | " + " | ".join(cells) + " |")
    names = sorted({k for r in ok for k in r["sampled_flat"]}, key=lambda k: (k.startswith("random"), k))
    out += ["", "## Each sampled ranking through the real selection (test)", "",
            "The same cases, the ranking's own `k` and decision (no bound): pointed compressed, agent reads "
            "compressed, aggregation whole; `k / lexical k`: median over the pointed and aggregation cases.", "",
            "| ranking | " + " | ".join(f"{b // 1024}K pointed / agent / aggregation | {b // 1024}K k / lexical k"
                                      for b in _lengths(ok)) + " |",
            "|---|" + "---|---|" * len(_lengths(ok))]
    for name in names:
        cells = []
        for b in _lengths(ok):
            mine = [r for r in ok if r["band"] == b and name in r["sampled_flat"]]

            def n(kind: str, whole: bool, mine: list[dict] = mine, name: str = name) -> str:
                rs = [r for r in mine if r["kind"] == kind]
                return f"{sum(r['sampled_flat'][name] == whole for r in rs)}/{len(rs)}" if rs else "-"
            ratio = [r["sampled_k"][name] / max(1, r["lexical_k"]) for r in mine if r["kind"] != "agent_read"]
            cells += [f"{n('pointed', False)} / {n('agent_read', False)} / {n('aggregation', True)}",
                      f"{float(np.median(ratio)):.2f}" if ratio else "-"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    dep = [r for r in ok if r["verdict"] == "depends"]
    shown = [r for r in dep if len(set(r["sampled_flat"].values())) == 2]
    out += ["", f"## Cases whose decision depends on the ranking ({len(dep)}; both decisions taken by sampled "
            f"rankings through the real selection: {len(shown)})", "",
            "Per length and kind, the cases of the bounds' `depends`, and of them those where the sampled rankings "
            "themselves took both decisions (shown), or all served them whole / all compressed them (the bound "
            "alone leaves them open):", "", "| length | kind | depends | shown | sampled all whole | "
            "sampled all compressed |", "|---|---|---|---|---|---|"]
    for b in _lengths(dep):
        for kind in ("pointed", "agent_read", "aggregation"):
            d = [r for r in dep if r["band"] == b and r["kind"] == kind]
            if d:
                sets = [set(r["sampled_flat"].values()) for r in d]
                out.append(f"| {b // 1024}K | {kind} | {len(d)} | {sum(len(x) == 2 for x in sets)} | "
                           f"{sum(x == {True} for x in sets)} | {sum(x == {False} for x in sets)} |")
    out += ["", "`k` range: `[k_lo, k_hi]` (every ranking's `k` lies in it); `k_thr`: the fewest kept units the gate "
            "does not call flat (`spread <= thr`: fewer are served whole); `X`: the most note, marker, names and "
            "close_blocks tokens a round can take off the room (what makes `k_lo` loose); sampled: the rankings' "
            "`k` and their decisions (W whole, C compressed).", "",
            "| case | kind | tokens | budget / pinned | units | N_eff | thr | k range | k_thr | lexical k | "
            "sampled k | sampled | X |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(dep, key=lambda r: (r["band"], r["kind"], r["case"])):
        sk = list(r["sampled_k"].values())
        fl = list(r["sampled_flat"].values())
        out.append(f"| {r['case']} | {r['kind']} | {r['tokens']} | {r['budget']} / {r['pinned_tokens']} | "
                   f"{r['free']} | {r['n_eff']:.1f} | {r['thr']:.3f} | [{r['k_lo']}, {r['k_hi']}] | "
                   f"{r['k_thr']} | {r['lexical_k']} | {min(sk)}-{max(sk)} | {sum(fl)} W {len(fl) - sum(fl)} C | "
                   f"{r['extra_max']} |")
    diff = [r for r in ok if r["gated"] and not r.get("gate_same_as_lexical", True)]
    if diff:
        out += ["", f"Gated cases whose lexical gate scores differ from a drafter scorer's ({len(diff)}; the "
                "lexical scorer reuses its scores of the request without its paths when the every-clause is the "
                "whole request): the verdict with lexical's own, "
                + ", ".join(f"{r['case']} {r['verdict']} -> {r['lexical_gate_verdict']}" for r in diff)]
    bad = problems(every)
    splits = ", ".join(sorted({r["split"] for r in every}))
    n_rank = sum(1 + len(r["sampled_k"]) for r in every)
    out += ["", f"Checks ({splits}: {len(every)} cases, {n_rank} rankings with the lexical one): rankings run through "
            f"the real selection whose `k` or decision contradicts the bound: {len(bad)}"
            + ("" if not bad else " — " + "; ".join(bad[:20]))]
    if lost:
        out += ["", f"Not compressible at all (left out): {len(lost)}"]
    return "\n".join(out) + "\n"
