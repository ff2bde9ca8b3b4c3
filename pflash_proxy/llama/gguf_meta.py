"""The few GGUF metadata values the proxy needs, read without parsing the whole file.

``gguf.GGUFReader`` builds every field eagerly, the tokenizer's arrays included: for a 262K-token vocabulary
(gemma-3) that is seconds of CPU.  The proxy needs three facts (``ModelFacts``), so this module walks the
metadata once, front to back, as the format lays it out (GGUF v2/v3, little-endian):

1. Header: ``GGUF``, version (u32), tensor count (u64), key/value count (u64).
2. Each key/value: key (u64 length + UTF-8), value type (u32), value.  Scalars have fixed sizes; a string is a
   u64 length and its bytes; an array is an element type (u32), a count (u64) and the elements.
3. A value the caller asked for (``keys``, or a key ending with one of ``suffixes``) is decoded; every other value is skipped: a fixed-size array by
   one seek, a string array by walking its lengths.  In the string array ``tokens_key`` only, each element
   equal to ``token`` is noted (the walk over its lengths happens anyway).
4. Anything else (another magic, version 1, a type code outside the format, a value running past the file)
   raises ``ValueError``.

``read_facts`` memoises by (path, size, modification time), so a server that is described again (each
restart, each proxy in a test run) costs one ``stat``.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GGUFMeta", "read_meta"]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_SIZES = {t: struct.calcsize(f) for t, f in _SCALARS.items()}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFMeta:
    values: dict[str, object]  # the asked-for keys that the file has: scalars, strings, lists of them
    token_found: bool  # ``token`` is an element of ``tokens_key``'s string array


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.end = buf, 0, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise ValueError(f"GGUF metadata runs past the end of the file at byte {start}")
        self.pos = start + n
        return start

    def u32(self) -> int:
        return int(_U32.unpack_from(self.buf, self.take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self.buf, self.take(8))[0])

    def raw(self) -> bytes:
        n = self.u64()
        start = self.take(n)
        return self.buf[start:start + n]

    def scalar(self, kind: int) -> object:
        if kind not in _SCALARS:
            raise ValueError(f"GGUF value type {kind} is not in the format")
        return struct.unpack_from(_SCALARS[kind], self.buf, self.take(_SIZES[kind]))[0]

    def value(self, kind: int) -> object:
        if kind == _STRING:
            return self.raw().decode("utf-8", "replace")
        if kind == _ARRAY:
            elem, count = self.u32(), self.u64()
            return [self.value(elem) for _ in range(count)]
        return self.scalar(kind)

    def skip(self, kind: int, token: bytes | None = None) -> bool:
        """Step 3: past one value; True when ``token`` is an element of this string array."""
        if kind == _STRING:
            self.take(self.u64())
            return False
        if kind != _ARRAY:
            self.scalar(kind)
            return False
        elem, count = self.u32(), self.u64()
        if elem in _SIZES:
            self.take(_SIZES[elem] * count)
            return False
        found = False
        if elem == _STRING:
            buf, n_tok = self.buf, len(token) if token is not None else -1
            for _ in range(count):
                n = self.u64()
                start = self.take(n)
                if n == n_tok and not found and buf[start:start + n] == token:
                    found = True
            return found
        for _ in range(count):  # arrays of arrays (not written by llama.cpp today)
            self.skip(elem)
        return False


def _read(path: str, keys: frozenset[str], suffixes: tuple[str, ...], tokens_key: str | None,
          token: bytes | None) -> GGUFMeta:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        cur.take(4)
        version = cur.u32()
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        cur.u64()  # tensors
        values: dict[str, object] = {}
        found = False
        for _ in range(cur.u64()):
            key = cur.raw().decode("utf-8", "replace")
            kind = cur.u32()
            if key in keys or (suffixes and key.endswith(suffixes)):
                values[key] = cur.value(kind)
            elif cur.skip(kind, token if key == tokens_key else None):
                found = True
        return GGUFMeta(values, found)


@functools.lru_cache(maxsize=16)
def _cached(path: str, size: int, mtime_ns: int, keys: frozenset[str], suffixes: tuple[str, ...],
            tokens_key: str | None, token: bytes | None) -> GGUFMeta:
    return _read(path, keys, suffixes, tokens_key, token)


def read_meta(path: Path, keys: frozenset[str], suffixes: tuple[str, ...] = (), tokens_key: str | None = None,
              token: bytes | None = None) -> GGUFMeta:
    """Steps 1-4 for ``path``: the values of ``keys`` and of the keys ending with one of ``suffixes``, and whether
    ``token`` is an element of ``tokens_key``'s string array."""
    st = os.stat(path)
    return _cached(str(path), st.st_size, st.st_mtime_ns, keys, suffixes, tokens_key, token)
