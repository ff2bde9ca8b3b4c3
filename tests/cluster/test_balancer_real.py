"""The shipped nginx and HAProxy configs in front of two real pflash-proxy nodes (issue 28, item 3), on loopback.

Two llama-servers (gemma-3-270m), one ``pflash-proxy serve --upstream`` process in front of each, and the balancer
started from ``configs/`` rendered for those two ports (tests/cluster/balancers.py). Per balancer:

1. Affinity: for each of the four headers agents send (X-PFlash-Session, Claude Code's X-Claude-Code-Session-Id,
   Codex's session-id, opencode's x-session-affinity) two session names are picked, one that the balancer sends to
   each node (asked with GET /health; a bounded number of names must reach both nodes); each session takes two
   turns, every turn lands on the node its name was sent to (the balancer's X-Balancer-Upstream) and the second
   turn is a cache hit there. Each proxy's own /pflash/stats counts exactly the turns the balancer says
   it sent there.
2. Precedence: a turn that carries several of the headers goes where the highest-ranked one alone goes.
3. No header: requests are served, by both nodes (least-connections; sequential requests alternate). A streamed
   answer arrives as whole server-sent events, [DONE] last.
4. ``/pflash/*`` is refused by the balancer (each node's inspector is reached on the node).
5. One proxy is killed (SIGKILL) while it runs a turn, before any byte of its answer: the balancer sends that POST
   again, once, to the survivor, and the client gets its answer (nginx: a 40 KB body; HAProxy: a small one). Then
   the next turn of every session succeeds, on the survivor, after at most one retry; the survivor's sessions
   never touch the dead node.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from pflash_proxy.llama.spawn import free_port
from tests.cluster.balancers import Balancer, binary
from tests.cluster.nodes import wait_balancer
from tests.conftest import start_llama_server, wait_for_proxy

pytestmark = pytest.mark.llama

HEADERS = ("X-PFlash-Session", "X-Claude-Code-Session-Id", "session-id", "x-session-affinity")  # precedence order
GEN = {"max_tokens": 2, "temperature": 0}
KINDS = [pytest.param(kind, marks=pytest.mark.skipif(
    binary(kind) is None, reason=f"{kind} not installed (scripts/setup.sh installs Debian's {kind} as root)"))
    for kind in ("nginx", "haproxy")]


@pytest.fixture(scope="module")
def llama_pair(gemma_model, tmp_path_factory):
    servers = []
    try:
        for i in range(2):
            servers.append(start_llama_server(gemma_model, tmp_path_factory.mktemp(f"llama{i}"), parallel=2,
                                              ctx_per_slot=1024, extra=["-t", "1"]))
        yield servers
    finally:
        for server in servers:
            server.stop()


@dataclass
class Node:
    addr: str  # 127.0.0.1:PORT, as the balancer names it
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def start_nodes(http: aiohttp.ClientSession, llamas, tmp_path: Path) -> list[Node]:
    nodes = []
    for i, llama in enumerate(llamas):
        port, log = free_port(), tmp_path / f"proxy{i}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pflash_proxy", "serve", "--upstream", llama.url,
                                     "--port", str(port), "--home", str(tmp_path / f"home{i}"),
                                     "--slot-save-path", str(llama.slot_dir)],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "PFLASH_HOME": str(tmp_path / f"home{i}")})
        nodes.append(Node(f"127.0.0.1:{port}", proc, log))
    for node in nodes:
        await wait_for_proxy(node.url, 120, node.proc, node.log)
    return nodes


@dataclass
class Turn:
    status: int
    node: str  # the node that answered
    tried: list[str]  # nginx: every node tried, in order; HAProxy: the answering one
    retries: int
    cache: str | None
    message: dict | None
    error: str | None = None  # the start of the body when the status is not 200


async def chat(http: aiohttp.ClientSession, balancer: Balancer, messages: list[dict], headers: dict,
               **gen) -> Turn:
    async with http.post(balancer.url + "/v1/chat/completions", json={"messages": messages, **GEN, **gen},
                         headers=headers) as r:
        body = await r.read()
        tried = [a.strip() for a in r.headers.get("X-Balancer-Upstream", "").split(",") if a.strip()]
        if balancer.kind == "nginx":
            retries = len(tried) - 1
        else:
            retries = int(r.headers["X-Balancer-Retries"].lstrip("+"))
        message = json.loads(body)["choices"][0]["message"] if r.status == 200 else None
        return Turn(r.status, tried[-1] if tried else "", tried, retries, r.headers.get("X-PFlash-Cache"), message,
                    None if r.status == 200 else body[:300].decode(errors="replace"))


async def wait_served(http: aiohttp.ClientSession, balancer: Balancer) -> None:
    await wait_balancer(http, balancer.url, balancer.proc, balancer.log)


async def turns_counted(http: aiohttp.ClientSession, node: Node) -> int:
    async with http.get(node.url + "/pflash/stats") as r:
        s = (await r.json())["sessions"]
    return s["hits"] + s["restored"] + s["misses"]


async def names_on_each_node(http: aiohttp.ClientSession, balancer: Balancer, header: str, addrs: set[str],
                             tries: int = 32) -> dict[str, str]:
    """One session name per node for ``header``, with its node: names ``{kind}-{header}-{i}`` asked with GET
    /health (answered at once, no generation) until each node has one. The hash ring of nginx follows the nodes'
    addresses, so which name lands where changes with the free ports a run gets; asking makes every run test both
    nodes."""
    found: dict[str, str] = {}
    for i in range(tries):
        name = f"{balancer.kind}-{header}-{i}"
        async with http.get(balancer.url + "/health", headers={header: name}) as r:
            assert r.status == 200, await r.text()
            node = r.headers["X-Balancer-Upstream"]
        assert node in addrs, node
        found.setdefault(node, name)
        if len(found) == len(addrs):
            return {name: node for node, name in found.items()}
    raise AssertionError(f"{tries} {header} names all hash to {set(found)}: the sessions do not spread")


async def wait_busy(http: aiohttp.ClientSession, node: Node, running: asyncio.Task) -> None:
    """Until ``node``'s proxy has a slot leased to a running request (the one the balancer sent it)."""
    deadline = time.monotonic() + 60
    while True:
        assert not running.done(), f"the turn ended before the node was seen busy: {running.result()}"
        async with http.get(node.url + "/pflash/stats") as r:
            if any(slot["busy"] for slot in (await r.json())["sessions"]["table"]):
                return
        assert time.monotonic() < deadline, "the node never ran the turn"
        await asyncio.sleep(0.02)


def follow_up(messages: list[dict], turn: Turn, text: str) -> list[dict]:
    return messages + [{"role": "assistant", "content": turn.message.get("content") or ""},
                       {"role": "user", "content": text}]


@pytest.mark.parametrize("kind", KINDS)
async def test_sessions_stick_spread_and_survive_a_dead_node(kind, llama_pair, tmp_path):
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=180)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        nodes = await start_nodes(http, llama_pair, tmp_path)
        balancer = None
        try:
            balancer = Balancer.start(kind, [n.addr for n in nodes], tmp_path / kind)
            await wait_served(http, balancer)
            addrs = {n.addr for n in nodes}

            # 4. the inspector and stats are not reachable through the balancer
            async with http.get(balancer.url + "/pflash/stats") as r:
                assert r.status == 403

            # 1. affinity: two turns per session, both on one node, the second a cache hit there
            where: dict[str, str] = {}
            header_of: dict[str, str] = {}
            history: dict[str, list[dict]] = {}
            sent = dict.fromkeys(addrs, 0)
            for header in HEADERS:
                for name, probed in (await names_on_each_node(http, balancer, header, addrs)).items():
                    header_of[name], where[name] = header, probed
                    messages = [{"role": "user", "content": f"Conversation {name}. Name one colour."}]
                    for turn_no in range(2):
                        t = await chat(http, balancer, messages, {header: name})
                        assert t.status == 200 and t.retries == 0, (name, t)
                        assert t.node in addrs, t
                        sent[t.node] += 1
                        assert t.node == where[name], f"{name} moved: {where[name]} -> {t.node}"
                        if turn_no == 1:
                            assert t.cache in ("hit", "restored"), (name, t)
                        messages = follow_up(messages, t, "And one more?")
                    history[name] = messages
            assert set(where.values()) == addrs, f"all sessions on one node: {where}"
            for node in nodes:  # the proxies' own count agrees with what the balancer says it sent
                assert await turns_counted(http, node) == sent[node.addr], (node.addr, sent)

            # 2. precedence: with several headers, the highest-ranked one decides
            overrides = 0
            for rank, header in enumerate(HEADERS[:-1]):
                name = next(n for n in where if header_of[n] == header)
                headers = {header: name}
                for lower in HEADERS[rank + 1:]:
                    other = next((n for n in where if header_of[n] == lower and where[n] != where[name]), None)
                    if other is not None:
                        headers[lower] = other
                        overrides += 1
                t = await chat(http, balancer, history[name], headers)
                assert t.status == 200 and t.node == where[name], (headers, t, where)
                history[name] = follow_up(history[name], t, "Once more?")
            assert overrides == 6, where  # every lower-ranked header named a session on the other node

            # 3. no session header: served, least-connections alternates over both nodes
            plain = [await chat(http, balancer, [{"role": "user", "content": f"{kind} plain question {i}."}], {})
                     for i in range(4)]
            assert all(t.status == 200 for t in plain), plain
            assert {t.node for t in plain} == addrs, plain
            # 3b. a streamed answer comes through as server-sent events, whole
            async with http.post(balancer.url + "/v1/chat/completions",
                                 json={"messages": [{"role": "user", "content": f"{kind} stream."}], "stream": True,
                                       "max_tokens": 8, "ignore_eos": True, "temperature": 0},
                                 headers={HEADERS[0]: f"{kind}-stream"}) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.headers
                events = [ln for ln in (await r.text()).splitlines() if ln.startswith("data: ")]
            assert events[-1] == "data: [DONE]" and len(events) >= 9, events
            before_kill = time.monotonic() - started

            # 5. kill one node's proxy while it runs a turn (before any response byte): the balancer sends the
            #    request again, to the survivor; then every session's next turn succeeds there
            victim, survivor = nodes
            name = next(n for n in where if where[n] == victim.addr)
            # nginx resends a body of any size (kept in memory or a temp file): this one is 40 KB, with a field
            # llama-server ignores. HAProxy resends only a body within its buffer (tune.bufsize, 16 KiB): a larger
            # one cut this way closes the client's connection (configs/README.md), so its body here is small.
            pad = {"x_pad": "x" * 40_000} if kind == "nginx" else {}
            running = asyncio.create_task(chat(http, balancer, history[name], {header_of[name]: name},
                                               max_tokens=128, ignore_eos=True, **pad))
            await wait_busy(http, victim, running)
            victim.proc.kill()
            victim.proc.wait()
            kill_at = time.monotonic()
            t = await running
            assert t.status == 200 and t.node == survivor.addr and t.retries == 1, t
            if kind == "nginx":
                assert t.tried == [victim.addr, survivor.addr], t
            retried_mid_turn = time.monotonic() - kill_at
            history[name] = follow_up(history[name], t, "Go on.")
            outcome = {}
            for name, node in sorted(where.items(), key=lambda kv: kv[1] != victim.addr):  # the dead node's first
                t = await chat(http, balancer, history[name], {header_of[name]: name})
                assert t.status == 200 and t.node == survivor.addr, (name, t)
                assert t.retries <= 1, (name, t)
                if node == survivor.addr:
                    assert t.retries == 0 and victim.addr not in t.tried, (name, t)
                outcome[name] = (node == victim.addr, t.retries, t.cache)
            after = [await chat(http, balancer, [{"role": "user", "content": f"{kind} after {i}."}], {})
                     for i in range(2)]
            assert all(t.status == 200 and t.node == survivor.addr for t in after), after
            moved = [v for v in outcome.values() if v[0]]
            print(f"\n{kind}: {len(where)} sessions ({sum(1 for n in where.values() if n == victim.addr)} on the "
                  f"killed node), start + affinity + precedence + plain {before_kill:.1f} s, the cut turn retried in "
                  f"{retried_mid_turn:.1f} s, after the kill "
                  f"{time.monotonic() - kill_at:.1f} s; moved sessions: retries {[v[1] for v in moved]}, "
                  f"cache on the survivor {[v[2] for v in moved]}")
        finally:
            if balancer is not None:
                balancer.stop()
            for node in nodes:
                node.stop()
