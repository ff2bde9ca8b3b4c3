"""sha256 of a drafter GGUF, computed once per file and cached by (path, size, mtime).

1. ``stat`` the file; the cache key is ``(realpath, size, st_mtime_ns)``.
2. Look the key up in the in-process dict, then (if given) in a small JSON cache file.
3. On a miss, hash the file in 8 MiB blocks, store the digest in both caches (the JSON file is rewritten
   atomically via a temporary file and ``os.replace``; a corrupt or unwritable cache file is ignored).

A changed size or mtime is a different key, so an edited or replaced drafter file is hashed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

_MEMO: dict[tuple[str, int, int], str] = {}
_LOCK = threading.Lock()
HASH_CALLS = {"n": 0}  # number of real (uncached) hashes done in this process, for tests and stats


def _key(path: str | os.PathLike[str]) -> tuple[str, int, int]:
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_size, st.st_mtime_ns


def _load_json(cache_file: Path) -> dict[str, str]:
    try:
        data = json.loads(cache_file.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def file_sha256(path: str | os.PathLike[str], cache_file: str | os.PathLike[str] | None = None) -> str:
    """Hex sha256 of ``path``, memoised in memory and optionally in the JSON file ``cache_file``."""
    key = _key(path)
    skey = f"{key[0]}|{key[1]}|{key[2]}"
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
    if cache_file is not None:
        hit = _load_json(Path(cache_file)).get(skey)
        if isinstance(hit, str) and len(hit) == 64:
            with _LOCK:
                _MEMO[key] = hit
            return hit
    h = hashlib.sha256()
    with open(key[0], "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    digest = h.hexdigest()
    with _LOCK:
        _MEMO[key] = digest
        HASH_CALLS["n"] += 1
    if cache_file is not None:
        cf = Path(cache_file)
        try:
            data = _load_json(cf)
            data[skey] = digest
            cf.parent.mkdir(parents=True, exist_ok=True)
            tmp = cf.with_suffix(cf.suffix + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=0, sort_keys=True))
            os.replace(tmp, cf)
        except OSError:
            pass
    return digest
