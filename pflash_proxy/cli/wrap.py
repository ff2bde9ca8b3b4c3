"""``pflash-proxy wrap AGENT [ARGS...]``: run an agent CLI (Claude Code, Codex, opencode, aider) against the proxy.

1. The proxy: the one that answers at ``--url`` (default: the configured ``http://HOST:PORT``, else the one
   serving from the configured state directory on another port: ``cli/home.py``; that one's URL is used only
   when the directory and its lock file are this user's and the URL proves it is the proxy holding the lock,
   ``GET /pflash/holder`` answering the HMAC of a fresh challenge under the lock file's nonce) — a pflash-proxy
   is one whose ``/pflash/metrics`` answers — waiting while its llama-server starts.  A state directory that
   another user owns or others can write into is refused in one line.  With none there, and
   ``--spawn`` or ``--upstream URL`` given, a ``pflash-proxy serve`` is started as a child on the configured port
   (a free one when that is taken), its output in ``$PFLASH_HOME/wrap-serve.log``, and waited for until
   ``/health`` answers 200.  Without either flag: one line saying how to start one.
2. What the agent needs to know, read through the proxy: the model's name (``/v1/models``) and its context per
   slot (``/props``: ``default_generation_settings.n_ctx``).
3. The agent, found on ``PATH`` or where ``scripts/setup.sh`` installed it (``~/.cache/pflash-proxy/agents-*/``,
   ``aider-*/``; ``PFLASH_AGENTS_CACHE`` moves that folder), gets its own configuration, in a temporary folder
   removed afterwards, with telemetry and update checks off; the user's arguments follow unchanged:

   - Claude Code: ``ANTHROPIC_BASE_URL``, the agent's key as ``ANTHROPIC_AUTH_TOKEN`` (first in Claude Code's
     order, above a claude.ai login) and as ``ANTHROPIC_API_KEY`` (above an ``apiKeyHelper``, whose output it
     would otherwise send as ``x-api-key``), a long ``API_TIMEOUT_MS``; the same in a ``--settings`` file, with
     its other credential variables emptied, since Claude Code applies the ``env`` of the user's own settings
     over its environment (a key there was sent as ``x-api-key``);
   - Codex: ``CODEX_HOME`` = a folder whose ``config.toml`` names a ``pflash`` provider (``base_url`` = the
     proxy's ``/v1``, ``wire_api = "responses"``, its key read from ``PFLASH_WRAP_KEY``) and raises
     ``tool_output_token_limit`` (else Codex itself cuts a command's output to ~10K characters before the proxy
     sees it);
   - opencode: ``OPENCODE_CONFIG`` = a file with an ``@ai-sdk/openai-compatible`` provider (the agent's key) and
     the model's ``limit`` (the slot's context; output: half of it, where opencode would ask for 32,000), merged
     over the user's own configuration;
   - aider: ``--openai-api-base``, ``--openai-api-key`` (the agent's key), ``--model openai/NAME``, before the
     user's arguments.

   The agent's key is the configured ``--upstream-api-key`` (``PFLASH_UPSTREAM_API_KEY``: llama-server's own key,
   which the proxy forwards with the agent's requests) or else the placeholder ``pflash-proxy``; never the user's
   own: the model-provider credentials these agents read (``USER_CREDENTIALS``: ``ANTHROPIC_API_KEY``,
   ``ANTHROPIC_AUTH_TOKEN``, ``OPENAI_API_KEY`` ...) are removed from the agent's environment, so none of them
   reaches the proxy, llama-server or an ``--upstream`` host.
4. The agent runs in the foreground (the terminal's Ctrl-C reaches it, not this process, which waits); a
   SIGTERM or SIGHUP to this process is passed on to it.  When it exits, a proxy started in step 1 is stopped
   (SIGTERM, then SIGKILL after ``STOP_GRACE_S``; it also gets SIGTERM from the kernel should this process die
   first), and the agent's exit status is returned (128 + N for a signal N).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Mapping, Sequence

from pflash_proxy.cli.home import Untrusted, check_home, holder
from pflash_proxy.server.keys import PROOF_PATH, proof
from pflash_proxy.config import Settings

AGENT_NAMES = ("claude", "codex", "opencode", "aider")
STOP_GRACE_S = 45.0  # the proxy snapshots its sessions on the way out (--shutdown-save-timeout-s, 30 s)
PLACEHOLDER_KEY = "pflash-proxy"  # the proxy and llama-server without --api-key check no key
CLAUDE_READS = ("CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_CUSTOM_HEADERS", "CLAUDE_CODE_USE_BEDROCK",
                "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")  # Claude Code's other ways: emptied in --settings
KEY_VAR = "PFLASH_WRAP_KEY"  # the variable Codex's provider reads its key from (its ``env_key``)
# Model-provider credentials the four agents (and litellm, under aider) read from the environment, and the ways
# they would take another route than the proxy's: none is passed to a wrapped agent (step 3).
USER_CREDENTIALS = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_CUSTOM_HEADERS",
    "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY",
    "OPENAI_API_KEY", "CODEX_API_KEY", "OPENAI_ORG_ID", "OPENAI_ORGANIZATION", "OPENAI_PROJECT",
    "AZURE_OPENAI_API_KEY", "AZURE_API_KEY", "OPENROUTER_API_KEY",
    "AIDER_OPENAI_API_KEY", "AIDER_ANTHROPIC_API_KEY", "AIDER_API_KEY", "AIDER_OPENAI_API_BASE",
    "OPENAI_API_BASE", "OPENAI_BASE_URL", "ANTHROPIC_API_BASE",
)
LONG_TIMEOUT_MS = 900_000  # a first long prompt on a CPU can take minutes to prefill


class WrapError(Exception):
    """One line for the user; exit status 1 (2 for a usage error)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("wrap", help="run an agent CLI (claude, codex, opencode, aider) against the proxy",
                       description="Run an agent CLI against the proxy: the one at --url, or one started here "
                                   "with --spawn / --upstream (stopped when the agent exits). The arguments after "
                                   "AGENT go to the agent unchanged.")
    p.add_argument("--url", help="the proxy to use (default http://HOST:PORT from the configuration)")
    p.add_argument("--config", help="TOML configuration file (also PFLASH_CONFIG); a proxy started here reads it too")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--spawn", action="store_true",
                     help="with no proxy at the URL: start one that spawns llama-server (gemma-3-270m by default)")
    how.add_argument("--upstream", metavar="URL",
                     help="with no proxy at the URL: start one in front of the llama-server at URL")
    p.add_argument("--startup-timeout-s", type=float, default=None,
                   help="how long to wait for the proxy to serve (default: the configuration's "
                        "--startup-timeout-s plus a minute)")
    p.add_argument("agent", choices=AGENT_NAMES, metavar="AGENT", help="one of " + ", ".join(AGENT_NAMES))
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the agent's own arguments, unchanged")


# 1. the proxy ----------------------------------------------------------------------------------------------
def _get(url: str, timeout_s: float = 3.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout_s) as r:  # noqa: S310
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if exc.fp is not None else b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""


def probe(url: str) -> str:
    """``absent`` (nothing answers), ``other`` (something that is not a pflash-proxy), ``starting`` (a proxy
    whose llama-server is not ready yet) or ``ready``."""
    status, body = _get(url + "/pflash/metrics")
    if status == 0:
        return "absent"
    if status != 200 or b"pflash_" not in body:
        return "other"
    return "ready" if _get(url + "/health")[0] == 200 else "starting"


def answers_as_holder(url: str, nonce: str) -> bool:
    """Whether the proxy at ``url`` is the one that wrote ``nonce`` into its lock file (``cli/home.py``, step 5):
    it answers a fresh challenge with its HMAC under that nonce."""
    challenge = secrets.token_hex(16)
    status, body = _get(f"{url}{PROOF_PATH}?challenge={challenge}")
    try:
        answered = json.loads(body)["proof"] if status == 200 else ""
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(answered, str) and hmac.compare_digest(answered, proof(nonce, challenge))


def serving_from(home: Path) -> str | None:
    """The URL of the proxy serving from ``home`` (its lock file), once it proved it holds that lock."""
    found = holder(home)
    if found is None:
        return None
    url, nonce = found
    if answers_as_holder(url, nonce):
        return url
    print(f"pflash-proxy wrap: not using {url}, named in {home}/serve.lock: it does not answer as the proxy "
          f"holding that lock", file=sys.stderr)
    return None


def port_free(host: str, port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, port))
        return True
    except OSError:
        return False


@dataclass
class StartedProxy:
    proc: subprocess.Popen
    url: str
    log_path: Path

    def tail(self, n: int = 12) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def serve_command(settings: Settings, args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "pflash_proxy", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if args.config:
        cmd += ["--config", args.config]
    cmd += ["--spawn"] if args.spawn else ["--upstream", args.upstream]
    return cmd


def start_proxy(settings: Settings, args: argparse.Namespace) -> StartedProxy:
    from pflash_proxy.llama.spawn import die_with_parent, free_port

    wanted = settings.proxy.port
    port = wanted if wanted and port_free("127.0.0.1", wanted) else free_port()
    log_path = _home(settings) / "wrap-serve.log"
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise WrapError(f"cannot write {log_path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "ab") as logf:
        # a session of its own: the terminal's Ctrl-C reaches the agent, and this process stops the proxy after it
        proc = subprocess.Popen(serve_command(settings, args, port), stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=logf, start_new_session=True, preexec_fn=die_with_parent())
    return StartedProxy(proc, f"http://127.0.0.1:{port}", log_path)


def _home(settings: Settings) -> Path:
    """The configured state directory, when it is this user's alone (``cli/home.py``, step 1)."""
    try:
        return check_home(settings.proxy.home)
    except Untrusted as exc:
        raise WrapError(str(exc)) from None


def wait_ready(url: str, timeout_s: float, started: StartedProxy | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if started is not None and started.proc.poll() is not None:
            raise WrapError(f"the proxy exited with code {started.proc.returncode} while starting (its log, "
                            f"{started.log_path}, ends with:\n{started.tail()})")
        if probe(url) == "ready":
            return
        time.sleep(0.5)
    where = f" (its log: {started.log_path})" if started is not None else ""
    raise WrapError(f"the proxy at {url} did not serve within {timeout_s:.0f}s{where}")


def stop_proxy(started: StartedProxy, grace_s: float = STOP_GRACE_S) -> None:
    proc = started.proc
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# 2. what the agent needs to know ----------------------------------------------------------------------------
@dataclass
class ServerInfo:
    model: str = "local"
    ctx: int | None = None  # tokens per slot


def server_info(url: str) -> ServerInfo:
    info = ServerInfo()
    status, body = _get(url + "/v1/models")
    try:
        data = json.loads(body) if status == 200 else {}
        model = str(data["data"][0]["id"])
        # llama-server names a model by the path it was given: its file name reads better in an agent's banner
        info.model = (Path(model).name if model.startswith("/") else model) or info.model
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    status, body = _get(url + "/props")
    try:
        gen = (json.loads(body) if status == 200 else {}).get("default_generation_settings") or {}
        if isinstance(gen.get("n_ctx"), int) and gen["n_ctx"] > 0:
            info.ctx = gen["n_ctx"]
    except (ValueError, AttributeError):
        pass
    return info


# 3. the agents ----------------------------------------------------------------------------------------------
def agents_cache(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("PFLASH_AGENTS_CACHE") or Path.home() / ".cache" / "pflash-proxy")


def find_agent(name: str, environ: Mapping[str, str]) -> Path:
    """The agent's executable: on PATH, else the newest complete install of scripts/setup.sh."""
    found = shutil.which(name, path=environ.get("PATH"))
    if found:
        return Path(found)
    cache = agents_cache(environ)
    pattern = "aider-*/bin/aider" if name == "aider" else f"agents-*/node_modules/.bin/{name}"
    installs = [p for p in cache.glob(pattern) if (p.parents[1 if name == "aider" else 2] / ".installed").exists()]
    if installs:
        return max(installs, key=lambda p: p.stat().st_mtime)
    package = {"claude": "npm i -g @anthropic-ai/claude-code", "codex": "npm i -g @openai/codex",
               "opencode": "npm i -g opencode-ai", "aider": "pipx install aider-chat"}[name]
    raise WrapError(f"{name} not found on PATH nor in {cache} (install it: `{package}`, or run scripts/setup.sh "
                    f"in a checkout)")


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # path -> text written before the launch


def _quiet(env: dict[str, str], **extra: str) -> None:
    for k, v in extra.items():
        env.setdefault(k, v)


def codex_config(base_url: str, info: ServerInfo) -> str:
    lines = [f"model = {json.dumps(info.model)}", 'model_provider = "pflash"',
             # Codex cuts a command's output to head + tail (~10K characters) below this; the proxy decides instead
             "tool_output_token_limit = 100000"]
    if info.ctx:
        lines.append(f"model_context_window = {info.ctx}")
    lines += ["", "[analytics]", "enabled = false", "", "[model_providers.pflash]", 'name = "pflash-proxy"',
              f"base_url = {json.dumps(base_url + '/v1')}", 'wire_api = "responses"', f'env_key = "{KEY_VAR}"',
              f"stream_idle_timeout_ms = {LONG_TIMEOUT_MS}"]
    return "\n".join(lines) + "\n"


def opencode_config(base_url: str, info: ServerInfo, key: str = PLACEHOLDER_KEY) -> dict[str, Any]:
    model: dict[str, Any] = {"name": info.model}
    if info.ctx:  # its answer may take half the slot (opencode would ask for 32,000 tokens, whatever the window)
        model["limit"] = {"context": info.ctx, "output": min(32000, info.ctx // 2)}
    return {"$schema": "https://opencode.ai/config.json",
            "provider": {"pflash": {"npm": "@ai-sdk/openai-compatible", "name": "pflash-proxy",
                                    "options": {"baseURL": base_url + "/v1", "apiKey": key,
                                                "timeout": LONG_TIMEOUT_MS},
                                    "models": {info.model: model}}},
            "model": f"pflash/{info.model}", "small_model": f"pflash/{info.model}", "autoupdate": False,
            "share": "disabled"}


def launch(name: str, binary: Path, base_url: str, info: ServerInfo, user_args: Sequence[str], tmp: Path,
           environ: Mapping[str, str], key: str | None = None) -> Launch:
    """The agent's argv, environment and configuration files (module docstring, step 3). ``key``: the one
    credential the agent sends (default: the placeholder); the user's own (``USER_CREDENTIALS``) are dropped."""
    key = key or PLACEHOLDER_KEY
    env = {k: v for k, v in environ.items() if k not in USER_CREDENTIALS}
    argv = [str(binary)]
    files: dict[str, str] = {}
    if name == "claude":
        # sent as Authorization: Bearer (nothing is tried before it) and x-api-key (which a key in the user's
        # settings, or their apiKeyHelper's output, would fill otherwise)
        claude_env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_AUTH_TOKEN": key, "ANTHROPIC_API_KEY": key}
        env.update(claude_env)
        # the same over the user's own settings, whose ``env`` Claude Code applies over its environment: settings
        # given with --settings come last
        path = tmp / "claude-settings.json"
        files[str(path)] = json.dumps({"env": {**{k: "" for k in CLAUDE_READS}, **claude_env}}, indent=1) + "\n"
        argv += ["--settings", str(path)]
        _quiet(env, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
               DISABLE_ERROR_REPORTING="1", DISABLE_BUG_COMMAND="1", API_TIMEOUT_MS=str(LONG_TIMEOUT_MS))
    elif name == "codex":
        home = tmp / "codex-home"
        env["CODEX_HOME"] = str(home)
        env[KEY_VAR] = key
        files[str(home / "config.toml")] = codex_config(base_url, info)
    elif name == "opencode":
        path = tmp / "opencode.json"
        env["OPENCODE_CONFIG"] = str(path)
        files[str(path)] = json.dumps(opencode_config(base_url, info, key), indent=1) + "\n"
        _quiet(env, OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
               OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1")
    elif name == "aider":
        argv += ["--openai-api-base", base_url + "/v1", "--openai-api-key", key,
                 "--model", f"openai/{info.model}", "--no-show-model-warnings", "--no-check-update",
                 "--no-analytics"]
        _quiet(env, LITELLM_LOCAL_MODEL_COST_MAP="True")  # litellm would fetch its price list from the internet
    else:
        raise WrapError(f"unknown agent {name!r} (one of {', '.join(AGENT_NAMES)})", 2)
    return Launch(argv + list(user_args), env, files)


# 4. running it ----------------------------------------------------------------------------------------------
def run_foreground(run: Launch) -> int:
    for path, text in run.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    try:
        proc = subprocess.Popen(run.argv, env=run.env)
    except OSError as exc:
        raise WrapError(f"cannot run {run.argv[0]}: {exc.strerror or exc}") from None

    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the agent
    try:
        rc = proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


class _Terminated(Exception):
    pass


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise _Terminated(signum)


def main(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    started: StartedProxy | None = None
    previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        binary = find_agent(args.agent, environ)
        url = (args.url or settings.proxy.local_url).rstrip("/")
        timeout_s = args.startup_timeout_s or settings.upstream.startup_timeout_s + 60
        state = probe(url)
        serving = None if args.url or state not in ("absent", "other") else serving_from(_home(settings))
        if serving and (found := probe(serving)) not in ("absent", "other"):
            url, state = serving, found  # the proxy already serving from this state directory
        if state in ("absent", "other"):
            if not (args.spawn or args.upstream):
                what = "nothing answers" if state == "absent" else "what answers is not a pflash-proxy"
                raise WrapError(f"no proxy at {url} ({what}): start one (`make run`, `pflash-proxy serve --spawn`) "
                                f"or give `wrap --spawn` / `wrap --upstream URL` to start one for this run")
            started = start_proxy(settings, args)
            url = started.url
            how = "--spawn" if args.spawn else f"--upstream {args.upstream}"
            print(f"pflash-proxy wrap: starting a proxy at {url} ({how}; log {started.log_path}), stopped when "
                  f"{args.agent} exits", file=sys.stderr, flush=True)
        if state != "ready":
            wait_ready(url, timeout_s, started)
        info = server_info(url)
        for s, h in previous.items():  # from here on the agent's own handling (run_foreground) applies
            signal.signal(s, h)
        with tempfile.TemporaryDirectory(prefix="pflash-wrap-") as tmp:
            return run_foreground(launch(args.agent, binary, url, info, args.args, Path(tmp), environ,
                                         settings.upstream.upstream_api_key))
    except WrapError as exc:
        print(f"pflash-proxy wrap: {exc}", file=sys.stderr)
        return exc.status
    except (_Terminated, KeyboardInterrupt) as exc:
        signum = exc.args[0] if isinstance(exc, _Terminated) else signal.SIGINT
        print(f"pflash-proxy wrap: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if started is not None:
            stop_proxy(started)
