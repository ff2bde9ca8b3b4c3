"""Write the three probe files with ``gguf.GGUFWriter`` (used by tests, docs and conversion scripts).

1. ``random_*_weights(d, ...)`` build a weights dict with exactly the tensor table of ``probes.py`` (float32,
   numpy/row-major shapes), drawn from a seeded generator -- stand-ins for the seed's trained files, which cannot
   be downloaded here.
2. ``write_*_probe(path, weights, meta)`` check the names/shapes against the table, then write
   ``general.architecture``, ``<arch>.schema`` and every ``meta`` entry as ``<arch>.<key>`` (int -> uint32,
   float -> float32, str -> string, bool -> bool), followed by the tensors as F32.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from .probes import (HEAD_ARCH, HEAD_SCHEMA, HEAD_TENSORS, HIDDEN, REQUEST_ARCH, REQUEST_SCHEMA,
                     REQUEST_TENSORS, SEED_DRAFTER_SHA256, SEGMENT_ARCH, SEGMENT_SCHEMA, SEGMENT_TENSORS, MetaValue,
                     Shape)

SEGMENT_DEFAULTS: dict[str, MetaValue] = {"threshold": 0.8, "min_segment": 32, "max_segment": 512,
                                    "oversize_split": "line_aligned", "layer_norm_epsilon": 1e-5,
                                    "activation": "gelu", "hidden_length": HIDDEN}
REQUEST_DEFAULTS: dict[str, MetaValue] = {"threshold": 0.5, "query_pin": 512, "query_tokens": 128,
                                    "layer_norm_epsilon": 1e-5, "activation": "gelu", "hidden_length": HIDDEN}
HEAD_DEFAULTS: dict[str, MetaValue] = {"pooling": "mean", "layer_norm_epsilon": 1e-5}


def _shape(spec: Shape, dims: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(dims[s] if isinstance(s, str) else s for s in spec)


def _random(spec: Mapping[str, Shape], dims: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, sp in spec.items():
        shape = _shape(sp, dims)
        fan_in = shape[-1] if len(shape) > 1 else 1
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("head.logit.scale"):
            w = np.full(shape, 4.0)
        else:
            w = rng.standard_normal(shape) / np.sqrt(fan_in) * (0.5 if "conv" in name else 1.0)
        out[name] = w.astype(np.float32)
    return out


def random_segment_weights(d: int, seed: int = 0) -> dict[str, np.ndarray]:
    return _random(SEGMENT_TENSORS, {"d": d}, seed)


def random_request_weights(d: int, seed: int = 1) -> dict[str, np.ndarray]:
    return _random(REQUEST_TENSORS, {"d": d}, seed)


def random_head_weights(d: int, rank: int = 64, seed: int = 2) -> dict[str, np.ndarray]:
    return _random(HEAD_TENSORS, {"d": d, "r": rank}, seed)


def _write(path: str | os.PathLike[str], arch: str, schema: str, spec: Mapping[str, Shape],
           weights: Mapping[str, np.ndarray], meta: Mapping[str, MetaValue]) -> None:
    from gguf import GGUFWriter
    if set(weights) != set(spec):
        raise ValueError(f"weights differ from the {schema} table: {sorted(set(spec) ^ set(weights))}")
    d = int(meta["embedding_length"])
    dims = {"d": d, "r": int(weights["head.unit.weight"].shape[0]) if "head.unit.weight" in weights else 0}
    for name, sp in spec.items():
        if tuple(weights[name].shape) != _shape(sp, dims):
            raise ValueError(f"{name}: shape {weights[name].shape}, expected {_shape(sp, dims)}")
    w = GGUFWriter(str(path), arch)
    w.add_string(f"{arch}.schema", schema)
    for key, v in meta.items():
        k = f"{arch}.{key}"
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, (int, np.integer)):
            w.add_uint32(k, int(v))
        elif isinstance(v, (float, np.floating)):
            w.add_float32(k, float(v))
        else:
            w.add_string(k, str(v))
    for name in spec:  # table order, so every file lists its tensors the same way
        w.add_tensor(name, np.ascontiguousarray(weights[name], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _meta(defaults: Mapping[str, MetaValue], d: int, tap_block: int, drafter_sha256: str,
          meta: Mapping[str, MetaValue] | None) -> dict[str, MetaValue]:
    return {**defaults, "embedding_length": d, "tap_block": tap_block, "drafter_sha256": drafter_sha256,
            **(meta or {})}


def write_segment_probe(path: str | os.PathLike[str], weights: Mapping[str, np.ndarray],
                        meta: Mapping[str, MetaValue] | None = None, *, tap_block: int = 14,
                        drafter_sha256: str = SEED_DRAFTER_SHA256) -> None:
    d = int(weights["probe.norm.weight"].shape[0])
    _write(path, SEGMENT_ARCH, SEGMENT_SCHEMA, SEGMENT_TENSORS, weights,
           _meta(SEGMENT_DEFAULTS, d, tap_block, drafter_sha256, meta))


def write_request_probe(path: str | os.PathLike[str], weights: Mapping[str, np.ndarray],
                        meta: Mapping[str, MetaValue] | None = None, *, tap_block: int = 14,
                        drafter_sha256: str = SEED_DRAFTER_SHA256) -> None:
    d = int(weights["probe.norm.weight"].shape[0])
    _write(path, REQUEST_ARCH, REQUEST_SCHEMA, REQUEST_TENSORS, weights,
           _meta(REQUEST_DEFAULTS, d, tap_block, drafter_sha256, meta))


def write_scorer_head(path: str | os.PathLike[str], weights: Mapping[str, np.ndarray],
                      meta: Mapping[str, MetaValue] | None = None, *, tap_block: int = 14,
                      drafter_sha256: str = SEED_DRAFTER_SHA256) -> None:
    d = int(weights["head.norm.weight"].shape[0])
    rank = int(weights["head.unit.weight"].shape[0])
    _write(path, HEAD_ARCH, HEAD_SCHEMA, HEAD_TENSORS, weights,
           _meta({**HEAD_DEFAULTS, "rank": rank}, d, tap_block, drafter_sha256, meta))
