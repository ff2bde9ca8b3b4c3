"""Turn trained weights into the three probe files of ``docs/probes.md`` (via ``probe_writer``).

The LayerNorm affine that training kept at identity is written as weight 1, bias 0. Each file records how it
was made (``trained_by``: the command's settings) besides the format's own metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pflash_proxy.drafter import probe_writer

if TYPE_CHECKING:
    from .run import TrainConfig

NAMES = {"segment": "segment-probe.gguf", "request": "request-probe.gguf", "head": "scorer-head.gguf"}


def _trained_by(cfg: TrainConfig) -> str:
    return (f"pflash-proxy train --examples {cfg.examples} --seed {cfg.seed} --epochs {cfg.epochs} "
            f"--head-epochs {cfg.head_epochs} --rank {cfg.rank}")


def _trunk(p: dict[str, np.ndarray], d: int) -> dict[str, np.ndarray]:
    return {"probe.norm.weight": np.ones(d, np.float32), "probe.norm.bias": np.zeros(d, np.float32),
            "probe.fc.weight": p["fc.weight"], "probe.fc.bias": p["fc.bias"]}


def _rows(p: dict[str, np.ndarray], rows: list[str]) -> dict[str, np.ndarray]:
    out = {}
    for o in rows:
        for k in ("weight", "bias", "conv.weight", "conv.bias"):
            out[f"probe.{o}.{k}"] = p[f"{o}.{k}"]
    return out


def set_segment_threshold(path: Path, seg: dict[str, np.ndarray], *, d: int, tap_block: int, sha256: str,
                          threshold: float, train_cfg: TrainConfig) -> None:
    tmp = path.with_suffix(".tmp")
    probe_writer.write_segment_probe(tmp, {**_trunk(seg, d), **_rows(seg, ["unit", "container", "subunit"])},
                                     {"threshold": float(threshold), "trained_by": _trained_by(train_cfg)},
                                     tap_block=tap_block, drafter_sha256=sha256)
    tmp.replace(path)


def write_all(out: Path, seg: dict[str, np.ndarray], req: dict[str, np.ndarray], head: dict[str, np.ndarray], *,
              d: int, tap_block: int, sha256: str, train_cfg: TrainConfig) -> dict[str, Path]:
    files = {k: out / v for k, v in NAMES.items()}
    set_segment_threshold(files["segment"], seg, d=d, tap_block=tap_block, sha256=sha256, threshold=0.8,
                          train_cfg=train_cfg)
    meta = {"trained_by": _trained_by(train_cfg)}
    tmp = files["request"].with_suffix(".tmp")
    probe_writer.write_request_probe(tmp, {**_trunk(req, d), **_rows(req, ["request"])}, meta,
                                     tap_block=tap_block, drafter_sha256=sha256)
    tmp.replace(files["request"])
    hw = {"head.norm.weight": np.ones(d, np.float32), "head.norm.bias": np.zeros(d, np.float32),
          "head.unit.weight": head["unit.weight"], "head.unit.bias": head["unit.bias"],
          "head.query.weight": head["query.weight"], "head.query.bias": head["query.bias"],
          "head.logit.scale": head["scale"], "head.logit.bias": head["bias"]}
    tmp = files["head"].with_suffix(".tmp")
    probe_writer.write_scorer_head(tmp, hw, meta, tap_block=tap_block, drafter_sha256=sha256)
    tmp.replace(files["head"])
    return files
