"""Cases sized in the upstream's own tokens, so "16K" means 16K tokens to the model being measured.

The generator sizes cases with an estimate (UTF-8 bytes / 4), which a real tokenizer misses by a factor that
depends on the content (code and logs take more tokens per byte than prose), so an estimated "32K" case can be
more than a 32K slot holds.  For each (family, length, index):

1. generate the case at the nominal length (or, when that would not fit ``cap``, at ``cap / (1 + TOLERANCE)``)
   and count its text with llama-server's tokenizer (``llama.direct.tokenize_counter``);
2. while it is more than ``TOLERANCE`` off (at most ``TRIES`` times), generate it again at
   ``target × wanted / real``: the rng is seeded by the target, so this is another deterministic case;
3. keep the closest try that is not above ``cap`` (the slot's room, for benches that forward), else the smallest;
4. label it with the nominal length (``case_id``, ``target_tokens``, as ``generate`` would) and record the real
   count in ``meta["real_tokens"]``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pflash_proxy.bench.cases import Case, family_names, generate_case, messages_text
from pflash_proxy.llama.direct import CountAsync, tokenize_counter

__all__ = ["ROOM", "TOLERANCE", "TRIES", "CountAsync", "sized_case", "sized_cases", "tokenize_counter"]

TOLERANCE = 0.03
TRIES = 4
ROOM = 512  # a case leaves this much of one slot for the chat template, the salt line and the reply

async def sized_case(count: CountAsync, family: str, length: int, index: int = 0, seed: int = 0,
                     cap: int | None = None) -> Case:
    # Aim inside the slot: under a cap, the whole tolerance band must fit below it.
    wanted = length if cap is None or length * (1 + TOLERANCE) <= cap else round(cap / (1 + TOLERANCE))
    target, tries = wanted, []
    for _ in range(TRIES):
        case = generate_case(family, target, index, seed, nominal=length)
        real = await count(messages_text(case.messages))
        case.meta["generated_at"] = target
        tries.append((real, case))
        if abs(real - wanted) <= TOLERANCE * wanted:
            break
        target = max(256, round(target * wanted / real))
    fitting = [t for t in tries if cap is None or t[0] <= cap]
    real, case = min(fitting, key=lambda t: abs(t[0] - wanted)) if fitting else min(tries, key=lambda t: t[0])
    case.case_id = f"{family}-{length // 1024}k-{index}-s{seed}"
    case.target_tokens = length
    case.meta["real_tokens"] = real
    return case


async def sized_cases(count: CountAsync, families: Sequence[str] | None, lengths: Sequence[int],
                      per_family: int | Mapping[str, int] = 1, seed: int = 0, cap: int | None = None
                      ) -> list[Case]:
    """``generate``'s cases, in its order, each sized to its length in real tokens (see the module steps).
    ``per_family``: cases per family and length, one number for all or ``{family: n, "*": default}``."""
    def n_for(name: str) -> int:
        return per_family if isinstance(per_family, int) else int(per_family.get(name, per_family.get("*", 1)))
    return [await sized_case(count, name, int(n), i, seed, cap) for name in family_names(families)
            for n in lengths for i in range(n_for(name))]
