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

__all__ = ["hash_tokens", "span_hashes", "span_term_ids", "span_terms", "stem", "text_terms", "word_forms"]

_TABLE = bytes((c + 32 if 65 <= c <= 90 else c) if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c >= 128)
              else 32 for c in range(256))


def _part_boundaries(arr: np.ndarray) -> np.ndarray:
    """Byte offsets where an identifier splits into parts: camelCase (aB, ABc) and letter/digit changes."""
    lo = (arr >= 97) & (arr <= 122)
    up = (arr >= 65) & (arr <= 90)
    dg = (arr >= 48) & (arr <= 57)
    al = lo | up
    b = np.zeros(len(arr), dtype=bool)
    b[1:] = (lo[:-1] & up[1:]) | (al[:-1] & dg[1:]) | (dg[:-1] & al[1:])
    b[1:-1] |= up[:-2] & up[1:-1] & lo[2:]
    return np.flatnonzero(b)


def _compound_runs(arr: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of the word runs (letters, digits, "_", non-ASCII) made of two or more parts: parts
    are split by "_"/non-word bytes or at the ``_part_boundaries`` ``pos``."""
    alnum = ((arr | 32) >= 97) & ((arr | 32) <= 122) | ((arr >= 48) & (arr <= 57)) | (arr >= 128)
    word = alnum | (arr == 95)
    edge = np.flatnonzero(np.diff(np.concatenate(([False], word, [False])).view(np.int8)))
    ws, we = edge[0::2], edge[1::2]
    at = np.flatnonzero(alnum & ~np.concatenate(([False], alnum[:-1])))
    cnt = (np.searchsorted(at, we) - np.searchsorted(at, ws)) + (np.searchsorted(pos, we) - np.searchsorted(pos, ws))
    multi = np.flatnonzero(cnt >= 2)
    return ws[multi], we[multi]


def span_terms(data: bytes, spans: list[tuple[int, int]]) -> list[list[bytes]]:
    """Terms of each byte span ``[a, b)`` of ``data`` (steps 1-4)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    n = len(arr)
    if n == 0:
        return [[] for _ in spans]
    pos = _part_boundaries(arr)
    parts = (np.insert(arr, pos, 32).tobytes() if len(pos) else data).translate(_TABLE)
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    ends = np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    shift_s = (starts + np.searchsorted(pos, starts, side="left")).tolist()
    shift_e = (ends + np.searchsorted(pos, ends, side="left")).tolist()
    result = [parts[s:e].split() for s, e in zip(shift_s, shift_e)]
    # step 4: compound identifiers (word runs with two or more parts)
    mws, mwe = _compound_runs(arr, pos)
    if len(mws) == 0:
        return result
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
    pos = _part_boundaries(arr)
    parts = (np.insert(arr, pos, 32).tobytes() if len(pos) else data).translate(_TABLE)
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    h, ts, tl = hash_tokens(parts)
    pa = np.frombuffer(parts, dtype=np.uint8)
    single = (tl == 1) & (pa[ts] >= 97) & (pa[ts] <= 122)
    unit = np.searchsorted(starts + np.searchsorted(pos, starts), ts, side="right") - 1
    # compounds: word runs (letters, digits, "_", non-ASCII) with two or more parts
    cws, cwe = _compound_runs(arr, pos)
    if len(cws):
        comp = b" ".join([data[x:y] for x, y in zip(cws.tolist(), cwe.tolist())]).translate(_KEEP_CASEFOLD, b"_")
        ch, _, _ = hash_tokens(comp)
        cu = np.searchsorted(starts, cws, side="right") - 1
        if len(ch) == len(cu):  # an all-underscore word would vanish; then skip compounds safely
            h = np.concatenate((h, ch))
            unit = np.concatenate((unit, cu))
            single = np.concatenate((single, np.zeros(len(ch), bool)))
    inside = (unit >= 0) & (unit < len(spans))
    return h[inside], unit[inside], single[inside]


# ----------------------------------------------------------------- term ids (the index build's fast path)
_STRIDE = 8
_BYTE = np.uint64(255)
_LENMASK = np.array([(1 << (8 * k)) - 1 for k in range(_STRIDE + 1)], dtype=np.uint64)
_MARKS = (1, 2, 3, 4, 5, 6, 7, 8, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 0)


def _hash_at(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``hash_tokens`` of the tokens ``buf[s:s + l]`` (same values), reading each token 8 bytes at a time as one
    little-endian uint64 word.  ``buf`` must extend at least 8 bytes past the last token.
    """
    n = len(starts)
    acc = np.zeros(n, dtype=np.uint64)
    if n == 0:
        return acc
    words = np.ndarray((len(buf) - _STRIDE + 1,), dtype="<u8", buffer=buf, strides=(1,))
    act = None  # None: all tokens
    s, ln = starts, lengths
    k = 0
    with np.errstate(over="ignore"):
        while True:
            w = words[s + k] & _LENMASK[np.minimum(ln - k, _STRIDE)]
            part = (w & _BYTE) * _R[min(k, 63)]
            for i in range(1, _STRIDE):
                part += ((w >> np.uint64(8 * i)) & _BYTE) * _R[min(k + i, 63)]
            if act is None:
                acc += part
            else:
                acc[act] += part
            k += _STRIDE
            more = ln > k
            if not more.any():
                break
            act = np.flatnonzero(more) if act is None else act[more]
            s, ln = s[more], ln[more]
        return acc * _MIX + lengths.astype(np.uint64)


def span_term_ids(data: bytes, starts: np.ndarray, drop: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Terms of the spans starting at byte offsets ``starts`` (sorted; each span runs to the next start, the
    last to the end of ``data``) as (vocab, term id, span index).

    Same terms and hashes as ``span_hashes``: ``vocab`` is the sorted unique 64-bit hashes of the kept terms,
    ``term id`` indexes ``vocab``, one entry per term occurrence, ordered by span.  Terms whose hash is in
    ``drop`` (sorted) are left out.
    """
    return span_term_ids_grouped(data, starts, drop)[:3]


def span_term_ids_grouped(data: bytes, starts: np.ndarray, drop: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``span_term_ids`` plus the same (term id, span index) entries sorted by term id, then span index."""
    arr = np.frombuffer(data, dtype=np.uint8)
    n = len(arr)
    z = np.zeros(0, np.int64)
    if n == 0 or len(starts) == 0:
        return z.astype(np.uint64), z, z, z, z
    pos = _part_boundaries(arr)
    # inserted boundary marks are a control byte absent from the text (a space after translation)
    mark = next((c for c in _MARKS if bytes((c,)) not in data), None)
    if mark is None:
        vocab, ids, unit = _span_term_ids_slow(data, starts, drop)
        order = np.lexsort((unit, ids))
        return vocab, ids, unit, ids[order], unit[order]
    raw = np.insert(arr, pos, mark) if len(pos) else arr
    m = len(raw)
    pa = np.frombuffer(raw.tobytes().translate(_TABLE), dtype=np.uint8)
    tok = np.empty(m + 2, dtype=bool)
    tok[0] = tok[-1] = False
    np.not_equal(pa, 32, out=tok[1:-1])
    edge = np.flatnonzero(tok[1:] != tok[:-1])
    ts, te = edge[0::2], edge[1::2]
    tl = te - ts
    padded = np.concatenate((pa, np.zeros(_STRIDE, np.uint8)))
    h = _hash_at(padded, ts, tl)
    # span of each token: spans start at byte offsets; a token's span is the last span starting at or before it
    sstart = starts + np.searchsorted(pos, starts)
    cuts = np.searchsorted(ts, sstart, side="left")
    unit = np.repeat(np.arange(-1, len(starts), dtype=np.int64), np.diff(cuts, prepend=0, append=len(ts)))
    # compounds: runs of >= 2 tokens joined only by "_" or boundary marks (one word run of the text)
    if len(ts) > 1:
        gs, ge = te[:-1], ts[1:]
        g1 = raw[gs]
        link = (g1 == mark) | (g1 == 95)
        long = link & (ge - gs > 1)
        if long.any():
            g2 = raw[ge[long] - 1]
            link[long] = (g2 == mark) | (g2 == 95)
        long = np.flatnonzero(link & (ge - gs > 2))
        if len(long):  # a link's gap must hold only "_" and marks: count other bytes per gap
            la, ll = gs[long], ge[long] - gs[long]
            off = np.cumsum(ll) - ll
            gb = raw[np.repeat(la - off, ll) + np.arange(int(ll.sum()), dtype=np.int64)]
            bad = np.add.reduceat(((gb != 95) & (gb != mark)).astype(np.int64), off)
            link[long[bad > 0]] = False
        if link.any():
            lk = np.concatenate(([False], link, [False]))
            ce = np.flatnonzero(lk[1:] != lk[:-1])
            c0, c1 = ce[0::2], ce[1::2]  # chain of tokens c0..c1 (inclusive)
            cs, cend = ts[c0], te[c1]
            # each chain's bytes cs..cend without the spaces between its tokens, packed one after another
            ln = cend - cs
            off = np.cumsum(ln) - ln
            gb = pa[np.repeat(cs - off, ln) + np.arange(int(ln.sum()), dtype=np.int64)]
            nsp = gb != 32
            cl = np.add.reduceat(nsp.astype(np.int64), off)
            cst = np.cumsum(cl) - cl
            ch = _hash_at(np.concatenate((gb[nsp], np.zeros(_STRIDE, np.uint8))), cst, cl)
            cu = unit[c0]
            at = np.searchsorted(unit, cu, side="right")
            h = np.insert(h, at, ch)
            unit = np.insert(unit, at, cu)
    keep = unit >= 0
    if not keep.all():
        h, unit = h[keep], unit[keep]
    keep = unit < len(starts)
    if not keep.all():
        h, unit = h[keep], unit[keep]
    return _vocab_ids_sorted(h, unit, drop)


def _stable_order(h: np.ndarray) -> np.ndarray:
    """``np.argsort(h, kind="stable")``, usually via one value sort of packed (hash prefix, position) keys.

    The packed sort is checked: when two distinct hashes share the prefix and come out of order, the
    stable argsort decides, so the result is always the stable order.
    """
    n = len(h)
    bits = max(1, (n - 1).bit_length())
    if n < 2 or bits > 32:
        return np.argsort(h, kind="stable")
    low = np.uint64((1 << bits) - 1)
    key = (h & ~low) | np.arange(n, dtype=np.uint64)
    key.sort()
    order = (key & low).astype(np.int64)
    hs = h[order]
    if (hs[1:] < hs[:-1]).any():
        return np.argsort(h, kind="stable")
    return order


def _vocab_ids_sorted(h: np.ndarray, unit: np.ndarray, drop: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(vocab, ids, unit) as ``span_term_ids`` returns them, plus (ids, unit) of the same entries sorted by
    (id, unit): one stable sort of the hashes (``unit`` is non-decreasing) gives both."""
    order = _stable_order(h)
    hs = h[order]
    new = np.empty(len(hs), dtype=bool)
    new[:1] = True
    np.not_equal(hs[1:], hs[:-1], out=new[1:])
    vocab = hs[new]
    sid = np.cumsum(new) - 1
    ids = np.empty(len(h), dtype=np.int64)
    ids[order] = sid
    sunit = unit[order]
    if len(drop):
        keepv = ~_sorted_isin(vocab, drop)
        if not keepv.all():
            vocab = vocab[keepv]
            remap = np.cumsum(keepv) - 1
            ok = keepv[ids]
            sok = keepv[sid]
            return vocab, remap[ids[ok]], unit[ok], remap[sid[sok]], sunit[sok]
    return vocab, ids, unit, sid, sunit


def _span_term_ids_slow(data: bytes, starts: np.ndarray, drop: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ends = np.concatenate((starts[1:], [len(data)]))
    h, unit, _ = span_hashes(data, list(zip(starts.tolist(), ends.tolist())))
    vocab = np.unique(h)
    vocab = vocab[~_sorted_isin(vocab, drop)] if len(drop) else vocab
    ids = np.searchsorted(vocab, h)
    ok = ids < len(vocab)
    ok[ok] = vocab[ids[ok]] == h[ok]
    return vocab, ids[ok], unit[ok]


def _sorted_isin(x: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    k = np.minimum(np.searchsorted(sorted_set, x), len(sorted_set) - 1)
    found: np.ndarray = sorted_set[k] == x
    return found


# ----------------------------------------------------------------- prose word forms (``stem``, ``word_forms``)
# A small Porter-like stemmer of English word forms, for prose only (``scores.LexicalScorer`` matches a question's
# word to its other forms in prose units: "PPP" / "PPPs", "populated" / "population", "segregating" /
# "segregation"). One suffix is stripped, the longest that leaves enough of the word: inflections (plural s,
# -ed, -ing) leave at least 3 characters, derivations (-ation, -ate, -ion, -er) at least 4, -ly at least 5;
# then a final "e" goes, a final "y" becomes "i" and a doubled final consonant is undoubled.
_DERIVED = ("ations", "ation", "ators", "ator", "ating", "ated", "ates", "ate", "ions", "ion", "ers", "er")
_INFLECTED = ("ies", "ied", "ings", "ing", "edly", "ed", "es", "s")
_SUFFIXES = tuple(sorted(((s, 4) for s in _DERIVED), key=lambda x: -len(x[0]))) + (("ly", 5),) + tuple(
    sorted(((s, 3) for s in _INFLECTED), key=lambda x: -len(x[0])))  # "unjustly" -> "unjust", "only" stays
_MIN_WORD = 3  # shorter words are their own stem
_KEEP_S = ("ss", "us", "is")  # "class", "virus", "analysis": not plurals
_FORMS = ("", "e", "s", "es", "ed", "ing", "ly", "er", "ers", "ion", "ions", "ation", "ations", "ate", "ates", "ated",
          "ating", "ator", "ators")


def stem(word: str) -> str:
    """The stem of a lowercase English word form (``population``, ``populated`` -> ``popul``; ``ppps`` -> ``ppp``).
    Words with a digit, and words of fewer than ``_MIN_WORD`` letters, are their own stem."""
    if len(word) < _MIN_WORD or not word.isalpha():
        return word
    w = word
    for suffix, keep in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= keep:
            if suffix == "s" and w.endswith(_KEEP_S):
                continue
            w = w[: -len(suffix)] + ("i" if suffix in ("ies", "ied") else "")
            break
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    elif len(w) > 3 and w.endswith("y"):
        w = w[:-1] + "i"
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "aeiouylsz":
        w = w[:-1]
    return w


def word_forms(word: str) -> list[str]:
    """Other forms of ``word`` with its stem (``stem``): the stem with each of ``_FORMS``, with a doubled final
    consonant before -ed/-ing, and with y/ies/ied for a stem in "i"; ``word`` itself left out."""
    s = stem(word)
    if s == word and not word.isalpha():
        return []
    cands = {s + f for f in _FORMS}
    if s and s[-1] not in "aeiou":
        cands |= {s + s[-1] + f for f in ("ed", "ing", "er", "ers")}
    if s.endswith("i"):
        cands |= {s[:-1] + f for f in ("y", "ies", "ied")}
    return sorted(c for c in cands if c != word and stem(c) == s)
