"""The four real agent CLIs, located where scripts/setup.sh installed them, run headless against a base URL.

1. ``pins()`` reads tests/agents/pins.txt (name, version, registry); the npm CLIs live in
   ``~/.cache/pflash-proxy/agents-<sha256 of "name@version" joined by spaces, 12 hex>/node_modules/.bin`` and aider
   in its own virtual environment ``~/.cache/pflash-proxy/aider-<version>-py<major><minor>/`` (the same names
   setup.sh computes).  ``Agent.missing()`` says why one cannot run (the tests skip with that reason).
2. ``Agent.prepare(home, workdir, base_url)`` writes the client's own configuration under a private ``HOME``
   (Codex: ``$CODEX_HOME/config.toml`` with a custom provider, ``wire_api = "responses"``; opencode: its
   ``opencode.json`` with an OpenAI-compatible provider; aider: a git repository holding the file, so that a
   file name the model mentions can be added by aider itself) and returns the argv and environment of one
   headless run (telemetry, update checks and non-essential traffic off).
3. ``run_agent`` runs it as an asyncio subprocess (the proxy and the scripted upstream may live in the same
   event loop) with a timeout, and returns exit code, stdout, stderr and seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PINS = Path(__file__).resolve().parent / "pins.txt"
CACHE = Path(os.environ.get("PFLASH_AGENTS_CACHE") or Path.home() / ".cache" / "pflash-proxy")
# The model names the clients are told to use (the proxy and llama-server ignore them).
CLAUDE_MODEL = "claude-sonnet-4-5"  # a name Claude Code knows (an unknown one makes it retry with other tools)
MODEL = "gemma"


def pins() -> list[tuple[str, str, str]]:
    out = []
    for line in PINS.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and not line.startswith("#"):
            out.append((parts[0], parts[1], parts[2]))
    return out


def npm_dir() -> Path:
    specs = " ".join(f"{n}@{v}" for n, v, r in pins() if r == "npm")
    return CACHE / f"agents-{hashlib.sha256(specs.encode()).hexdigest()[:12]}"


def aider_dir() -> Path:
    version = next(v for n, v, r in pins() if n == "aider-chat")
    py = os.environ.get("PYTHON", "python3")
    try:
        tag = subprocess.run([py, "-c", "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        tag = f"{sys.version_info[0]}{sys.version_info[1]}"
    return CACHE / f"aider-{version}-py{tag}"


@dataclass
class Run:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass
class Result:
    rc: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float

    def tail(self, n: int = 3000) -> str:
        return f"rc={self.rc} after {self.seconds:.0f}s\n--- stdout\n{self.stdout[-n:]}\n--- stderr\n{self.stderr[-n:]}"


def _base_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "SSL_CERT_FILE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               XDG_CACHE_HOME=str(home / ".cache"), XDG_STATE_HOME=str(home / ".local/state"),
               NO_COLOR="1", CI="1", DO_NOT_TRACK="1")
    return env


class Agent:
    name = ""
    binary = ""
    # how this client renders one line of a file it read, for the tests' "whole with its line numbers" check
    line_numbers = False

    def path(self) -> Path:
        return npm_dir() / "node_modules" / ".bin" / self.binary

    def missing(self) -> str | None:
        p = self.path()
        if not p.exists():
            return (f"{self.name} not installed at {p} (scripts/setup.sh installs it when npm is present; "
                    f"see its 'setup: agent CLIs' line)")
        return None

    def prepare(self, home: Path, workdir: Path, base_url: str, prompt: str, filename: str) -> Run:
        raise NotImplementedError


class ClaudeCode(Agent):
    """``claude -p`` with ``ANTHROPIC_BASE_URL``; ``--tools Read`` keeps the prompt small enough for 2 cores (its
    system prompt, ~27K chars, stays the client's own)."""

    name, binary, line_numbers = "claude", "claude", True

    def prepare(self, home, workdir, base_url, prompt, filename):
        env = _base_env(home)
        env.update(ANTHROPIC_BASE_URL=base_url.rstrip("/"), ANTHROPIC_API_KEY="dummy",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
                   DISABLE_ERROR_REPORTING="1", DISABLE_BUG_COMMAND="1", API_TIMEOUT_MS="900000")
        argv = [str(self.path()), "-p", prompt, "--output-format", "json", "--model", CLAUDE_MODEL,
                "--tools", "Read", "--max-turns", "4"]
        return Run(argv, env, workdir)


class Codex(Agent):
    """``codex exec`` with a custom Responses provider; ``tool_output_token_limit`` raised so that Codex does not
    cut the file to head + tail itself (the proxy, not a blind truncation, decides what the model sees)."""

    name, binary = "codex", "codex"

    def prepare(self, home, workdir, base_url, prompt, filename):
        codex_home = home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        lines = [f'model = "{MODEL}"', 'model_provider = "pflash"', "tool_output_token_limit = 100000",
                 "model_context_window = 32768"]
        lines += ["[analytics]", "enabled = false", "", "[model_providers.pflash]", 'name = "pflash"',
                  f'base_url = "{base_url.rstrip("/")}/v1"', 'wire_api = "responses"',
                  "request_max_retries = 0", "stream_max_retries = 0", "stream_idle_timeout_ms = 900000"]
        (codex_home / "config.toml").write_text("\n".join(lines) + "\n")
        env = _base_env(home)
        env.update(CODEX_HOME=str(codex_home))
        # the sandbox (bubblewrap/seccomp) needs user namespaces a container may not give: the test is about the
        # wire, not about Codex's sandbox
        argv = [str(self.path()), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--color", "never", prompt]
        return Run(argv, env, workdir)


class OpenCode(Agent):
    """``opencode run`` with an ``@ai-sdk/openai-compatible`` provider in its global config."""

    name, binary, line_numbers = "opencode", "opencode", True

    def prepare(self, home, workdir, base_url, prompt, filename):
        conf = home / ".config" / "opencode"
        conf.mkdir(parents=True, exist_ok=True)
        model: dict = {"name": MODEL}
        (conf / "opencode.json").write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"pflash": {"npm": "@ai-sdk/openai-compatible", "name": "pflash",
                                    "options": {"baseURL": base_url.rstrip("/") + "/v1", "apiKey": "dummy",
                                                "timeout": 900000},
                                    "models": {MODEL: model}}},
            "model": f"pflash/{MODEL}", "small_model": f"pflash/{MODEL}", "autoupdate": False, "share": "disabled",
        }, indent=1))
        env = _base_env(home)
        env.update(OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
                   OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1")
        return Run([str(self.path()), "run", prompt], env, workdir)


class Aider(Agent):
    """``aider --message`` in ask mode in a git repository holding the file: the file is NOT given on the command
    line; when the model's answer names it, aider itself adds it to the chat and asks again (its way of reading
    a file), so the conversation has two turns like the tool-using clients'."""

    name, binary = "aider", "aider"

    def path(self) -> Path:
        return aider_dir() / "bin" / "aider"

    def missing(self) -> str | None:
        if not self.path().exists():
            return (f"aider not installed at {self.path()} (scripts/setup.sh installs it into its own venv; "
                    f"see its 'setup: agent CLIs' line)")
        if shutil.which("git") is None:
            return "aider's file mentions need git, which is not on PATH"
        return None

    def prepare(self, home, workdir, base_url, prompt, filename):
        env = _base_env(home)
        env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", AIDER_ANALYTICS="false", GIT_AUTHOR_NAME="t",
                   GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@example.invalid")
        if not (workdir / ".git").exists():
            for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "files"]):
                subprocess.run(["git", *args], cwd=workdir, env=env, check=True, capture_output=True, timeout=60)
        argv = [str(self.path()), "--model", f"openai/{MODEL}", "--openai-api-base", base_url.rstrip("/") + "/v1",
                "--openai-api-key", "dummy", "--chat-mode", "ask", "--yes-always", "--no-auto-commits",
                "--no-dirty-commits", "--no-check-update", "--no-show-release-notes", "--analytics-disable",
                "--no-show-model-warnings", "--no-pretty", "--map-tokens", "0", "--no-gitignore",
                "--timeout", "900", "--message", prompt]
        return Run(argv, env, workdir)


AGENTS: dict[str, Agent] = {a.name: a for a in (ClaudeCode(), Codex(), OpenCode(), Aider())}


async def run_agent(run: Run, timeout_s: float) -> Result:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*run.argv, cwd=str(run.cwd), env=run.env,
                                                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        rc: int | None = proc.returncode
    except asyncio.TimeoutError:
        try:
            os.killpg(proc.pid, 9)  # the CLI and whatever it started (its own process group)
        except ProcessLookupError:
            pass
        out, err = await proc.communicate()
        rc = None
    return Result(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.monotonic() - t0)
