"""A Claude Code Read result (``     N<TAB>line``) and an opencode read result (``N: line`` in its ``<content>``
wrapper) through the proxy on a real llama-server (issue 25, item 2): counted with the real tokenizer, cut and
scored behind the numbers, the asked-about function served whole with its line numbers."""

from __future__ import annotations

import json
import re

import pytest

from pflash_proxy.server.app import create_app
from pflash_proxy.server.keys import PIPELINE
from tests.conftest import make_settings, session_service

from .test_gutter import difflib_head, function_lines, numbered

pytestmark = pytest.mark.llama

MARKER = re.compile(r"^\[… lines? (\d+)(?:–(\d+))? omitted(?: — .+?)? …\]$")  # names: in code
QUESTION = "In difflib's get_close_matches, what happens when n is 0 or negative?"


@pytest.fixture
async def proxy(aiohttp_client, llama_server, tmp_path):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1024)
    return await aiohttp_client(create_app(settings))


@pytest.mark.parametrize("fmt", ["claude-code", "opencode"])
async def test_numbered_file_read_keeps_the_asked_function_with_its_numbers(proxy, fmt):
    src = difflib_head()
    text, head = numbered(src, fmt)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "Read", "arguments": json.dumps({"file_path": "/work/difflib.py"})}}
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": text}]
    resp = await proxy.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})
    assert resp.status == 200, await resp.text()
    assert resp.headers["X-PFlash-Mode"] == "compressed"
    store = session_service(proxy.app).view()
    served = store.session(resp.headers["X-PFlash-Session"]).served[3]["content"]
    served = served if isinstance(served, str) else served[0]["text"]
    assert len(served) < 0.5 * len(text)
    # kept lines are the client's lines, numbers included, each in its place; markers name what is left out
    orig = text.split("\n")
    pos = 0
    for line in served.split("\n")[1:]:
        m = MARKER.match(line)
        if m:
            pos = int(m.group(2) or m.group(1))
        else:
            assert orig[pos] == line
            pos += 1
    assert pos == len(orig)
    a, b = function_lines(src, "get_close_matches")
    assert "\n".join(orig[head + a:head + b + 1]) in served
    assert 'raise ValueError("n must be > 0: %r" % (n,))' in served
    # the inspector's trace names the gutter the cutter looked behind
    # (the session may also hold a cache trace: the second read's prefix was already in llama-server's slot)
    await proxy.app[PIPELINE].settled()  # the turn's traces are written after its answer
    trace = [t for t in store.trace_log(resp.headers["X-PFlash-Session"]).traces if t["kind"] == "compression"][-1]
    assert trace["gutter"] is not None
