import pytest

from pflash_proxy.bench.cases import generate


@pytest.fixture(scope="session")
def bench_cases():
    """Every family at 16K and 32K tokens, one case each, seed 7."""
    return generate(lengths=(16_384, 32_768), per_family=1, seed=7)


@pytest.fixture(scope="session")
def by_family(bench_cases):
    out = {}
    for c in bench_cases:
        out.setdefault(c.family, []).append(c)
    return out
