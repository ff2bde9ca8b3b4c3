"""Fixtures for the compression tests."""

from __future__ import annotations

import inspect

import pytest

from pflash_proxy.compress.text import TokenizedText

from .corpus import document_with_needle


@pytest.fixture
def needle_doc() -> TokenizedText:
    return TokenizedText.from_text(document_with_needle())


@pytest.fixture
def python_source() -> str:
    import collections
    return inspect.getsource(collections)
