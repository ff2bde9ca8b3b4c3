"""``ValueCache``: values by key, least recently used out first past a bound on the bytes they keep alive.

Each value is put with its size in bytes: what its key and value keep alive in this process, however they are
typed (``footprint``: numbers, nesting and many small items count as much as long strings), and the cache adds
``ENTRY_BYTES`` for the entry itself. A value larger than the bound is not kept. Thread-safe: the event loop and
worker threads share one.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")

# what an entry costs the cache beyond its key and value: the OrderedDict's node and hash slot, the (value, size)
# pair and the size's int (~170 bytes in CPython 3.12), rounded up
ENTRY_BYTES = 256

_SCALARS = (str, bytes, int, float, bool, complex, type(None))


def footprint(value: object) -> int:
    """A conservative estimate of the bytes ``value`` keeps alive: the sum of ``sys.getsizeof`` over it and
    everything it holds (dict keys and values, list/tuple/set items, a dataclass's or an object's fields, an
    array's buffer). A container is counted once however often it is reached (so a cycle ends); a scalar (string,
    number, the interpreter's cached small ints and singletons too) every time: an over-estimate, never an
    under-estimate. Each object's size is rounded up to the allocator's 16-byte blocks (a float asks for 24 bytes
    and holds 32), so the count is what the process really spends, not what ``tracemalloc`` is asked for. Linear
    in the size of ``value``; iterative, so any nesting depth is measured."""
    total = 0
    stack = [value]
    seen: set[int] = set()
    def getsizeof(obj: object) -> int:
        return (sys.getsizeof(obj) + 15) & ~15

    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        x = pop()
        t = type(x)
        if t in _SCALARS:
            total += getsizeof(x)
            continue
        if id(x) in seen:
            continue
        seen.add(id(x))
        total += getsizeof(x)
        if t is dict or isinstance(x, dict):
            extend(x)  # type: ignore[arg-type]
            extend(x.values())  # type: ignore[attr-defined]
        elif t is list or t is tuple or isinstance(x, (list, tuple, set, frozenset)):
            extend(x)  # type: ignore[arg-type]
        elif hasattr(x, "dtype") and isinstance(nbytes := getattr(x, "nbytes", None), int):  # a numpy array
            if getattr(x, "base", None) is not None:  # a view: getsizeof counts the buffer of an owner only
                total += nbytes
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                push(getattr(x, f.name, None))
            if hasattr(x, "__dict__"):
                total += getsizeof(x.__dict__)
        elif hasattr(x, "__dict__") and not isinstance(x, type):
            push(vars(x))
    return total


class ValueCache(Generic[V]):
    """Values by key within ``max_size`` bytes (and ``max_items`` entries, where given), the least recently used
    out first (module docstring)."""

    def __init__(self, max_size: int = 64 << 20, max_items: int | None = None):
        self.max_size = max_size
        self.max_items = max_items
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
        """Keep ``value`` under ``key``; ``size``: the bytes both keep alive (``footprint`` of each, or a
        conservative estimate of them); the entry counts ``ENTRY_BYTES`` more."""
        size += ENTRY_BYTES
        with self._lock:
            old = self._items.pop(key, None)
            self._size -= old[1] if old is not None else 0
            if size > self.max_size:
                return
            self._items[key] = (value, size)
            self._size += size
            while self._size > self.max_size or (self.max_items is not None and len(self._items) > self.max_items):
                _, (_, gone) = self._items.popitem(last=False)
                self._size -= gone

    def discard(self, keys: Sequence[Hashable]) -> None:
        with self._lock:
            for key in keys:
                old = self._items.pop(key, None)
                self._size -= old[1] if old is not None else 0

    @property
    def size(self) -> int:
        """The bytes counted for the kept entries (their keys, values and ``ENTRY_BYTES`` each)."""
        return self._size

    def __len__(self) -> int:
        return len(self._items)
