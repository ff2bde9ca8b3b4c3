"""``ValueCache``: values by key, least recently used out first past a bound on the sum of their sizes.

Each value is put with its size, in the caller's unit (the index counts stored bytes, the message-hash memo
characters); a value larger than the bound is not kept.  Thread-safe: the event loop and worker threads share one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")


class ValueCache(Generic[V]):
    """Values by key within ``max_size``, the least recently used out first (module docstring)."""

    def __init__(self, max_size: int = 64 << 20):
        self.max_size = max_size
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._size -= old[1] if old is not None else 0
            if size > self.max_size:
                return
            self._items[key] = (value, size)
            self._size += size
            while self._size > self.max_size:
                _, (_, gone) = self._items.popitem(last=False)
                self._size -= gone

    def discard(self, keys: Sequence[Hashable]) -> None:
        with self._lock:
            for key in keys:
                old = self._items.pop(key, None)
                self._size -= old[1] if old is not None else 0

    @property
    def size(self) -> int:
        """The sum of the kept values' sizes."""
        return self._size

    def __len__(self) -> int:
        return len(self._items)
