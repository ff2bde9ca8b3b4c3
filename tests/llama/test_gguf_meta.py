"""The proxy's GGUF metadata reader against gguf-py's own reader, on files gguf-py writes and on the bundled
model; what it memoises; and that describing a server reads the model file off the event loop."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from pflash_proxy.llama import gguf_meta
from pflash_proxy.llama.spawn import CHATML_STOPS, ModelFacts, gguf_facts


def write_gguf(path: Path, arch: str = "gemma3", window: int | None = 512, template: str | None = None,
               tokens: list[str] | None = None) -> Path:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(2)
    if window is not None:
        w.add_uint32(f"{arch}.attention.sliding_window", window)
    w.add_array("tokenizer.ggml.tokens", tokens or ["<pad>", "hello", "world"])
    w.add_array("tokenizer.ggml.scores", [0.0] * len(tokens or "abc"))
    if template is not None:
        w.add_string("tokenizer.chat_template", template)
    w.add_float32("general.some_float", 0.5)
    w.add_tensor("t", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference(path: Path) -> ModelFacts:
    """The facts as gguf-py's GGUFReader gives them (what ``gguf_facts`` read before)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def field(key: str) -> object:
        f = r.fields.get(key)
        return None if f is None or not f.data else f.parts[f.data[0]]

    arch = bytes(field("general.architecture")).decode()
    w = field(f"{arch}.attention.sliding_window")
    tokens = r.fields.get("tokenizer.ggml.tokens")
    end = CHATML_STOPS[0].encode()
    has_end = tokens is not None and any(bytes(tokens.parts[i]) == end for i in tokens.data)
    return ModelFacts(int(w[0]) if w is not None else None, field("tokenizer.chat_template") is not None, has_end)


@pytest.mark.parametrize("kw", [
    {},
    {"window": None},
    {"template": "{{ messages }}"},
    {"tokens": ["<pad>", "<|im_start|>", "<|im_end|>", "x"]},
    {"arch": "llama", "window": None, "tokens": ["<|im_end|>x", "<|im_end"]},  # near misses are not the token
])
def test_facts_equal_gguf_pys_reader(tmp_path, kw):
    path = write_gguf(tmp_path / "m.gguf", **kw)
    assert gguf_facts(path) == reference(path)


def test_the_bundled_model_reads_as_gguf_py_reads_it(gemma_model):
    assert gguf_facts(gemma_model) == ModelFacts(512, False, False) == reference(gemma_model)


def test_an_unchanged_file_is_read_once_and_a_rewritten_one_again(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf")
    reads: list[str] = []
    real = gguf_meta._read
    monkeypatch.setattr(gguf_meta, "_read", lambda *a: reads.append(a[0]) or real(*a))
    gguf_meta._cached.cache_clear()
    assert gguf_facts(path) == gguf_facts(path) == ModelFacts(512, False, False)
    assert len(reads) == 1
    write_gguf(path, template="{{ x }}", window=1024)
    assert gguf_facts(path) == ModelFacts(1024, True, False)
    assert len(reads) == 2


@pytest.mark.parametrize("data", [b"", b"GGUF", b"NOTAGGUF" * 8, b"GGUF\x03\x00\x00\x00" + b"\x00" * 8 + b"\xff" * 8])
def test_what_is_not_a_whole_gguf_is_a_value_error(tmp_path, data):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError):
        gguf_facts(path)


async def test_describing_a_server_reads_its_model_off_the_loop(monkeypatch):
    from pflash_proxy.llama import engine as engine_mod
    from pflash_proxy.llama.upstream import Upstream

    threads: list[threading.Thread] = []

    def facts(path: Path) -> ModelFacts:
        threads.append(threading.current_thread())
        return ModelFacts(512, False, False)

    async def can_save() -> bool:
        return True

    monkeypatch.setattr("pflash_proxy.llama.spawn.gguf_facts", facts)
    engine = engine_mod.LlamaServerEngine(Upstream("http://127.0.0.1:9"))
    engine._props = {"model_path": "/models/m.gguf", "endpoint_slots": True}
    monkeypatch.setattr(engine._slots, "can_save", can_save)
    warning = await engine.setup_warning("/state/slots")
    assert len(threads) == 1 and threads[0] is not threading.current_thread()  # a worker thread read the file
    assert warning is not None and "--swa-full" in warning
