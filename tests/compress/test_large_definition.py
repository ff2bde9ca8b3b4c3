"""A definition longer than two units' worth whose head the question matches is kept whole when it fits its
share of the budget (issue 48: the pipeline lost what the ranking found: the top unit's definition was completed
only up to ``2 * max_segment`` tokens; users'-words code tasks, dev split: 24/30 against 22/30)."""

from __future__ import annotations

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.pipeline import CompressionSettings


def big_function() -> str:
    lines = ["def settle_ledger(entries, rates, *, rounding='half-even'):",
             '    """Convert every ledger entry to the home currency at the day\'s exchange rate and settle the',
             '    balance, carrying rounding remainders into the next entry."""',
             "    totals = {}", "    rows = list(entries)"]
    for k in range(26):
        lines += [f"    chunk_{k} = [e for e in rows if e.bucket == {k}]",
                  f"    for item in chunk_{k}:",
                  f"        totals[item.key] = totals.get(item.key, 0) + item.value * {k + 1}",
                  f"        item.flags |= {1 << (k % 8)}"]
    lines += ["    return totals"]
    return "\n".join(lines) + "\n"


def small_function(k: int) -> str:
    return (f"def helper_{k}(value, scale={k}):\n"
            f'    """Scale the value for report {k}; rounding happens in the caller."""\n'
            f"    if value is None:\n        return 0\n    return value * scale + {k}\n")


def test_the_top_units_definition_is_kept_whole_though_longer_than_two_units():
    parts = [small_function(k) for k in range(30)] + [big_function()] + [small_function(k) for k in range(30, 200)]
    text = "\n\n".join(parts)
    msgs = [{"role": "user", "content": "When I settle an account, the rounding remainders vanish instead of "
                                        "moving to the next entry. Where does the conversion at the exchange rate "
                                        "happen?"},
            {"role": "assistant", "content": "Reading it.", "tool_calls": [
                {"id": "t", "type": "function", "function": {"name": "Read", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t", "content": text}]
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find(msgs, 2, tt)
    out = Compressor(CompressionSettings(threshold=1024)).compress(tt, request, tt.total_tokens, True, "tool")
    big = big_function()
    assert 1100 < TokenizedText.from_text(big).total_tokens < 0.5 * out.budget_tokens
    assert out.mode == "compressed" and big in out.text
