"""``pflash-proxy train``: generate, read, fit, write, evaluate.

1. Generate examples ``0..n-1`` (``tasks.build``) and read each with the drafter once (``features.ensure``,
   resumable: an interrupted run continues where it stopped).
2. Split: a code example is held out when its source file hashes into the held-out share, any other example
   when its index does, so no held-out file was seen in training.
3. Fit the segment probe (rows unit/container/subunit), the request probe and the scorer head (``fit``).
4. Write the three GGUF files (``probe_writer``), choosing the segment probe's ``threshold`` on the held-out
   documents (best boundary F1 of the real ``ProbeSegmenter`` over 0.5 ... 0.95).
5. Load them back through the proxy's own loaders and report held-out metrics side by side with the model-free
   stages: boundary P/R/F1 (probe vs the heuristic ``UnitSegmenter``), request-span token F1, and the share of
   questions whose gold units are all kept at the budget (head vs BM25), per family. Written to
   ``metrics.json`` next to the files.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pflash_proxy.progress import Progress

from . import features, fit
from .tasks import ExampleMeta

SEGMENT_ROWS = ["unit", "container", "subunit"]
HELD_OUT_PERCENT = 15


@dataclass
class TrainConfig:
    drafter: Path
    out: Path
    examples: int = 600
    seed: int = 20261130
    tap_block: int | None = None
    epochs: int = 12
    head_epochs: int = 40
    rank: int = 64
    n_ctx: int = 8192
    threads: int = 2
    min_chars: int = 3000
    max_chars: int = 9000
    budget: float = 0.30


def default_tap_block(n_layer: int) -> int:
    """The seed taps block 14 of Qwen3.5-0.8B's 24: the same depth (7/12) for any drafter."""
    return max(0, min(n_layer - 2, n_layer * 7 // 12))


def held_out(meta: ExampleMeta) -> bool:
    key = meta["source"] if meta["kind"] == "code" else f"{meta['index']}"
    return zlib.crc32(key.encode()) % 100 < HELD_OUT_PERCENT


def first_tokens(token_line: np.ndarray, lines: list[int]) -> np.ndarray:
    """Index of the first token on or after each line (a unit's first token)."""
    return np.searchsorted(token_line, np.asarray(lines, np.int64), side="left")


def segment_labels(f: features.Features) -> np.ndarray:
    y = np.zeros((len(f.tap), 3), np.float32)
    for r, lines in enumerate((f.meta["units"], f.meta["containers"], f.meta["subunits"])):
        idx = first_tokens(f.token_line, lines)
        y[idx[idx < len(y)], r] = 1
    return y


def unit_spans(f: features.Features) -> tuple[np.ndarray, np.ndarray]:
    s = first_tokens(f.token_line, f.meta["units"])
    e = np.append(s[1:], len(f.tap))
    return s, np.maximum(e, s)


def head_example(f: features.Features, query_tokens: int = 128) -> fit.HeadExample:
    x = np.asarray(f.tap, np.float32)  # layer-normalised when it was read (features.normalised)
    s, e = unit_spans(f)
    cs = np.concatenate([np.zeros((1, x.shape[1]), np.float64), np.cumsum(x, 0, dtype=np.float64)])
    m = ((cs[e] - cs[s]) / np.maximum(e - s, 1)[:, None]).astype(np.float32)
    q = np.asarray(f.qtap, np.float32)
    req = np.flatnonzero(f.qlabel) if f.qlabel.any() else np.arange(len(q))
    gold = np.zeros(len(s), bool)
    gold[[g for g in f.meta["gold"] if g < len(s)]] = True
    return fit.HeadExample(m, q[req[-query_tokens:]].mean(0), gold, (e - s).astype(np.int64))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train(cfg: TrainConfig) -> dict[str, object]:
    from pflash_proxy.drafter.hashing import file_sha256
    from pflash_proxy.drafter.runtime import Drafter

    from .tasks import WORDNET, wordnet_pairs

    t0 = time.monotonic()
    cfg.out.mkdir(parents=True, exist_ok=True)
    if not wordnet_pairs():
        log(f"train: WordNet not found at {WORDNET} (Debian wordnet-base): latent-association examples are "
            f"replaced by planted needles")
    sha = file_sha256(cfg.drafter, cfg.out / "cache" / "drafter-hashes.json")
    drafter = Drafter(cfg.drafter, n_ctx=cfg.n_ctx, n_threads=cfg.threads, cache_mb=0, timeout=3600)
    try:
        tap = cfg.tap_block if cfg.tap_block is not None else default_tap_block(drafter.n_layer)
        if not 0 <= tap < drafter.n_layer - 1:
            raise ValueError(f"--tap-block {tap} must be in [0, {drafter.n_layer - 2}] for this drafter")
        d = drafter.n_embd
        directory = features.cache_dir(cfg.out, sha, tap, cfg.seed, cfg.min_chars, cfg.max_chars)
        log(f"train: drafter {cfg.drafter.name} ({drafter.n_layer} blocks, d={d}), tap block {tap}, "
            f"{cfg.examples} examples, cache {directory}")
        bar = Progress(cfg.examples, "read  ")
        paths = features.ensure(drafter, directory, cfg.examples, cfg.seed, tap,
                                progress=lambda i: bar(i), lo=cfg.min_chars, hi=cfg.max_chars)
    finally:
        drafter.close()
    feats = [features.load(p) for p in paths]
    tr = [f for f in feats if not held_out(f.meta)]
    va = [f for f in feats if held_out(f.meta)]
    if not tr or not va:
        raise ValueError(f"{len(tr)} training and {len(va)} held-out examples: use more --examples")
    log(f"train: {len(tr)} training, {len(va)} held-out examples "
        f"({sum(len(f.tap) for f in feats):,} document tokens)")

    def data(fs: list[features.Features], query: bool) -> fit.ProbeData:
        return fit.probe_data([(f.qtap, f.qlabel[:, None]) if query else (f.tap, segment_labels(f)) for f in fs])

    seg_tr, seg_va = data(tr, False), data(va, False)
    pos = seg_tr.y.mean(0)
    bar = Progress(cfg.epochs, "segment")
    seg = fit.train_probe(seg_tr, seg_va, SEGMENT_ROWS, list(np.clip(0.5 / np.maximum(pos, 1e-4), 1, 30)),
                          [1.0, 0.3, 0.3], cfg.epochs, cfg.seed, progress=lambda e, v, b: bar(e, f"held-out {v:.4f}"))
    del seg_tr, seg_va
    req_tr, req_va = data(tr, True), data(va, True)
    bar = Progress(cfg.epochs, "request")
    req = fit.train_probe(req_tr, req_va, ["request"], [1.0], [1.0], cfg.epochs * 2, cfg.seed + 1,
                          progress=lambda e, v, b: bar(e // 2, f"held-out {v:.4f}"))
    htr = [head_example(f) for f in tr if f.meta["gold"]]
    hva = [head_example(f) for f in va if f.meta["gold"]]
    bar = Progress(cfg.head_epochs, "head   ")
    head = fit.train_head(htr, hva, cfg.rank, cfg.head_epochs, cfg.seed + 2,
                          progress=lambda e, v, b: bar(e, f"held-out {v:.3f}"))
    from . import evaluate, write

    files = write.write_all(cfg.out, seg, req, head, d=d, tap_block=tap, sha256=sha, train_cfg=cfg)
    thr = evaluate.choose_threshold(files["segment"], va)
    write.set_segment_threshold(files["segment"], seg, d=d, tap_block=tap, sha256=sha, threshold=thr,
                                train_cfg=cfg)
    metrics = evaluate.report(files, va, cfg.budget, cfg.seed, cfg.min_chars, cfg.max_chars)
    metrics.update({"examples": {"train": len(tr), "held_out": len(va)}, "tap_block": tap, "drafter_sha256": sha,
                    "segment_threshold": thr, "seconds": round(time.monotonic() - t0, 1),
                    "families": dict(sorted(_count(feats).items()))})
    (cfg.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _count(feats: list[features.Features]) -> dict[str, int]:
    c: dict[str, int] = defaultdict(int)
    for f in feats:
        c[f.meta["family"]] += 1
    return c
