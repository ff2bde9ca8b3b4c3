"""Fast lexical terms for BM25: words, camelCase/snake_case parts and whole identifiers.

Works on UTF-8 bytes with numpy lookups and C-level ``bytes.split`` so tokenizing a
100K-token message costs a few milliseconds (a ``re`` pass over ``str`` costs ~10x).

Algorithm (``span_terms``):
1. Classify every byte: lowercase, uppercase, digit, other ASCII, and non-ASCII (bytes
   >= 128 count as letters, so non-English words stay whole).
2. Part boundaries inside a word run: lower->Upper (``fooBar``), the last capital of a
   capital run before a lowercase letter (``HTTPHeader``), letter<->digit, and
   underscores (separators).
3. Parts: insert a space at every boundary, map ``A-Z`` to ``a-z`` and every other
   ASCII byte but digits and letters to a space (one 256-entry lookup), then split
   each span with ``bytes.split``.
4. Whole identifiers: a word run (letters, digits, ``_``) with two or more parts also
   yields itself, lowercased with underscores removed (``parse_header`` ->
   ``parseheader``); only these compounds are touched in Python.
5. Stopwords are dropped by the caller (``scores.STOPWORDS``) at vocabulary level.
"""

from __future__ import annotations

import numpy as np

__all__ = ["hash_tokens", "span_hashes", "span_terms", "text_terms"]

_TABLE = bytes((c + 32 if 65 <= c <= 90 else c) if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c >= 128)
              else 32 for c in range(256))


def span_terms(data: bytes, spans: list[tuple[int, int]]) -> list[list[bytes]]:
    """Terms of each byte span ``[a, b)`` of ``data`` (steps 1-4)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    n = len(arr)
    if n == 0:
        return [[] for _ in spans]
    lo = (arr >= 97) & (arr <= 122)
    up = (arr >= 65) & (arr <= 90)
    dg = (arr >= 48) & (arr <= 57)
    al = lo | up
    b = np.zeros(n, dtype=bool)
    b[1:] = (lo[:-1] & up[1:]) | (al[:-1] & dg[1:]) | (dg[:-1] & al[1:])
    b[1:-1] |= up[:-2] & up[1:-1] & lo[2:]
    pos = np.flatnonzero(b)
    parts = (np.insert(arr, pos, 32).tobytes() if len(pos) else data).translate(_TABLE)
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    ends = np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    shift_s = (starts + np.searchsorted(pos, starts, side="left")).tolist()
    shift_e = (ends + np.searchsorted(pos, ends, side="left")).tolist()
    result = [parts[s:e].split() for s, e in zip(shift_s, shift_e)]
    # step 4: compound identifiers (word runs with two or more parts)
    alnum = al | dg | (arr >= 128)
    word = alnum | (arr == 95)
    wt = np.flatnonzero(word[1:] != word[:-1]) + 1
    edges = np.concatenate(([0] if word[0] else [], wt, [n] if word[-1] else [])).astype(np.int64)
    ws, we = edges[0::2], edges[1::2]
    if len(ws) == 0:
        return result
    at = np.flatnonzero(alnum[1:] & ~alnum[:-1]) + 1
    if alnum[0]:
        at = np.concatenate(([0], at))
    cnt = (np.searchsorted(at, we) - np.searchsorted(at, ws)) + (np.searchsorted(pos, we) - np.searchsorted(pos, ws))
    multi = np.flatnonzero(cnt >= 2)
    if len(multi) == 0:
        return result
    mws, mwe = ws[multi], we[multi]
    unit_of = np.searchsorted(ends, mws, side="right")
    ok = (unit_of < len(spans))
    ok[ok] &= mws[ok] >= starts[unit_of[ok]]
    for a, e, u in zip(mws[ok].tolist(), mwe[ok].tolist(), unit_of[ok].tolist()):
        result[u].append(data[a:e].lower().replace(b"_", b""))
    return result


def text_terms(text: str) -> list[str]:
    """All terms of ``text`` as strings (stopwords included)."""
    data = text.encode("utf-8")
    return [t.decode("utf-8", "replace") for t in span_terms(data, [(0, len(data))])[0]]


# ----------------------------------------------------------------- hashed terms (the index's fast path)
_KEEP_CASEFOLD = bytes((c + 32 if 65 <= c <= 90 else c) for c in range(256))
_R = np.random.default_rng(0x5EED).integers(1, 2**63, size=64, dtype=np.uint64) | np.uint64(1)
_MIX = np.uint64(0x9E3779B97F4A7C15)


def hash_tokens(buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hash, start, length) of every space-separated token of ``buf`` (64-bit, vectorised).

    ``h = (sum_i byte_i * R[min(i, 63)]) * MIX + length`` in uint64 arithmetic, with odd
    random ``R``; distinct terms collide with negligible probability.
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    tok = a != 32
    if not tok.any():
        z = np.zeros(0, np.int64)
        return z.astype(np.uint64), z, z
    edge = np.flatnonzero(np.diff(np.concatenate(([False], tok, [False])).view(np.int8)))
    starts, ends = edge[0::2], edge[1::2]
    lengths = ends - starts
    first = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    inpos = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(first, lengths)
    vals = a[tok].astype(np.uint64) * _R[np.minimum(inpos, 63)]
    with np.errstate(over="ignore"):
        h = np.add.reduceat(vals, first) * _MIX + lengths.astype(np.uint64)
    return h, starts.astype(np.int64), lengths.astype(np.int64)


def span_hashes(data: bytes, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hashes of the terms of each span: (hash, span index, is_single_letter), same terms as ``span_terms``."""
    arr = np.frombuffer(data, dtype=np.uint8)
    n = len(arr)
    z = np.zeros(0, np.int64)
    if n == 0 or not spans:
        return z.astype(np.uint64), z, z.astype(bool)
    lo = (arr >= 97) & (arr <= 122)
    up = (arr >= 65) & (arr <= 90)
    dg = (arr >= 48) & (arr <= 57)
    al = lo | up
    b = np.zeros(n, dtype=bool)
    b[1:] = (lo[:-1] & up[1:]) | (al[:-1] & dg[1:]) | (dg[:-1] & al[1:])
    b[1:-1] |= up[:-2] & up[1:-1] & lo[2:]
    pos = np.flatnonzero(b)
    parts = (np.insert(arr, pos, 32).tobytes() if len(pos) else data).translate(_TABLE)
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    ends = np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    h, ts, tl = hash_tokens(parts)
    pa = np.frombuffer(parts, dtype=np.uint8)
    single = (tl == 1) & (pa[ts] >= 97) & (pa[ts] <= 122)
    unit = np.searchsorted(starts + np.searchsorted(pos, starts), ts, side="right") - 1
    # compounds: word runs (letters, digits, "_", non-ASCII) with two or more parts
    alnum = al | dg | (arr >= 128)
    word = alnum | (arr == 95)
    edge = np.flatnonzero(np.diff(np.concatenate(([False], word, [False])).view(np.int8)))
    ws, we = edge[0::2], edge[1::2]
    at = np.flatnonzero(alnum & ~np.concatenate(([False], alnum[:-1])))
    cnt = (np.searchsorted(at, we) - np.searchsorted(at, ws)) + (np.searchsorted(pos, we) - np.searchsorted(pos, ws))
    multi = np.flatnonzero(cnt >= 2)
    if len(multi):
        mws, mwe = ws[multi].tolist(), we[multi].tolist()
        comp = b" ".join([data[x:y] for x, y in zip(mws, mwe)]).translate(_KEEP_CASEFOLD, b"_")
        ch, _, _ = hash_tokens(comp)
        cu = np.searchsorted(starts, ws[multi], side="right") - 1
        if len(ch) == len(cu):  # an all-underscore word would vanish; then skip compounds safely
            h = np.concatenate((h, ch))
            unit = np.concatenate((unit, cu))
            single = np.concatenate((single, np.zeros(len(ch), bool)))
    inside = (unit >= 0) & (unit < len(spans))
    return h[inside], unit[inside], single[inside]
