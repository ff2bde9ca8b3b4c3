"""``CompressStage`` on the engine seam, sans-IO: the in-process ``FakeEngine`` counts and tokenizes, and its
faults stand in for a server that refuses or cannot be reached. A failing count never fails the request: the
message is served whole (``full-error``), and the reason names what the engine said."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pflash_proxy.contract import Dialogue, ProxyRequest, SessionContext
from pflash_proxy.dialects.chat import ChatDialect
from pflash_proxy.engine import EngineError, EngineNotReady, EngineRefused, EngineUnreachable
from pflash_proxy.engine.fake import FakeEngine
from pflash_proxy.stages.compress import CompressStage, ContextTooLong
from tests.conftest import make_settings

LONG = "\n".join(f"line {i}: the build step {i} wrote output file number {i} to the cache" for i in range(400))


def _request(text: str) -> ProxyRequest:
    body = {"messages": [{"role": "user", "content": "Run the build."},
                         {"role": "assistant", "content": "Running it."},
                         {"role": "user", "content": text}]}
    dialect = ChatDialect()
    req = ProxyRequest("chat", "POST", "/v1/chat/completions", {}, json.dumps(body).encode(), body, None)
    req.dialogue = Dialogue(dialect, dialect.parse(body), body)
    record = SimpleNamespace(turns=0, traces=[], trace_totals={}, recall_sources=[])
    turn = SimpleNamespace(record=record, matched=0, served=[], cache="miss", expected=0, queue_ms=None)
    req.notes.session = SessionContext(turn=turn)  # type: ignore[arg-type]
    return req


def _stage(tmp_path, engine: FakeEngine, **kw) -> CompressStage:
    return CompressStage(make_settings("http://127.0.0.1:9", tmp_path, threshold=512, **kw).compression, engine)


async def test_a_long_tool_output_is_compressed_with_the_fake_engines_counts(tmp_path):
    engine = FakeEngine()
    stage = _stage(tmp_path, engine)
    req = _request(LONG)
    await stage.on_request(req)
    assert req.response_headers["X-PFlash-Mode"] == "compressed", req.log_fields
    note = req.notes.compression  # what the savings stage and the metrics read
    assert note is not None and note.mode == "compressed" and note.scorer == "lexical" and note.ms is not None
    assert note.reason is None and {"segment", "score"} <= set(note.stage_ms)
    # the omitted lines are noted for the commit (``Turn.commit``), not written into the session's record here
    assert note.recall is not None and note.recall.omitted_texts
    assert req.notes.session is not None and req.notes.session.turn.record.recall_sources == []
    assert int(req.response_headers["X-PFlash-Kept-Tokens"]) < int(req.response_headers["X-PFlash-Prompt-Tokens"])
    assert engine.calls["count_prompt"] == 1 and engine.calls["pieces"] == 1 and engine.calls["count_text"] >= 1


@pytest.mark.parametrize("op", ["count_prompt", "pieces", "count_text"])
@pytest.mark.parametrize("error", [EngineRefused("/tokenize", 500, "tokenizer exploded"),
                                   EngineUnreachable("upstream unreachable"), EngineNotReady("loading")])
async def test_an_engine_failure_serves_the_message_whole(tmp_path, op: str, error: EngineError):
    engine = FakeEngine()
    engine.fail(op, error, times=10)
    stage = _stage(tmp_path, engine)
    req = _request(LONG)
    await stage.on_request(req)  # never raises
    assert req.response_headers["X-PFlash-Mode"] == "full-error"
    assert req.notes.compression is not None and req.notes.compression.mode == "full-error"
    assert req.notes.compression.reason == req.log_fields["pflash_reason"] == str(error)
    assert req.messages[2]["content"] == LONG


async def test_a_refused_count_says_refused_not_unreachable(tmp_path):
    engine = FakeEngine()
    engine.fail("pieces", EngineRefused("/tokenize", 500, "tokenizer exploded"))
    req = _request(LONG)
    await _stage(tmp_path, engine).on_request(req)
    assert req.notes.compression is not None and req.notes.compression.reason is not None
    reason = req.notes.compression.reason
    assert "refused" in reason and "(500)" in reason and "tokenizer exploded" in reason
    assert "unreachable" not in reason


async def test_the_prompt_limit_is_counted_by_the_engine(tmp_path):
    stage = _stage(tmp_path, FakeEngine(), max_prompt_tokens=1000)
    with pytest.raises(ContextTooLong):
        await stage.on_request(_request(LONG))
