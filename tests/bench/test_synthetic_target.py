"""``benchmarks/gpu/synthetic_target.py``: a random-weight gemma-3 GGUF that the real llama-server loads and serves.

Its answers are noise; only its speed is real.  Checked here: the tiny shape loads, a completion answers 200
with finite timings, it tokenizes exactly like the gemma-3-270m it copied its tokenizer from, the tensors have
the shape's sizes and formats (Q4_K falling back to Q5_0 for rows that are not whole super-blocks).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import start_llama_server


def _module():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "synthetic_target.py"
    spec = importlib.util.spec_from_file_location("synthetic_target", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, json.loads(r.read())


@pytest.fixture(scope="module")
def tiny(gemma_model, tmp_path_factory):
    st = _module()
    return st, st.write_target(tmp_path_factory.mktemp("synthetic") / "tiny.gguf", "tiny", "Q4_0",
                               template_from=gemma_model, seed=3)


def test_tiny_target_serves_and_tokenizes_like_gemma(tiny, llama_server, tmp_path):
    _, path = tiny
    server = start_llama_server(path, tmp_path, parallel=1, ctx_per_slot=2048)
    try:
        status, body = _post(server.url + "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "Say something about rivers."}],
                              "max_tokens": 6, "temperature": 0})
        assert status == 200
        t = body["timings"]
        assert t["prompt_n"] > 5 and t["predicted_n"] >= 1
        assert all(math.isfinite(t[k]) and t[k] > 0 for k in ("prompt_ms", "predicted_ms", "prompt_per_second"))
        text = "The drafter and the target split naïve text like this: def f(x):\n    return x ** 2  # 東京"
        _, mine = _post(server.url + "/tokenize", {"content": text})
        _, gemma = _post(llama_server.url + "/tokenize", {"content": text})
        assert mine["tokens"] == gemma["tokens"] and len(mine["tokens"]) > 20
    finally:
        server.stop()


def test_tensor_formats_and_sizes(tiny, gemma_model, tmp_path):
    from gguf import GGUFReader

    st, path = tiny
    r = GGUFReader(path)
    shape = st.SHAPES["tiny"]
    assert r.fields["gemma3.block_count"].contents() == shape.layers
    assert r.fields["gemma3.attention.head_count_kv"].contents() == shape.kv_heads
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_down.weight"] == "Q4_0" and types["blk.1.attn_norm.weight"] == "F32"
    assert sum(int(t.n_elements) for t in r.tensors) == st.n_params(shape)
    norm = next(t for t in r.tensors if t.name == "blk.0.ffn_norm.weight").data
    assert abs(float(norm.mean()) - 1.0) < 0.01
    # Q4_K: rows of 256 values stay Q4_K, a 1152-wide shape's rows fall back to Q5_0 (--layers keeps it small)
    k = GGUFReader(st.write_target(tmp_path / "k.gguf", "gemma3-1b", "Q4_K", template_from=gemma_model, layers=1))
    ktypes = {t.name: t.tensor_type.name for t in k.tensors}
    assert ktypes["blk.0.attn_q.weight"] == "Q5_0" and ktypes["blk.0.attn_output.weight"] == "Q4_K"
    assert k.fields["gemma3.block_count"].contents() == 1
    with pytest.raises(ValueError, match="unknown shape"):
        st.write_target(tmp_path / "x.gguf", "gemma3-99b")
