"""Probe sets trained by ``pflash-proxy train`` and shipped in the package (a few MB each).

Each set is a folder holding ``segment-probe.gguf``, ``request-probe.gguf``, ``scorer-head.gguf``,
``metrics.json`` (the held-out numbers and the drafter's sha256) and a README with the command that made it.
``for_drafter(sha256)`` (``for_drafter_file(path)``) returns the set trained on that exact drafter file, so
``--segmenter probe`` and ``--scorer head`` need no file options when the drafter is one we trained for
(gemma-3-270m Q4_K_M). A set may also hold ``attention-heads.json``: the ``--attention-heads auto`` calibration
of that drafter (``drafter/calibrate.py``), so the first start with it needs no calibration pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = {"segment_probe": "segment-probe.gguf", "request_probe": "request-probe.gguf",
         "scoring_head": "scorer-head.gguf"}
HEADS_FILE = "attention-heads.json"


def sets() -> dict[str, Path]:
    """drafter sha256 -> folder, for every complete packaged set."""
    out = {}
    for d in sorted(p for p in HERE.iterdir() if p.is_dir()):
        try:
            sha = json.loads((d / "metrics.json").read_text())["drafter_sha256"]
        except (OSError, ValueError, KeyError):
            continue
        if all((d / f).is_file() for f in FILES.values()):
            out[str(sha).lower()] = d
    return out


def for_drafter(sha256: str) -> dict[str, Path] | None:
    """{setting name: path} of the set trained on the drafter with this sha256, or None."""
    d = sets().get(sha256.lower())
    return None if d is None else {k: d / f for k, f in FILES.items()}


def for_drafter_file(path: str | os.PathLike[str], hash_cache: str | os.PathLike[str] | None = None
                     ) -> dict[str, Path] | None:
    """``for_drafter`` of this GGUF file's sha256 (memoised in ``hash_cache``): the one lookup the proxy, ``bench
    quality`` and ``bench_drafter.py`` share."""
    from pflash_proxy.drafter.hashing import file_sha256

    return for_drafter(file_sha256(path, hash_cache))


def attention_heads(sha256: str) -> Path | None:
    """The shipped head calibration (``attention-heads.json``) of the drafter with this sha256, or None."""
    d = sets().get(sha256.lower())
    path = None if d is None else d / HEADS_FILE
    return path if path is not None and path.is_file() else None
