"""``pflash-proxy wrap``: the configuration each agent gets, where its binary is found, the command line, and the
processes it starts and stops (a stand-in agent on PATH for the process checks; the real CLIs run in
tests/agents/test_agents_real.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from pflash_proxy.cli import build_parser
from pflash_proxy.cli.wrap import (PLACEHOLDER_KEY, USER_CREDENTIALS, ServerInfo, WrapError, codex_config,
                                   find_agent, launch, opencode_config, probe)
from pflash_proxy.llama.spawn import free_port

URL = "http://127.0.0.1:26111"
INFO = ServerInfo(model="gemma-3-270m-q4_k_m.gguf", ctx=16384)


def _launch(name: str, args=("-p", "say hi"), environ=None, info=INFO, tmp=Path("/tmp/x")):
    return launch(name, Path(f"/bin/{name}"), URL, info, list(args), tmp, environ if environ is not None else {})


def test_codex_gets_a_responses_provider_at_the_proxy_with_the_output_limit_raised():
    cfg = tomllib.loads(codex_config(URL, INFO))
    assert cfg["model_provider"] == "pflash" and cfg["model"] == INFO.model
    assert cfg["model_providers"]["pflash"]["base_url"] == URL + "/v1"
    assert cfg["model_providers"]["pflash"]["wire_api"] == "responses"
    assert cfg["tool_output_token_limit"] >= 100000  # Codex's own ~10K-character cut stays out of the way
    assert cfg["model_context_window"] == 16384
    run = _launch("codex", ["exec", "--skip-git-repo-check", "say hi"], tmp=Path("/t"))
    assert run.env["CODEX_HOME"] == "/t/codex-home" and "/t/codex-home/config.toml" in run.files
    assert run.argv == ["/bin/codex", "exec", "--skip-git-repo-check", "say hi"]


def test_opencode_gets_a_provider_file_with_the_slots_limits_over_its_own_config():
    run = _launch("opencode", ["run", "say hi"], environ={"OPENCODE_CONFIG": "/mine.json"}, tmp=Path("/t"))
    assert run.env["OPENCODE_CONFIG"] == "/t/opencode.json"
    cfg = json.loads(run.files["/t/opencode.json"])
    provider = cfg["provider"]["pflash"]
    assert provider["npm"] == "@ai-sdk/openai-compatible" and provider["options"]["baseURL"] == URL + "/v1"
    assert provider["models"][INFO.model]["limit"] == {"context": 16384, "output": 8192}
    assert cfg["model"] == f"pflash/{INFO.model}" and run.argv == ["/bin/opencode", "run", "say hi"]
    # a server whose context is unknown: no limit (opencode's own defaults apply)
    unknown = opencode_config(URL, ServerInfo(model="m"))
    assert "limit" not in unknown["provider"]["pflash"]["models"]["m"]


def test_claude_gets_the_base_url_a_placeholder_key_and_no_telemetry():
    run = _launch("claude")
    assert run.env["ANTHROPIC_BASE_URL"] == URL and run.env["ANTHROPIC_AUTH_TOKEN"] == PLACEHOLDER_KEY
    for key in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER"):
        assert run.env[key] == "1"
    assert run.argv == ["/bin/claude", "--settings", "/tmp/x/claude-settings.json", "-p", "say hi"]
    # the same over the user's own settings (their ``env`` would otherwise add their key), other ways emptied
    env = json.loads(run.files["/tmp/x/claude-settings.json"])["env"]
    assert env["ANTHROPIC_AUTH_TOKEN"] == PLACEHOLDER_KEY and env["ANTHROPIC_BASE_URL"] == URL
    assert env["ANTHROPIC_API_KEY"] == PLACEHOLDER_KEY and env["CLAUDE_CODE_OAUTH_TOKEN"] == ""
    # the user's own settings are kept, their key and token are not
    mine = _launch("claude", environ={"ANTHROPIC_AUTH_TOKEN": "t", "ANTHROPIC_API_KEY": "k", "DISABLE_TELEMETRY": "0"})
    assert mine.env["ANTHROPIC_AUTH_TOKEN"] == mine.env["ANTHROPIC_API_KEY"] == PLACEHOLDER_KEY
    assert mine.env["DISABLE_TELEMETRY"] == "0"


SECRET = "sk-users-own-secret-4f1c"
USERS_OWN = {name: f"{SECRET}-{name}" for name in USER_CREDENTIALS} | {"HOME": "/home/u", "PATH": "/usr/bin"}
USER_ARGS = {"claude": ["-p", "say hi"], "codex": ["exec", "say hi"], "opencode": ["run", "say hi"],
             "aider": ["--message", "say hi"]}


def _sent_key(name: str, run) -> str:
    """The one credential each agent sends with this launch (where each reads it from)."""
    if name == "claude":
        return run.env["ANTHROPIC_AUTH_TOKEN"]
    if name == "codex":
        provider = tomllib.loads(run.files[run.env["CODEX_HOME"] + "/config.toml"])["model_providers"]["pflash"]
        return run.env[provider["env_key"]]
    if name == "opencode":
        return json.loads(run.files[run.env["OPENCODE_CONFIG"]])["provider"]["pflash"]["options"]["apiKey"]
    return run.argv[run.argv.index("--openai-api-key") + 1]


@pytest.mark.parametrize("name", ["claude", "codex", "opencode", "aider"])
def test_no_agent_gets_the_users_own_keys_only_the_placeholder_or_the_upstream_key(name, tmp_path):
    """ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, OPENAI_API_KEY ... never reach the agent's environment, argv or
    files: it sends the placeholder, or the configured --upstream-api-key (llama-server's own key)."""
    for key, expected in ((None, PLACEHOLDER_KEY), ("llama-servers-key", "llama-servers-key")):
        run = launch(name, Path(f"/bin/{name}"), URL, INFO, USER_ARGS[name], tmp_path, USERS_OWN, key)
        everything = json.dumps([run.argv, run.env, run.files])
        assert SECRET not in everything, [k for k, v in run.env.items() if SECRET in v]
        assert _sent_key(name, run) == expected
        assert run.env["HOME"] == "/home/u" and run.env["PATH"] == "/usr/bin"  # the rest is the user's


def test_aider_gets_the_api_base_and_model_before_the_users_arguments():
    run = _launch("aider", ["--yes", "--no-git", "--message", "say hi"])
    argv = run.argv
    assert argv[argv.index("--openai-api-base") + 1] == URL + "/v1"
    assert argv[argv.index("--model") + 1] == f"openai/{INFO.model}"
    assert argv[argv.index("--openai-api-key") + 1] == PLACEHOLDER_KEY
    assert argv[-4:] == ["--yes", "--no-git", "--message", "say hi"]  # last: the user's flags win


def test_the_agent_is_found_on_path_then_in_the_setup_cache(tmp_path):
    cache = tmp_path / "cache"
    npm_bin = cache / "agents-abc" / "node_modules" / ".bin"
    npm_bin.mkdir(parents=True)
    (npm_bin / "codex").write_text("#!/bin/sh\n")
    env = {"PATH": str(tmp_path / "empty"), "PFLASH_AGENTS_CACHE": str(cache)}
    with pytest.raises(WrapError, match="codex not found on PATH nor in"):  # an install without its stamp
        find_agent("codex", env)
    (cache / "agents-abc" / ".installed").touch()
    assert find_agent("codex", env) == npm_bin / "codex"
    aider = cache / "aider-0.86.2-py311" / "bin" / "aider"
    aider.parent.mkdir(parents=True)
    aider.write_text("#!/bin/sh\n")
    (cache / "aider-0.86.2-py311" / ".installed").touch()
    assert find_agent("aider", env) == aider
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "codex").write_text("#!/bin/sh\n")
    (on_path / "codex").chmod(0o755)
    assert find_agent("codex", {**env, "PATH": str(on_path)}) == on_path / "codex"
    with pytest.raises(WrapError) as exc:
        find_agent("claude", env)
    assert "\n" not in str(exc.value) and "npm i -g @anthropic-ai/claude-code" in str(exc.value)


def test_everything_after_the_agent_goes_to_the_agent():
    args = build_parser().parse_args(["wrap", "--url", URL, "claude", "-p", "say hi", "--url", "x", "--", "y"])
    assert args.agent == "claude" and args.url == URL and args.args == ["-p", "say hi", "--url", "x", "--", "y"]
    assert not args.spawn and args.upstream is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["wrap", "--spawn", "--upstream", URL, "claude"])


def _cli(*args: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pflash_proxy", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _stand_in(tmp_path: Path, body: str) -> dict:
    """A PATH whose ``aider`` is a shell script (the process checks do not need a model to answer)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "aider").write_text("#!/bin/sh\n" + body)
    (bin_dir / "aider").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PFLASH_HOME": str(tmp_path / "home")}


def test_no_proxy_and_no_way_to_start_one_is_one_line(tmp_path):
    env = {**_stand_in(tmp_path, "exit 0\n"), "PFLASH_AGENTS_CACHE": str(tmp_path)}  # known: no warning line
    r = _cli("wrap", "--url", f"http://127.0.0.1:{free_port()}", "aider", "--message", "hi", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "no proxy at" in r.stderr and "--spawn" in r.stderr
    r = _cli("wrap", "--url", URL, "vim", env=env)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie of a parent that is itself gone counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.llama
def test_a_proxy_it_starts_serves_the_agent_and_is_stopped_with_its_exit_status(tmp_path, llama_server,
                                                                                gemma_model):
    port = free_port()
    out = tmp_path / "seen.json"
    env = _stand_in(tmp_path, f"""python3 - "$@" <<'EOF'
import json, os, sys, urllib.request
base = sys.argv[sys.argv.index("--openai-api-base") + 1]
with urllib.request.urlopen(base.removesuffix("/v1") + "/pflash/metrics") as r:
    metrics = r.status
json.dump({{"argv": sys.argv[1:], "metrics": metrics, "ppid": os.getppid()}}, open({str(out)!r}, "w"))
EOF
exit 7
""")
    env["PFLASH_PORT"] = str(port)
    r = _cli("wrap", "--upstream", llama_server.url, "aider", "--message", "say hi", env=env, timeout=180)
    assert r.returncode == 7, r.stderr  # the agent's own status
    seen = json.loads(out.read_text())
    assert seen["metrics"] == 200 and seen["argv"][-2:] == ["--message", "say hi"]
    assert seen["argv"][seen["argv"].index("--openai-api-base") + 1] == f"http://127.0.0.1:{port}/v1"
    assert seen["argv"][seen["argv"].index("--model") + 1] == f"openai/{gemma_model.name}"  # /v1/models' file name
    assert f"starting a proxy at http://127.0.0.1:{port}" in r.stderr
    assert probe(f"http://127.0.0.1:{port}") == "absent"  # stopped on the way out


AGENT_ASKS = """import json, sys, urllib.request
base = sys.argv[sys.argv.index("--openai-api-base") + 1]
body = {"messages": [{"role": "user", "content": "say hi"}], "max_tokens": 4}
req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(), method="POST",
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=300) as r:
    answer = json.load(r)
json.dump({"argv": sys.argv[1:], "status": r.status, "answer": answer}, open(sys.argv[1], "w"))
"""


def _cmdlines(needle: str) -> list[str]:
    """Command lines of the running processes that mention ``needle``."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = path.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if needle in line:
            found.append(line)
    return found


@pytest.mark.llama
@pytest.mark.timeout(600)
def test_wrap_spawn_starts_the_bundled_model_for_the_agent_and_stops_both(tmp_path, gemma_model):
    """``wrap --spawn``: a proxy on a spawned llama-server with the bundled model, as ``make run`` starts it; the
    agent's request is answered through it; neither outlives the agent."""
    port = free_port()
    out = tmp_path / "seen.json"
    (tmp_path / "agent.py").write_text(AGENT_ASKS)
    env = _stand_in(tmp_path, f'exec python3 {tmp_path / "agent.py"} {out} "$@"\n')
    env["PFLASH_PORT"] = str(port)
    r = _cli("wrap", "--spawn", "aider", "--message", "say hi", env=env, timeout=540)
    assert r.returncode == 0, r.stderr
    seen = json.loads(out.read_text())
    assert seen["status"] == 200 and seen["answer"]["choices"][0]["message"]["role"] == "assistant"
    assert seen["argv"][-2:] == ["--message", "say hi"]
    assert seen["argv"][seen["argv"].index("--model") + 1] == f"openai/{gemma_model.name}"  # the bundled model
    assert probe(f"http://127.0.0.1:{port}") == "absent"  # the proxy it started is stopped on the way out
    assert not [c for c in _cmdlines(str(tmp_path / "home")) if "llama-server" in c], "llama-server outlived wrap"


@pytest.mark.llama
def test_sigterm_reaches_the_agent_and_stops_the_proxy(tmp_path, llama_server):
    port = free_port()
    mark = tmp_path / "agent.pid"
    env = _stand_in(tmp_path, f"echo $$ > {mark}\ntrap 'echo got-term; exit 5' TERM\nwhile :; do sleep 0.1; done\n")
    env["PFLASH_PORT"] = str(port)
    proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "wrap", "--upstream", llama_server.url, "aider"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert mark.exists(), proc.communicate(timeout=5)
        agent_pid = int(mark.read_text())
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 5 and "got-term" in out, err  # the agent's answer to the signal is the status
    assert _gone(agent_pid) and probe(f"http://127.0.0.1:{port}") == "absent"


class Recorder:
    """What reaches the upstream: a hop in front of the real llama-server that records every request's method,
    path and headers and forwards it unchanged (a recorder, not a fake: llama-server answers)."""

    def __init__(self, target: str):
        self.target, self.seen, self.url = target, [], ""

    async def __aenter__(self) -> "Recorder":
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(auto_decompress=False)

        async def forward(request: web.Request) -> web.StreamResponse:
            self.seen.append((request.method, request.path, dict(request.headers)))
            hop = {"host", "content-length", "transfer-encoding", "connection"}
            headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
            async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                             data=await request.read() or None) as up:
                body = await up.read()
                return web.Response(status=up.status, body=body,
                                    headers={k: v for k, v in up.headers.items() if k.lower() not in hop})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()
        await self._session.close()


async def _wrap_async(*args: str, env: dict, timeout: float) -> tuple[int, str]:
    import asyncio

    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "pflash_proxy", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, err.decode()


@pytest.mark.llama
@pytest.mark.timeout(400)
async def test_the_users_own_keys_reach_neither_the_agent_nor_the_upstream(tmp_path, llama_server):
    """``wrap --upstream`` with the user's Anthropic and OpenAI keys in the shell: the agent's environment holds
    none of them, and what reaches the upstream carries the placeholder; with ``PFLASH_UPSTREAM_API_KEY`` set,
    that key (llama-server's own) is what the agent sends and the upstream receives."""
    out = tmp_path / "seen.json"
    (tmp_path / "agent.py").write_text(AGENT_SENDS)
    env = _stand_in(tmp_path, f'exec python3 {tmp_path / "agent.py"} {out} "$@"\n')
    env.update({name: f"{SECRET}-{name}" for name in USER_CREDENTIALS})
    for upstream_key, expected in ((None, PLACEHOLDER_KEY), ("llama-servers-own-key", "llama-servers-own-key")):
        run_env = {**env, "PFLASH_PORT": str(free_port())}
        if upstream_key:
            run_env["PFLASH_UPSTREAM_API_KEY"] = upstream_key
        async with Recorder(llama_server.url) as rec:
            rc, err = await _wrap_async("wrap", "--upstream", rec.url, "aider", "--message", "say hi", env=run_env,
                                        timeout=300)
        assert rc == 0, err
        seen = json.loads(out.read_text())
        assert seen["status"] == 200
        assert not [k for k, v in seen["env"].items() if SECRET in v], "the user's keys reached the agent"
        assert SECRET not in json.dumps(seen["argv"])
        assert not [(m, p) for m, p, h in rec.seen if SECRET in json.dumps(h)], "the user's keys reached upstream"
        chats = [h for m, p, h in rec.seen if p == "/v1/chat/completions"]
        assert chats and all(h.get("Authorization") == f"Bearer {expected}" for h in chats), chats


AGENT_SENDS = """import json, os, sys, urllib.request
base = sys.argv[sys.argv.index("--openai-api-base") + 1]
key = sys.argv[sys.argv.index("--openai-api-key") + 1]
body = {"messages": [{"role": "user", "content": "say hi"}], "max_tokens": 4}
req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(), method="POST",
                             headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
with urllib.request.urlopen(req, timeout=300) as r:
    status = r.status
json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "status": status}, open(sys.argv[1], "w"))
"""
