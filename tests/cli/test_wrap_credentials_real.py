"""``pflash-proxy wrap`` with the real agent CLIs (tests/agents): the user's own credentials never leave their shell.

The shell holds the user's keys (``ANTHROPIC_API_KEY``, ``ANTHROPIC_AUTH_TOKEN``, ``OPENAI_API_KEY``, ...); for
Claude Code its home also holds a claude.ai login, an ``apiKeyHelper`` and a key in its settings' ``env``.  Each
agent runs through ``wrap --url`` against the recording front of tests/agents (client → front → proxy → scripted
upstream → real llama-server).  Asserted: no request the agent sent, and none the upstream received, carries any
of those secrets; what the agent sent as its credential is the placeholder key.  Skipped per agent when its CLI
is not installed (scripts/setup.sh)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from pflash_proxy.cli.wrap import PLACEHOLDER_KEY, USER_CREDENTIALS
from tests.agents.clients import AGENTS, CACHE, CLAUDE_MODEL, Run, _base_env, run_agent
from tests.agents.loop import Stack
from tests.agents.scripted import Script
from tests.conftest import start_llama_server

pytestmark = pytest.mark.llama

SECRET = "sk-ant-users-own-7d3e"
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")
ARGS = {"claude": ["-p", "Read notes.txt and say what it holds.", "--output-format", "json", "--model",
                   CLAUDE_MODEL, "--tools", "Read", "--max-turns", "3"],
        "codex": ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--color", "never",
                  "Read notes.txt and say what it holds."],
        "opencode": ["run", "Read notes.txt and say what it holds."],
        "aider": ["--yes-always", "--no-git", "--no-pretty", "--no-check-update", "--message", "say hi"]}


@pytest.fixture(scope="module")
def agents_llama(gemma_model, tmp_path_factory):
    server = start_llama_server(gemma_model, tmp_path_factory.mktemp("wrap-keys-llama"), parallel=2,
                                ctx_per_slot=32768)
    yield server
    server.stop()


def _claude_home(home: Path) -> None:
    """A claude.ai login, an apiKeyHelper and a key in the settings' env: each a way Claude Code finds a key."""
    conf = home / ".claude"
    conf.mkdir(parents=True)
    (conf / "settings.json").write_text(json.dumps({"env": {"ANTHROPIC_API_KEY": f"{SECRET}-settings-env"},
                                                    "apiKeyHelper": f"echo {SECRET}-helper"}))
    (conf / ".credentials.json").write_text(json.dumps({"claudeAiOauth": {
        "accessToken": f"{SECRET}-oauth", "refreshToken": f"{SECRET}-refresh",
        "expiresAt": int(time.time() * 1000) + 86_400_000, "scopes": ["user:inference"],
        "subscriptionType": "max"}}))
    (conf / ".credentials.json").chmod(0o600)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["claude", "codex", "opencode", "aider"])
async def test_no_secret_of_the_users_leaves_through_a_wrapped_agent(name, agents_llama, tmp_path):
    agent = AGENTS[name]
    why = agent.missing()
    if why:
        pytest.skip(why)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    notes = work / "notes.txt"
    notes.write_text("The meeting moved to Thursday.\n" * 20)
    if name == "claude":
        _claude_home(home)
    env = {**_base_env(home), "PFLASH_AGENTS_CACHE": str(CACHE), "PFLASH_HOME": str(home / "pflash")}
    if os.environ.get("PYTHONPATH"):  # wrap from this checkout
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update({k: f"{SECRET}-{k}" for k in USER_CREDENTIALS if not k.startswith("CLAUDE_CODE_USE")})
    proxy = dict(slot_save_path=agents_llama.slot_dir, threshold=1024)
    async with Stack(agents_llama.url, Script(notes), proxy, home / "proxy-home") as stack:
        result = await run_agent(Run([sys.executable, "-m", "pflash_proxy", "wrap", "--url", stack.url, name,
                                      *ARGS[name]], env, work), 600)
        sent = [(x.path, x.headers) for x in stack.front.exchanges]
        received = [(r.path, r.headers) for r in stack.upstream.received] if stack.upstream else []
    where = f"\n{result.tail()}\nsent: {json.dumps(sent)[:4000]}"
    generating = [h for p, h in sent if p.startswith(("/v1/messages", "/v1/chat", "/v1/responses", "/chat"))]
    assert generating, f"{name} sent no request to the model{where}"
    assert SECRET not in json.dumps(sent), f"{name} sent one of the user's secrets{where}"
    assert SECRET not in json.dumps(received), f"the upstream received one of the user's secrets{where}"
    for headers in generating:
        creds = {k.lower(): v for k, v in headers.items() if k.lower() in CREDENTIAL_HEADERS}
        assert creds and set(creds.values()) <= {PLACEHOLDER_KEY, f"Bearer {PLACEHOLDER_KEY}"}, (creds, where)
