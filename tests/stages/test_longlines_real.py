"""Issue 48, long lines through the real proxy in front of a real llama-server (gemma's token counts), threshold
lowered to 1K tokens: RULER-like paragraphs (one per line, each over 512 tokens), a raw HTML page as fetched, a JSON
API answer on one line (over 5K tokens) and a minified bundle, each as a chat paste and as a tool result.  At
19528cf each was served whole (``full-error: CannotSegment``, one line over ``max_segment``); here each is
compressed to its budget, keeps the fact asked about, marks what it leaves out in the reader's terms, and a
follow-up brings back a part of a line through recall."""

from __future__ import annotations

import json
import re

import pytest

from pflash_proxy.compress.budget import BudgetCurve
from pflash_proxy.compress.rewrite import MARKER_RE, PART_MARKER_RE
from pflash_proxy.server.app import create_app
from tests.compress.longlines_inputs import FACTS, html_page, json_answer, minified_js, wiki_paragraphs
from tests.conftest import make_settings
from tests.stages.test_compress_real import CURVE, ask, served_message

pytestmark = pytest.mark.llama

INPUTS = {  # sized so that the served prompt fits the test server's 4K-token slots
    "wiki": lambda: wiki_paragraphs(n=4, sentences=36, fact_at=2),
    "html": lambda: html_page(items=90),
    "json": lambda: json_answer(users=110),
    "js": lambda: minified_js(modules=70),
}
TERMS = {"wiki": "sentence", "html": "element", "json": "item", "js": "statement"}


@pytest.fixture
async def proxy(aiohttp_client, llama_server, tmp_path):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             prefill_curve=CURVE, query_pin=32)
    return await aiohttp_client(create_app(settings))


def check_verbatim(served: str, original: str) -> None:
    """What is served between the note and the markers is the original's text, in order, byte for byte."""
    body = re.sub(PART_MARKER_RE, "\0", re.sub(MARKER_RE, "\0", served.split("\n", 1)[1], flags=re.M))
    pos = 0
    for kept in body.split("\0"):
        kept = kept.strip("\n")
        if kept:
            at = original.find(kept, pos)
            assert at >= 0, kept[:200]
            pos = at + len(kept)


def _messages(how: str, text: str, question: str) -> list[dict]:
    if how == "paste":
        return [{"role": "user", "content": text + "\n\n" + question}]
    return [{"role": "system", "content": "You are a research agent with a fetch tool."},
            {"role": "user", "content": question + " Fetch it and look."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "fetch", "arguments": json.dumps({"url": "https://example.org/resource"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": text}]


@pytest.mark.parametrize("how", ["paste", "tool"])
@pytest.mark.parametrize("name", list(INPUTS))
async def test_a_long_line_input_is_compressed_with_notes_in_the_readers_terms(proxy, name, how):
    text = INPUTS[name]()
    question = FACTS[name][1]
    messages = _messages(how, text, question)
    h, body = await ask(proxy, messages)
    assert h["X-PFlash-Mode"] == "compressed", h.get("X-PFlash-Reason")
    assert name != "json" or int(h["X-PFlash-Prompt-Tokens"]) >= 5000  # one line of over 5K tokens
    budget = BudgetCurve.parse(CURVE).budget(int(h["X-PFlash-Prompt-Tokens"]))
    assert body["usage"]["prompt_tokens"] <= budget + 4  # landed on the budget, note and markers included
    served = served_message(proxy, h["X-PFlash-Session"], len(messages) - 1)
    original = messages[-1]["content"]
    assert FACTS[name][0] in served
    check_verbatim(served, original)
    parts = re.findall(PART_MARKER_RE, served)
    assert parts and all(TERMS[name] in p for p in parts), parts
    note = served.split("\n", 1)[0]
    assert f'or "[… {parts[0]} omitted …]" were left out' in note
    assert ("call the tool again" if how == "tool" else "ask about it") in note
    for line in served.split("\n")[1:]:
        if line.startswith("[… line"):
            assert re.match(MARKER_RE, line), line


async def test_recall_brings_back_the_omitted_items_of_a_one_line_json(aiohttp_client, llama_server, tmp_path):
    settings = make_settings(llama_server.url, tmp_path, slot_save_path=llama_server.slot_dir, threshold=1000,
                             prefill_curve=CURVE, query_pin=32, recall_budget=1024)  # the turn fits a 4K slot
    proxy = await aiohttp_client(create_app(settings))
    text = json_answer(users=60)  # ~5.4K tokens: served (~1.9K), recalled (<= 1K) and the turn fit a 4K slot
    turn1 = [{"role": "user", "content": text + "\n\n" + FACTS["json"][1]}]
    h, body = await ask(proxy, turn1)
    assert h["X-PFlash-Mode"] == "compressed", h.get("X-PFlash-Reason")
    served = served_message(proxy, h["X-PFlash-Session"], 0)
    data = json.loads(text)["data"]
    missing = next(u for u in data if f'"id": {u["id"]},' not in served and u["username"] != "quillfeather")
    turn2 = turn1 + [body["choices"][0]["message"], {"role": "user", "content":
                     f"And which city does the user {missing['username']} live in, and what roles do they have?"}]
    h2, _ = await ask(proxy, turn2)
    assert h2["X-PFlash-Session"] == h["X-PFlash-Session"] and h2["X-PFlash-Mode"] == "recall"
    recalled = served_message(proxy, h["X-PFlash-Session"], 2)
    excerpts = re.split(r"\n(?=\[pflash recall: )", recalled.split("\n\n" + turn2[-1]["content"])[0])
    hit = next(e for e in excerpts if f'"username": "{missing["username"]}"' in e)
    assert re.fullmatch(r"\[pflash recall: from earlier message 1, line 1, (?:.+, )?items? \d+(?:–\d+)? of 60\]",
                        hit.split("\n", 1)[0])
    assert len(recalled) < len(text) // 2  # parts of the line, not the line
