"""``pflash-proxy show`` reads a session's savings back typed (``stats.SessionSavings``) and prints what it printed
from the mapping: the time-saved column, the prefill line, and nothing for a session without timed turns or an
older proxy's summary without savings."""

from __future__ import annotations

import io
import time

from pflash_proxy.cli.show import print_session, print_sessions
from pflash_proxy.stats import ByCause, SessionSavings

SAVINGS = SessionSavings(turns_timed=2, prompt_tokens=5000, prefilled_tokens=1200, cached_tokens=3800,
                         prefill_s=1.234, rate_tps=972.4, tokens_avoided=ByCause(2100, 3800),
                         saved_s=ByCause(2.16, 3.908), note="estimate")


def _summary(sid: str, savings: object) -> dict:
    s = {"id": sid * 32, "client": "claude-cli", "last_use": time.time() - 120, "turns": 3, "messages": 6,
         "compressed": 1, "tokens_in": 3000, "tokens_served": 900, "tokens_saved": 2100, "recalls": 0,
         "last_cache": "hit", "slot": 1, "snapshot": None, "first_words": "Read the file", "served_whole": 0}
    return s if savings is None else {**s, "savings": savings}


def test_the_savings_read_back_are_the_savings_served():
    assert SessionSavings.from_json(SAVINGS.as_json()) == SAVINGS
    assert SessionSavings.from_json({}).turns_timed == 0 and SessionSavings.from_json({}).rate_tps is None


def test_show_prints_the_typed_savings():
    untimed = {**SAVINGS.as_json(), "turns_timed": 0, "rate_tps": None}
    out = io.StringIO()
    print_sessions({"sessions": [_summary("a", SAVINGS.as_json()), _summary("b", untimed), _summary("c", None)],
                    "total": 3}, out)
    rows = out.getvalue().splitlines()[1:4]
    assert "3,800     ≈6.07s" in rows[0]
    assert "3,800          –" in rows[1] and "2,100         –          –" in rows[2]
    out = io.StringIO()
    print_session({"session": _summary("a", SAVINGS.as_json()), "messages": [], "traces": [], "turns": []}, out)
    assert out.getvalue().splitlines()[1] == (
        "prefill: 1,200 tokens prefilled in 1.23s, 3,800 reused from the slot; time saved ≈ 6.07s (compression "
        "2.16s for 2,100 tokens, cache 3.91s for 3,800 tokens; an estimate at 972 tokens/s)")
    for summary in (_summary("b", untimed), _summary("c", None)):
        out = io.StringIO()
        print_session({"session": summary, "messages": [], "traces": [], "turns": []}, out)
        assert "prefill:" not in out.getvalue()
