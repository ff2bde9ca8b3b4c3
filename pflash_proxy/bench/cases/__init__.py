"""The bench's cases: a seeded offline case generator and a retention checker with baselines.

`generate(...)` builds long-prompt cases whose gold evidence is known; `check_retention(case, received)` says
whether that evidence reached the upstream whole; `head_tail_truncate` and `random_units` are the baselines
compared with PFlash at the same budget.
"""

from pflash_proxy.bench.cases.base import Case, FollowUp, case_tokens, default_count_tokens, messages_text
from pflash_proxy.bench.cases.generator import DEFAULT_LENGTHS, FAMILIES, RULER_FAMILIES, family_names, generate, generate_case
from pflash_proxy.bench.cases.retention import (Retention, check_retention, gold_whole, head_tail_truncate,
                                                marker_line, random_units, shorten_longest)

__all__ = [
    "DEFAULT_LENGTHS", "FAMILIES", "RULER_FAMILIES", "Case", "FollowUp", "case_tokens", "default_count_tokens",
    "family_names", "generate", "generate_case", "messages_text", "Retention", "check_retention", "gold_whole",
    "head_tail_truncate", "marker_line", "random_units", "shorten_longest",
]
