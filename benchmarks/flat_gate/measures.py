"""Candidate measures of the flat gate, computed again from a case's recorded unpinned scores (``run.py`` rows:
``s`` the scores, ``t`` the tokens, ``k_idx`` the kept ones).

Each measure is "larger = flatter"; the gate serves a request whole when it asks for every match and the measure
is above the scorer's threshold at that length. ``MEASURES`` maps a name to its function of a row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _arrays(r: dict) -> tuple[np.ndarray, np.ndarray, int]:
    return np.asarray(r["s"], np.float64), np.asarray(r["t"], np.float64), len(r["k_idx"])


def _n_eff(s: np.ndarray) -> float:
    tot = float(s.sum())
    return tot * tot / float(s @ s) if tot > 0 else float(len(s))


def spread(r: dict) -> float:
    """The seed's: ``(N_eff - k) / n``."""
    s, _, k = _arrays(r)
    return (_n_eff(s) - k) / max(1, len(s))


def ratio(r: dict) -> float:
    """``N_eff / k``: effective relevant units per unit the budget keeps."""
    s, _, k = _arrays(r)
    return _n_eff(s) / max(1, k)


def _above_median(s: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, s - float(np.median(s))) if len(s) else s


def spread_med(r: dict) -> float:
    """The seed's spread over the relevance above the median unit's (the background every unit has removed)."""
    s, _, k = _arrays(r)
    return (_n_eff(_above_median(s)) - k) / max(1, len(s))


def ratio_med(r: dict) -> float:
    s, _, k = _arrays(r)
    return _n_eff(_above_median(s)) / max(1, k)


def _density(s: np.ndarray, t: np.ndarray) -> np.ndarray:
    return s / np.maximum(t, 1.0)


def dens_spread(r: dict) -> float:
    """The participation ratio of the token-weighted density shares (what the budget ranks by), in tokens,
    against the tokens it keeps: ``(T_eff - T_kept) / T``."""
    s, t, _ = _arrays(r)
    d = _density(s, t)
    w = d * t  # == s
    tot = float(w.sum())
    if tot <= 0:
        return 1.0
    # effective relevant tokens: sum(t) weighted by density shares
    t_eff = tot * tot / float((d * d * t).sum())
    kept = float(t[np.asarray(r["k_idx"], int)].sum()) if r["k_idx"] else 0.0
    return (t_eff - kept) / max(1.0, float(t.sum()))


def dens_ratio(r: dict) -> float:
    s, t, _ = _arrays(r)
    d = _density(s, t)
    tot = float(s.sum())
    if tot <= 0:
        return float("inf")
    t_eff = tot * tot / float((d * d * t).sum())
    kept = float(t[np.asarray(r["k_idx"], int)].sum()) if r["k_idx"] else 0.0
    return t_eff / max(1.0, kept)


def near_top(alpha: float) -> Callable[[dict], float]:
    """Units whose score is at least ``alpha`` of the best one's, per unit the budget keeps."""
    def f(r: dict) -> float:
        s, _, k = _arrays(r)
        if not len(s) or s.max() <= 0:
            return float("inf")
        return float((s >= alpha * s.max()).sum()) / max(1, k)
    return f


def omitted_mass_med(r: dict) -> float:
    """The share of the above-median relevance that the budget leaves out."""
    s, _, _ = _arrays(r)
    a = _above_median(s)
    tot = float(a.sum())
    if tot <= 0:
        return 1.0
    return 1.0 - float(a[np.asarray(r["k_idx"], int)].sum()) / tot if r["k_idx"] else 1.0


def omitted_mass(r: dict) -> float:
    """1 - kept_mass."""
    s, _, _ = _arrays(r)
    tot = float(s.sum())
    return 1.0 - float(s[np.asarray(r["k_idx"], int)].sum()) / tot if tot > 0 and r["k_idx"] else 1.0


MEASURES: dict[str, Callable[[dict], float]] = {
    "spread": spread, "ratio": ratio, "spread_med": spread_med, "ratio_med": ratio_med,
    "dens_spread": dens_spread, "dens_ratio": dens_ratio, "near_top_0.5": near_top(0.5),
    "near_top_0.3": near_top(0.3), "omitted_mass": omitted_mass, "omitted_mass_med": omitted_mass_med,
}
