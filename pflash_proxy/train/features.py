"""Read each example once with the drafter and keep what the probes need, one file per example (resumable).

For example ``i`` (``tasks.build``):

1. Tokenize the document and ``QUERY_SEP + query`` separately and concatenate them, exactly as
   ``HeadScorer.query_vector`` does, and run ONE drafter pass over the stream that returns the tap of block K
   for every token.
2. Map document tokens to lines (``segment.token_lines``) and query tokens to characters
   (``Drafter.token_starts``); a query token is a request token when it starts inside the question's span.
3. Save ``<cache>/<i>.npz`` (taps layer-normalised, as float16, the token lines, request labels) plus the
   example's JSON labels through a temporary file and ``os.replace``, so an interrupted run leaves only whole
   files and the next run resumes at the first missing index.

The cache directory is named after the drafter's sha256, the tap block, the seed and the document sizes, so a
changed setting never mixes features.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from pflash_proxy.drafter import nn
from pflash_proxy.drafter.head import QUERY_SEP
from pflash_proxy.drafter.segment import token_lines

from .tasks import Example, ExampleMeta, build

if TYPE_CHECKING:
    from pflash_proxy.drafter.runtime import Drafter


@dataclass
class Features:
    meta: ExampleMeta
    tap: np.ndarray  # (doc tokens, d) float16, layer-normalised
    token_line: np.ndarray  # (doc tokens,) int
    qtap: np.ndarray  # (query tokens, d) float16
    qlabel: np.ndarray  # (query tokens,) uint8: 1 = request token


def cache_dir(out: Path, sha256: str, tap_block: int, seed: int, lo: int, hi: int) -> Path:
    return out / "cache" / f"{sha256[:12]}-b{tap_block}-s{seed}-c{lo}-{hi}"


def extract(drafter: Drafter, ex: Example, tap_block: int) -> Features:
    text = ex.doc.text
    toks = drafter.tokenize(text)
    qtext = QUERY_SEP + ex.query
    qt = drafter.tokenize(qtext)
    r = drafter.trace(np.concatenate([toks, qt]), taps=(tap_block,), save=False)
    tap = r.taps[tap_block]
    starts = np.asarray(drafter.token_starts(qtext, qt))
    a, b = ex.request[0] + len(QUERY_SEP), ex.request[1] + len(QUERY_SEP)
    qlabel = ((starts >= a) & (starts < b)).astype(np.uint8)
    return Features(ex.meta(), normalised(tap[:len(toks)]), token_lines(drafter.token_starts(text, toks), text),
                    normalised(tap[len(toks):]), qlabel)


def normalised(tap: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """LayerNorm without affine, as float16: the raw residual stream of some drafters (gemma) exceeds float16's
    range, the normalised one does not (|x| <= sqrt(d)); the probes' own LayerNorm of it is the identity."""
    return nn.layer_norm(tap, np.float32(1.0), np.float32(0.0), eps).astype(np.float16)


def _save(path: Path, f: Features) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, tap=f.tap, token_line=f.token_line, qtap=f.qtap, qlabel=f.qlabel,
             meta=np.frombuffer(json.dumps(f.meta).encode(), np.uint8))
    os.replace(tmp, path)


def load(path: Path) -> Features:
    with np.load(path) as z:
        return Features(json.loads(bytes(z["meta"]).decode()), z["tap"], z["token_line"], z["qtap"], z["qlabel"])


def ensure(drafter: Drafter, directory: Path, n: int, seed: int, tap_block: int,
           progress: Callable[[int], None] | None = None, lo: int = 3000, hi: int = 9000) -> list[Path]:
    """Features of examples ``0..n-1`` in ``directory``, computing only the missing ones (step 3)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = directory / f"{i:06d}.npz"
        if not path.exists():
            _save(path, extract(drafter, build(i, seed, lo, hi), tap_block))
        paths.append(path)
        if progress is not None:
            progress(i + 1)
    return paths
