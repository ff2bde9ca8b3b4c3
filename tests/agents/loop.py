"""One agent run through the proxy (or straight to llama-server), and what to read off it afterwards.

1. ``Stack``: [``RecordingFront``] → [the proxy, in this event loop, on a loopback port] → [``ScriptedUpstream``]
   → the real llama-server.  Without a script the proxy talks to llama-server itself; without proxy settings
   the front talks to the scripted upstream or llama-server directly (the "direct" arm).
2. ``run_once`` prepares the client's config under a private HOME and runs it once in ``workdir``.
3. Reading the run: ``file_texts`` finds the file as it travels in each dialect (Anthropic ``tool_result``
   blocks, chat ``tool`` messages, Responses ``function_call_output`` items, aider's ``NAME`` + fence user
   message); ``gold_block`` finds the lines of one function as the client rendered them (its own line-number
   prefixes included), so the check "reached the model whole" compares the client's own bytes;
   ``system_and_tools_diff`` lists every way the system/developer prompt and the tool definitions that reached
   the model differ from what the client sent (only the volatile billing line may go).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.agents.clients import Agent, Result, run_agent
from tests.agents.scripted import FRONT_ID, RecordingFront, Received, Script, ScriptedUpstream, tool_results

VOLATILE_PREFIX = "x-anthropic-billing-header:"


@dataclass
class Stack:
    real_url: str
    script: Script | None = None
    proxy: dict[str, Any] | None = None  # Settings fields (without upstream/home); None: no proxy
    home: Path | None = None
    upstream: ScriptedUpstream | None = None
    front: RecordingFront | None = None
    app: web.Application | None = None
    _runner: web.AppRunner | None = None
    url: str = ""

    async def __aenter__(self) -> "Stack":
        target = self.real_url
        if self.script is not None:
            self.upstream = ScriptedUpstream(self.real_url, self.script)
            target = await self.upstream.start()
        if self.proxy is not None:
            from pflash_proxy.config import Settings
            from pflash_proxy.server.app import create_app

            assert self.home is not None
            self.app = create_app(Settings(upstream=target, home=self.home, **self.proxy))
            self._runner = web.AppRunner(self.app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            target = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self.front = RecordingFront(target)
        self.url = await self.front.start()
        return self

    async def __aexit__(self, *exc) -> None:
        if self.front is not None:
            await self.front.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.upstream is not None:
            await self.upstream.close()


async def run_once(agent: Agent, stack: Stack, home: Path, workdir: Path, prompt: str, filename: str,
                   timeout_s: float) -> Result:
    run = agent.prepare(home, workdir, stack.url, prompt, filename)
    return await run_agent(run, timeout_s)


# Reading a run -------------------------------------------------------------------------------------------------
def function_lines(path: Path, name: str) -> list[str]:
    """The source lines of the (first) function or class ``name``, its ``def`` line to its last line."""
    src = path.read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return src.splitlines()[node.lineno - 1:node.end_lineno]
    raise KeyError(name)


def _anthropic_tool_results(body: dict) -> list[str]:
    out = []
    for m in body.get("messages") or []:
        if isinstance(m.get("content"), list):
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    c = b.get("content")
                    if isinstance(c, list):
                        c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
                    out.append(c if isinstance(c, str) else "")
    return out


def file_texts(body: dict, filename: str) -> list[str]:
    """Every place the read file travels in a request body, in any dialect."""
    out = _anthropic_tool_results(body) + tool_results(body)
    for m in body.get("messages") or []:  # aider: "NAME\n```\n..." in a user message
        c = m.get("content")
        if m.get("role") == "user" and isinstance(c, str) and f"{filename}\n```" in c:
            out.append(c)
    return [t for t in out if t]


def gold_block(client_text: str, lines: list[str]) -> list[str] | None:
    """The client's own rendering of ``lines`` (a function) inside ``client_text``: the run of consecutive lines
    that end with those lines, in order (a line-number prefix before each is the client's). None if absent."""
    have = client_text.splitlines()
    first = lines[0]
    for i, line in enumerate(have):
        if line.endswith(first) and i + len(lines) <= len(have) and \
                all(have[i + j].endswith(lines[j]) for j in range(len(lines))):
            return have[i:i + len(lines)]
    return None


def whole_in(block: list[str], served_text: str) -> bool:
    return "\n".join(block) in served_text


def _client_system(body: dict, path: str) -> list[str]:
    if path == "/v1/messages":
        sys_ = body.get("system")
        blocks = [sys_] if isinstance(sys_, str) else [b.get("text", "") for b in sys_ or [] if isinstance(b, dict)]
        for m in body.get("messages") or []:
            if m.get("role") == "system":
                c = m.get("content")
                blocks.append(c if isinstance(c, str) else "".join(p.get("text", "") for p in c or []))
        kept = ["\n".join(ln for ln in b.split("\n") if not ln.startswith(VOLATILE_PREFIX)) for b in blocks]
        return [b for b in kept if b.strip()]
    return _upstream_system(body)  # chat and Responses reach the model in the shape the client sent


def _upstream_system(body: dict) -> list[str]:
    if "messages" in body:
        return [m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
                for m in body["messages"] if m.get("role") in ("system", "developer")]
    out = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    for it in body.get("input") or []:
        if isinstance(it, dict) and it.get("role") in ("system", "developer"):
            out.append(json.dumps(it.get("content"), ensure_ascii=False))
    return out


def _tools_as_sent(body: dict, path: str) -> list[str]:
    """Each tool's definition as llama-server reads it, serialised with its key order (byte comparison)."""
    out = []
    for t in body.get("tools") or []:
        if path == "/v1/messages":  # Anthropic → chat: the same name, description and schema, as the proxy sends
            out.append(json.dumps({"name": t.get("name"), "description": t.get("description"),
                                   "schema": t.get("input_schema")}, ensure_ascii=False))
        elif isinstance(t.get("function"), dict):
            f = t["function"]
            out.append(json.dumps({"name": f.get("name"), "description": f.get("description"),
                                   "schema": f.get("parameters")}, ensure_ascii=False))
        else:
            out.append(json.dumps(t, ensure_ascii=False))
    return out


def system_and_tools_diff(client_body: dict, client_path: str, upstream_body: dict) -> list[str]:
    """What differs between the system/developer prompt and tools the client sent and those that reached the
    model (empty: identical, the Anthropic billing line aside)."""
    problems = []
    sent = _client_system(client_body, client_path)
    got = _upstream_system(upstream_body)
    got_all = "\n".join(got)
    for i, s in enumerate(sent):
        if s not in got_all:
            problems.append(f"system/developer part {i} ({len(s)} chars) not byte-identical upstream "
                            f"(upstream system/developer texts: {[len(g) for g in got]} chars)")
    rest = got_all
    for s in sent:
        rest = rest.replace(s, "", 1)
    if rest.strip():
        problems.append(f"upstream system/developer text has {len(rest.strip())} chars the client did not send: "
                        f"{rest.strip()[:300]!r}")
    t_sent = _tools_as_sent(client_body, client_path)
    t_got = _tools_as_sent(upstream_body, "upstream")
    if t_sent != t_got:
        first = next((i for i, (a, b) in enumerate(zip(t_sent, t_got)) if a != b), min(len(t_sent), len(t_got)))
        problems.append(f"tools differ: client sent {len(t_sent)} ({sum(map(len, t_sent))} chars), upstream got "
                        f"{len(t_got)} ({sum(map(len, t_got))} chars); first difference at tool {first}")
    return problems


@dataclass
class Turns:
    """The agent loop as seen on both sides: turn 1 (answered with the read) and turn 2 (holding the file)."""

    pairs: list[tuple[Any, Received]] = field(default_factory=list)
    turn1: int | None = None
    turn2: int | None = None


def pair_turns(stack: Stack, filename: str) -> Turns:
    """Pairs what reached the model (scripted upstream) with the client's request it came from (the front's id
    header), and finds turn 1 (the last request answered before the file arrived) and turn 2 (the first that
    holds it)."""
    assert stack.front is not None and stack.upstream is not None
    pairs = []
    for r in stack.upstream.received:
        i = next((v for k, v in r.headers.items() if k.lower() == FRONT_ID.lower()), None)
        if i is not None:
            pairs.append((stack.front.exchanges[int(i)], r))
    t = Turns(pairs)
    for i, (_, r) in enumerate(t.pairs):
        if file_texts(r.body, filename):
            t.turn2 = i
            break
    if t.turn2 is not None:
        before = range(t.turn2 - 1, -1, -1)
        t.turn1 = next((i for i in before if t.pairs[i][1].reply.tool), None)  # the read tool call
        if t.turn1 is None:  # aider: the answer that named the file
            t.turn1 = next((i for i in before if filename in (t.pairs[i][1].reply.text or "")), None)
    return t
