"""The three probe files (segment probe, request probe, scorer head): GGUF format, loading, numpy forward.

All three read the drafter's tap, the residual leaving block ``tap_block`` (llama.cpp tensor ``l_out-K``), a
``(tokens, d)`` float32 matrix, and all three refuse a drafter other than the one they were trained on.
Exact names, shapes and metadata keys are in ``docs/probes.md`` and in the ``*_TENSORS`` tables below.

Loading (``load_segment_probe`` / ``load_request_probe`` / ``load_scorer_head``):

1. Open with ``gguf.GGUFReader``; any read error (truncated, corrupt, not GGUF) -> ``ProbeFileError`` with one
   line naming the file. Also check that every tensor's data lies inside the file.
2. Check ``general.architecture`` and ``<arch>.schema``; read the metadata into a typed settings object.
3. Check the tensor table: exactly the expected names, shapes (numpy/row-major order) and dtype F32 or F16
   (F16 is widened to float32). Non-finite weights -> ``ProbeFileError``.
4. If a drafter path (or hash) is given, compare ``<arch>.drafter_sha256`` with the drafter's sha256 (hashed once
   per (path, size, mtime), see ``hashing.py``); a difference -> ``ProbeMismatch`` naming both hashes.

Forward of the segment and request probes (the card's architecture):

1. ``x = LayerNorm(tap)`` (eps from metadata, default 1e-5)
2. ``h = GELU(x @ fc.weight.T + fc.bias)``, ``(T, 256)``
3. per output row ``o``: the logit ``z_o = h @ o.weight + o.bias``, ``(T,)``
4. ``out_o = conv5(z_o, o.conv.weight) + o.conv.bias + z_o`` -- a centred, zero-padded 5-tap convolution over
   the token axis of the logit sequence, plus the residual logit (see ``nn.conv5``).
Steps 1-3 run in row chunks; step 4 needs the whole sequence, so the logits of a windowed pass are joined first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, TypeAlias

import numpy as np

from . import nn
from .hashing import file_sha256

HIDDEN = 256
SEED_DRAFTER_SHA256 = "cedf89af31c9041b601fa58303285bc46d99c51baee1b13f5e919626ca526ee5"
SEED_TAP_BLOCK = 14
SEGMENT_ARCH, SEGMENT_SCHEMA = "segmentprobe", "qwen3_5_0_8b_segment_probe_v2"
REQUEST_ARCH, REQUEST_SCHEMA = "requestprobe", "qwen3_5_0_8b_request_probe_v1"
HEAD_ARCH, HEAD_SCHEMA = "scorerhead", "qwen3_5_0_8b_scorer_head_v1"
SEGMENT_OUTPUTS = ("unit", "container", "subunit")

Shape: TypeAlias = tuple[int | str, ...]  # a tensor's shape: sizes, and named sizes ("d": the drafter's width)
MetaValue: TypeAlias = bool | int | float | str  # a probe file's metadata value

_TRUNK: dict[str, Shape] = {"probe.norm.weight": ("d",), "probe.norm.bias": ("d",),
          "probe.fc.weight": (HIDDEN, "d"), "probe.fc.bias": (HIDDEN,)}


def _row(o: str) -> dict[str, Shape]:
    return {f"probe.{o}.weight": (HIDDEN,), f"probe.{o}.bias": (1,),
            f"probe.{o}.conv.weight": (5,), f"probe.{o}.conv.bias": (1,)}


SEGMENT_TENSORS = {**_TRUNK, **{k: v for o in SEGMENT_OUTPUTS for k, v in _row(o).items()}}  # 4 + 3*4 = 16
REQUEST_TENSORS = {**_TRUNK, **_row("request")}  # 4 + 4 = 8
HEAD_TENSORS = {"head.norm.weight": ("d",), "head.norm.bias": ("d",),
                "head.unit.weight": ("r", "d"), "head.unit.bias": ("r",),
                "head.query.weight": ("r", "d"), "head.query.bias": ("r",),
                "head.logit.scale": (1,), "head.logit.bias": (1,)}  # 8


class ProbeError(Exception):
    """Base class of probe-file errors."""


class ProbeFileError(ProbeError):
    """The file is missing, truncated, corrupt, or not the expected probe format."""


class ProbeMismatch(ProbeError):
    """The probe was trained on a different drafter file than the one configured."""


@dataclass(frozen=True)
class ProbeMeta:
    """Metadata common to all three files."""
    path: str
    arch: str
    schema: str
    tap_block: int
    d: int
    drafter_sha256: str
    eps: float = 1e-5
    activation: str = "gelu"
    extra: Mapping[str, MetaValue] = field(default_factory=dict)

    @property
    def tap_tensor(self) -> str:
        return f"l_out-{self.tap_block}"


@dataclass(frozen=True)
class OutputRow:
    weight: np.ndarray  # (256,)
    bias: float
    conv_weight: np.ndarray  # (5,)
    conv_bias: float

    def finish(self, h: np.ndarray) -> np.ndarray:
        """Steps 3-4 over a whole sequence of hidden states ``h`` (T, 256) -> (T,) logits."""
        z = (h @ self.weight + np.float32(self.bias)).astype(np.float32)
        return nn.conv5(z, self.conv_weight, self.conv_bias) + z


@dataclass(frozen=True)
class Trunk:
    norm_weight: np.ndarray
    norm_bias: np.ndarray
    fc_weight: np.ndarray  # (256, d)
    fc_bias: np.ndarray
    eps: float
    activation: str

    def hidden(self, tap: np.ndarray) -> np.ndarray:
        """Steps 1-2: (T, d) -> (T, 256) float32, in row chunks."""
        tap = np.asarray(tap, dtype=np.float32)
        act = nn.ACTIVATIONS[self.activation]
        out = np.empty((tap.shape[0], self.fc_weight.shape[0]), dtype=np.float32)
        gw_t = np.ascontiguousarray((self.fc_weight * self.norm_weight).T)
        for sl in nn.chunked_rows(tap.shape[0]):
            out[sl] = act(nn.ln_linear(tap[sl], self.norm_weight, self.norm_bias, self.eps, self.fc_weight,
                                       self.fc_bias, gw_t))
        return out


@dataclass(frozen=True)
class SegmentLogits:
    unit: np.ndarray
    container: np.ndarray
    subunit: np.ndarray


@dataclass(frozen=True)
class SegmentProbe:
    meta: ProbeMeta
    trunk: Trunk
    rows: Mapping[str, OutputRow]
    threshold: float = 0.8
    min_segment: int = 32
    max_segment: int = 512
    oversize_split: str = "line_aligned"

    def forward(self, tap: np.ndarray) -> SegmentLogits:
        h = self.trunk.hidden(tap)
        return SegmentLogits(*(self.rows[o].finish(h) for o in SEGMENT_OUTPUTS))


@dataclass(frozen=True)
class RequestProbe:
    meta: ProbeMeta
    trunk: Trunk
    row: OutputRow
    threshold: float = 0.5
    query_pin: int = 512
    query_tokens: int = 128

    def forward(self, tap: np.ndarray) -> np.ndarray:
        """Per-token "part of the request" logits, (T,)."""
        return self.row.finish(self.trunk.hidden(tap))


@dataclass(frozen=True)
class ScorerHeadWeights:
    meta: ProbeMeta
    norm_weight: np.ndarray
    norm_bias: np.ndarray
    unit_weight: np.ndarray  # (r, d)
    unit_bias: np.ndarray
    query_weight: np.ndarray  # (r, d)
    query_bias: np.ndarray
    scale: float
    bias: float

    @property
    def rank(self) -> int:
        return int(self.unit_weight.shape[0])


# ----------------------------------------------------------------------------------------------- reading
def _fail(path: str, what: str) -> ProbeFileError:
    return ProbeFileError(f"probe file {path}: {what}")


def _read(path: str | os.PathLike[str], arch: str, schema: str,
          spec: Mapping[str, Shape]) -> tuple[ProbeMeta, dict[str, np.ndarray]]:
    from gguf import GGUFReader, GGMLQuantizationType as Q
    p = str(path)
    if not os.path.isfile(p):
        raise _fail(p, "does not exist")
    size = os.path.getsize(p)
    try:
        r = GGUFReader(p)
        kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
        raw = {t.name: t for t in r.tensors}
        for t in r.tensors:
            if int(t.data_offset) + int(t.n_bytes) > size:
                raise ValueError(f"tensor {t.name} ends past the end of the file")
    except ProbeError:
        raise
    except Exception as e:  # noqa: BLE001 -- every reader failure becomes one clear line
        raise _fail(p, f"not a readable GGUF, truncated or corrupt ({type(e).__name__}: {e})") from None
    if kv.get("general.architecture") != arch:
        raise _fail(p, f"architecture {kv.get('general.architecture')!r}, expected {arch!r}")
    if kv.get(f"{arch}.schema") != schema:
        raise _fail(p, f"schema {kv.get(f'{arch}.schema')!r}, expected {schema!r}")
    try:
        d = int(kv[f"{arch}.embedding_length"])
        meta = ProbeMeta(path=p, arch=arch, schema=schema, tap_block=int(kv[f"{arch}.tap_block"]), d=d,
                         drafter_sha256=str(kv[f"{arch}.drafter_sha256"]).lower(),
                         eps=float(kv.get(f"{arch}.layer_norm_epsilon", 1e-5)),
                         activation=str(kv.get(f"{arch}.activation", "gelu")),
                         extra={k[len(arch) + 1:]: v for k, v in kv.items() if k.startswith(arch + ".")})
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(p, f"missing or invalid metadata {e}") from None
    if meta.activation not in nn.ACTIVATIONS:
        raise _fail(p, f"unknown activation {meta.activation!r}")
    if set(raw) != set(spec):
        missing, extra = sorted(set(spec) - set(raw)), sorted(set(raw) - set(spec))
        raise _fail(p, f"tensor table differs from {schema}: missing {missing}, unexpected {extra}")
    dims = {"d": d}
    if "head.unit.weight" in raw:
        dims["r"] = int(raw["head.unit.weight"].data.shape[0])
    out: dict[str, np.ndarray] = {}
    for name, shape in spec.items():
        t = raw[name]
        want = tuple(dims[s] if isinstance(s, str) else s for s in shape)
        if t.tensor_type not in (Q.F32, Q.F16):
            raise _fail(p, f"tensor {name} has type {t.tensor_type.name}, expected F32 or F16")
        arr = np.array(t.data, dtype=np.float32).reshape(-1)
        if arr.size != int(np.prod(want)):
            raise _fail(p, f"tensor {name} has {arr.size} values, expected shape {want}")
        if not np.isfinite(arr).all():
            raise _fail(p, f"tensor {name} holds non-finite values")
        out[name] = arr.reshape(want)
    return meta, out


def check_drafter(meta: ProbeMeta, drafter: str | os.PathLike[str] | None = None,
                  drafter_sha256: str | None = None, hash_cache: str | os.PathLike[str] | None = None) -> None:
    """Raise ``ProbeMismatch`` unless the configured drafter is the one the probe records."""
    if drafter is None and drafter_sha256 is None:
        return
    got = (drafter_sha256 or file_sha256(drafter, hash_cache)).lower()  # type: ignore[arg-type]
    if got != meta.drafter_sha256:
        name = f" ({drafter})" if drafter is not None else ""
        raise ProbeMismatch(f"probe {meta.path} belongs to drafter sha256 {meta.drafter_sha256}, but the "
                            f"configured drafter{name} has sha256 {got}")


def _trunk(meta: ProbeMeta, t: Mapping[str, np.ndarray]) -> Trunk:
    return Trunk(t["probe.norm.weight"], t["probe.norm.bias"], t["probe.fc.weight"], t["probe.fc.bias"],
                 meta.eps, meta.activation)


def _out_row(t: Mapping[str, np.ndarray], o: str) -> OutputRow:
    return OutputRow(t[f"probe.{o}.weight"], float(t[f"probe.{o}.bias"][0]),
                     t[f"probe.{o}.conv.weight"], float(t[f"probe.{o}.conv.bias"][0]))


def load_segment_probe(path: str | os.PathLike[str], drafter: str | os.PathLike[str] | None = None, *,
                       drafter_sha256: str | None = None, hash_cache: str | os.PathLike[str] | None = None
                       ) -> SegmentProbe:
    meta, t = _read(path, SEGMENT_ARCH, SEGMENT_SCHEMA, SEGMENT_TENSORS)
    check_drafter(meta, drafter, drafter_sha256, hash_cache)
    x = meta.extra
    split = str(x.get("oversize_split", "line_aligned"))
    if split != "line_aligned":
        raise _fail(meta.path, f"oversize_split {split!r} is not supported (only 'line_aligned')")
    return SegmentProbe(meta, _trunk(meta, t), {o: _out_row(t, o) for o in SEGMENT_OUTPUTS},
                        float(x.get("threshold", 0.8)), int(x.get("min_segment", 32)),
                        int(x.get("max_segment", 512)), split)


def load_request_probe(path: str | os.PathLike[str], drafter: str | os.PathLike[str] | None = None, *,
                       drafter_sha256: str | None = None, hash_cache: str | os.PathLike[str] | None = None
                       ) -> RequestProbe:
    meta, t = _read(path, REQUEST_ARCH, REQUEST_SCHEMA, REQUEST_TENSORS)
    check_drafter(meta, drafter, drafter_sha256, hash_cache)
    x = meta.extra
    return RequestProbe(meta, _trunk(meta, t), _out_row(t, "request"), float(x.get("threshold", 0.5)),
                        int(x.get("query_pin", 512)), int(x.get("query_tokens", 128)))


def load_scorer_head(path: str | os.PathLike[str], drafter: str | os.PathLike[str] | None = None, *,
                     drafter_sha256: str | None = None, hash_cache: str | os.PathLike[str] | None = None
                     ) -> ScorerHeadWeights:
    meta, t = _read(path, HEAD_ARCH, HEAD_SCHEMA, HEAD_TENSORS)
    check_drafter(meta, drafter, drafter_sha256, hash_cache)
    if int(meta.extra.get("rank", t["head.unit.weight"].shape[0])) != t["head.unit.weight"].shape[0]:
        raise _fail(meta.path, "metadata rank differs from head.unit.weight rows")
    return ScorerHeadWeights(meta, t["head.norm.weight"], t["head.norm.bias"], t["head.unit.weight"],
                             t["head.unit.bias"], t["head.query.weight"], t["head.query.bias"],
                             float(t["head.logit.scale"][0]), float(t["head.logit.bias"][0]))
