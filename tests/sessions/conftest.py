"""Fixtures shared by the session tests: a proxy on the fake engine with one slot (``one``) or two (``two``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.sessions.test_fake_engine_pipeline import Proxy, _proxy


@pytest.fixture
async def one(tmp_path) -> AsyncIterator[Proxy]:
    async for p in _proxy(tmp_path):
        yield p


@pytest.fixture
async def two(tmp_path) -> AsyncIterator[Proxy]:
    async for p in _proxy(tmp_path, n_slots=2):
        yield p
