"""The four real agent CLIs (Claude Code, Codex CLI, opencode, aider) through the proxy, in a real agent loop.

Scripted loop (one test per client): client → recording front → proxy (``--threshold 1024``) → scripted upstream
→ real llama-server (gemma-3-270m; tokenization, slots, cache counts and a one-token run of every generating
call are real).  The client is asked about one function of a real ~40,000-character source file (the stdlib's
traceback.py, copied into its working directory); turn 1 answers with a call of the client's own read tool
(aider: a text naming the file, which aider adds itself), turn 2 with a final answer.  Asserted:
1. the client exits 0;
2. the file reached the model compressed (``X-PFlash-Mode: compressed`` on turn 2, and shorter than the client's);
   aider's added file reached it byte for byte (its files are history, never shortened: README, aider);
3. the asked-about function reached it whole, as the client rendered it (line-number prefixes included);
4. the system/developer prompt and the tools that reached the model are byte-identical to the client's (the
   Anthropic billing line aside, which the proxy drops by design);
5. turn 2 is a cache hit on turn 1's slot (``X-PFlash-Cache: hit``, same ``X-PFlash-Slot``, and the real run's
   ``cache_n`` covers ≥ 90 % of turn 1's prompt); not for aider, which puts the files it adds before the
   current exchange, so its turn 2 shares only the system prompt with turn 1 (directly too).
Every failed check is collected and reported together.

Real-model runs (no script, one per client): ``pflash-proxy wrap CLIENT`` with the newcomer's own ``say hi``
command line (``claude -p``, ``codex exec --skip-git-repo-check``, ``opencode run``, ``aider --yes --no-git
--message``) against a proxy started as ``make run`` starts it (``serve --spawn``: the bundled gemma-3-270m with
the spawned server's end-of-turn stops and generation cap, and the proxy's cap on an Anthropic answer of
a spawned base model, which ends Claude Code's turn; nothing per client).  Asserted: exit 0 within
``CLI_TIMEOUT_S`` and a non-empty answer.  gemma-3-270m cannot drive these clients' tools; it can end a turn.

Skipped, with the reason, when a CLI is not installed (scripts/setup.sh installs them; see tests/agents/pins.txt).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import traceback as tb_module
from pathlib import Path

import pytest

from pflash_proxy.llama.spawn import free_port
from tests.agents.clients import AGENTS, CACHE, Agent, Run, _base_env, run_agent
from tests.agents.loop import (Stack, file_texts, function_lines, gold_block, pair_turns, run_once,
                               system_and_tools_diff, whole_in)
from tests.agents.scripted import Script
from tests.conftest import start_llama_server, stop_process, wait_until_served

pytestmark = pytest.mark.llama

CLI_TIMEOUT_S = 600
SOURCE = Path(tb_module.__file__)
FUNCTIONS = ("_extract_caret_anchors_from_line_segment", "format_frame_summary")


@pytest.fixture(scope="module")
def agent_llama(gemma_model, tmp_path_factory):
    """llama-server with room for the agents' prompts (Claude Code ~9K tokens before the file, Codex ~5K)."""
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("agents-llama"), parallel=2,
                                ctx_per_slot=32768)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def spawned_proxy(tmp_path_factory):
    """``pflash-proxy serve --spawn`` as ``make run`` runs it (its own state directory; the bundled model)."""
    home = tmp_path_factory.mktemp("spawned-proxy")
    port = free_port()
    log = home / "serve.log"
    env = {**os.environ, "PFLASH_HOME": str(home / "state")}
    with open(log, "ab") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "serve", "--spawn", "--port", str(port),
                                 "--spawn-threads", "2"], env=env, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_until_served(url + "/health", 300, proc, log))
        yield url
    finally:
        stop_process(proc, grace_s=60)


def _agent(name: str) -> Agent:
    agent = AGENTS[name]
    why = agent.missing()
    if why:
        pytest.skip(why)
    return agent


def _workdir(tmp_path: Path) -> tuple[Path, Path, str]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(parents=True)
    home.mkdir(parents=True)
    shutil.copy(SOURCE, work / SOURCE.name)
    name = next(f for f in FUNCTIONS if f"def {f}(" in SOURCE.read_text())
    return work, home, name


def _dump(tmp_path: Path, stack: Stack) -> Path:
    """Everything both sides saw, for a failure message to point at."""
    out = tmp_path / "exchanges.json"
    front = [{"path": x.path, "status": x.status, "headers": x.headers, "response_headers": x.response_headers,
              "body": x.json() or x.body.decode("utf-8", "replace")[:2000]} for x in stack.front.exchanges]
    up = [{"path": r.path, "real_status": r.real_status, "real": r.real, "note": r.note,
           "reply": r.reply.__dict__, "body": r.body} for r in (stack.upstream.received if stack.upstream else [])]
    out.write_text(json.dumps({"front": front, "upstream": up,
                               "forwarded": stack.upstream.forwarded if stack.upstream else []}, indent=1))
    return out


@pytest.mark.timeout(CLI_TIMEOUT_S + 300)
@pytest.mark.parametrize("name", ["claude", "codex", "opencode", "aider"])
async def test_agent_reads_a_long_file_through_the_proxy(name, agent_llama, tmp_path):
    agent = _agent(name)
    work, home, func = _workdir(tmp_path)
    path = work / SOURCE.name
    prompt = (f"What does {func} do? Answer in one sentence." if name == "aider"
              else f"Read {SOURCE.name} and tell me what {func} does, in one sentence.")
    proxy = dict(slot_save_path=agent_llama.slot_dir, threshold=1024)
    async with Stack(agent_llama.url, Script(path), proxy, home / "pflash") as stack:
        result = await run_once(agent, stack, home, work, prompt, SOURCE.name, CLI_TIMEOUT_S)
        dump = _dump(tmp_path, stack)
    where = f"(client output and every exchange: {dump})"
    assert result.rc == 0, f"{name} did not exit 0 {where}\n{result.tail()}"
    turns = pair_turns(stack, SOURCE.name)
    assert len(stack.front.generating()) == len(stack.upstream.received) == len(turns.pairs), \
        f"{len(stack.front.generating())} generating requests from the client, {len(stack.upstream.received)} " \
        f"reached the model ({len(turns.pairs)} paired) {where}"
    assert turns.turn2 is not None and turns.turn1 is not None, f"the file never reached the model {where}"
    (x1, r1), (x2, r2) = turns.pairs[turns.turn1], turns.pairs[turns.turn2]
    problems: list[str] = []

    # 2. compressed
    sent_texts, served_texts = file_texts(x2.json(), SOURCE.name), file_texts(r2.body, SOURCE.name)
    assert sent_texts and served_texts, f"no file text in turn 2 {where}"
    sent, served = sent_texts[-1], served_texts[-1]
    mode = x2.pflash("X-PFlash-Mode")
    if name == "aider":  # by design (README, aider): its added files are history, served whole, never shortened
        if served != sent or mode == "compressed":
            problems.append(f"aider's added file was changed: X-PFlash-Mode={mode}, the client sent {len(sent)} "
                            f"chars, the model got {len(served)}")
    elif mode != "compressed" or len(served) >= len(sent):
        problems.append(f"the file was not compressed: X-PFlash-Mode={mode}, the client sent {len(sent)} "
                        f"chars, the model got {len(served)}")

    # 3. the asked-about function whole, in the client's own rendering
    block = gold_block(sent, function_lines(path, func))
    assert block is not None, f"{func} is not whole in what {name} itself sent {where}"
    if agent.line_numbers:
        n = function_lines(path, func)  # the def line's number starts the client's first line of it
        first = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line == n[0])
        assert block[0].lstrip().startswith(str(first)), f"{name} rendered no line number: {block[0]!r}"
    if not whole_in(block, served):
        kept = sum(1 for line in block if line in served.splitlines())
        problems.append(f"{func} did not reach the model whole: "
                        f"{kept} of its {len(block)} lines kept (served {len(served)} of {len(sent)} chars)")

    # 4. system prompt and tools byte-identical, on every turn
    for label, (x, r) in (("turn 1", (x1, r1)), ("turn 2", (x2, r2))):
        for p in system_and_tools_diff(x.json(), x.path, r.body):
            problems.append(f"{label}: {p}")

    # 5. turn 2 a cache hit on turn 1's slot (not for aider: it puts the files it adds BEFORE the current exchange,
    #    so its turn 2 shares only the system prompt with turn 1, straight to llama-server as much as through us)
    if name != "aider":
        cache2, slot1, slot2 = x2.pflash("X-PFlash-Cache"), x1.pflash("X-PFlash-Slot"), x2.pflash("X-PFlash-Slot")
        if cache2 != "hit" or slot1 is None or slot1 != slot2:
            problems.append(f"turn 2 not a cache hit on turn 1's slot: X-PFlash-Cache={cache2}, "
                            f"slots {slot1} → {slot2}")
        prompt1 = (r1.cache_n or 0) + (r1.prompt_n or 0)
        if not prompt1 or (r2.cache_n or 0) < 0.9 * prompt1:
            problems.append(f"turn 2 reused {r2.cache_n} cached tokens of turn 1's {prompt1}-token prompt (< 90 %)")
    for x in stack.front.exchanges:
        if x.status >= 500:
            problems.append(f"{x.method} {x.path} answered {x.status}")
    assert not problems, f"{name}: {len(problems)} problem(s) {where}\n" + "\n".join(problems)


# the newcomer's commands (README, "agents on the bundled model")
SAY_HI = {"claude": ["-p", "say hi"], "codex": ["exec", "--skip-git-repo-check", "say hi"],
          "opencode": ["run", "say hi"], "aider": ["--yes", "--no-git", "--message", "say hi"]}


def answer_of(name: str, stdout: str, workdir: Path) -> str:
    """The model's answer as the client printed it; aider's from its chat history (its terminal output mixes the
    answer with its banner), the lines after the user's ``#### say hi`` that are not its own ``>`` notes."""
    if name != "aider":
        return stdout.strip()
    history = workdir / ".aider.chat.history.md"
    text = history.read_text() if history.exists() else ""
    after = text.split("#### say hi", 1)[1] if "#### say hi" in text else ""
    return "\n".join(ln for ln in after.splitlines() if ln.strip() and not ln.startswith(">")).strip()


EMPTY_TRIES = 4  # tries of a turn the bundled base model may answer with its end of turn alone


@pytest.mark.timeout(EMPTY_TRIES * CLI_TIMEOUT_S + 120)
@pytest.mark.parametrize("name", ["claude", "codex", "opencode", "aider"])
async def test_agent_says_hi_through_wrap_on_the_spawned_bundled_model(name, spawned_proxy, tmp_path):
    """No script: the bundled model answers, and the client ends its turn (exit 0) with a non-empty answer.

    The bundled base model often writes its end of turn first (an empty answer, still exit 0; each try is a new
    conversation, and Codex answered empty twice in a row in one full suite):
    up to ``EMPTY_TRIES`` tries are allowed for that alone, and every try must end its turn with exit 0."""
    agent = _agent(name)
    for attempt in range(EMPTY_TRIES):
        work, home, _ = _workdir(tmp_path / f"try{attempt}")
        env = {**_base_env(home), "PFLASH_AGENTS_CACHE": str(CACHE), "PFLASH_HOME": str(home / "pflash")}
        run = Run([sys.executable, "-m", "pflash_proxy", "wrap", "--url", spawned_proxy, agent.name,
                   *SAY_HI[name]], env, work)
        result = await run_agent(run, CLI_TIMEOUT_S)
        assert result.rc is not None, f"{name} did not end its turn within {CLI_TIMEOUT_S}s\n{result.tail()}"
        assert result.rc == 0, f"{name} exited {result.rc}\n{result.tail()}"
        if answer_of(name, result.stdout, work):
            return
    pytest.fail(f"{name} printed no answer in {EMPTY_TRIES} turns\n{result.tail()}")
