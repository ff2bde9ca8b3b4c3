"""Any node continues any session (issue 28, items 1-2), on loopback with real parts only.

Two nodes (a real llama-server with gemma-3-270m and a ``pflash-proxy serve`` in front of each), one real
``redis-server`` as their shared ``--index``, one shared ``--slot-save-path`` directory, ``--snapshot-every-turn``,
and the shipped nginx config in front (``tests/cluster/nodes.py``, ``balancers.py``):

1. Twelve sessions, four named by ``X-PFlash-Session``, four by Claude Code's ``X-Claude-Code-Session-Id``, four
   unnamed, take three turns through nginx. Every turn is answered; every follow-up is a cache ``hit`` or
   ``restored`` (six sessions share a node's two slots, so a session's slot may have been saved for another);
   each conversation keeps one session id, no two share one, and the served history the shared index holds for
   each is exactly what its client sent (no crossed answers). Each answer names its node.
2. The second turn of every unnamed session is sent straight to the node that does NOT hold it: it is forwarded
   to the holder (``X-PFlash-Via`` the receiving node, ``X-PFlash-Node`` the holder), a hit or restore there; the
   nodes' ``/pflash/stats`` count the forwards.
3. Once every session's last turn is snapshotted in the shared directory, node0 is killed (proxy and
   llama-server, SIGKILL). The next turn of every session through nginx is answered by node1 (after at most one
   retry by nginx); node0's sessions are taken over (``X-PFlash-Takeover: node0``) and restored from the shared
   directory, node1's own are hits or restores as before; node1's stats, ``/pflash/metrics`` and inspector
   count the takeovers and restores; the shared index (and the inspector's session list) names node1 as every
   session's holder.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from pflash_proxy.sessions.index.redis import RedisIndex
from tests.cluster.balancers import Balancer
from tests.cluster.balancers import binary as balancer_binary
from tests.cluster.nodes import Cluster, wait_balancer
from tests.redis_server import binary as redis_binary

pytestmark = [pytest.mark.llama,
              pytest.mark.skipif(redis_binary() is None or balancer_binary("nginx") is None,
                                 reason="redis-server or nginx not installed (scripts/setup.sh installs both)")]

GEN = {"max_tokens": 2, "temperature": 0}
FOLLOW_UP = ("hit", "restored")  # six sessions per node take turns on its two slots: a follow-up's may be saved


class Conv:
    def __init__(self, k: int, header: str | None):
        self.k = k
        self.headers = {header: f"conversation-{k}"} if header else {}
        self.messages: list[dict] = []
        self.sid: str | None = None
        self.turns: list[dict] = []

    def ask(self) -> list[dict]:
        n = len(self.messages) // 2
        self.messages.append({"role": "user", "content": f"Conversation {self.k}, question {n}: name a colour "
                                                         f"and the number {self.k * 10 + n}."})
        return self.messages


async def turn(http: aiohttp.ClientSession, url: str, conv: Conv) -> dict:
    async with http.post(url + "/v1/chat/completions", json={"messages": conv.ask(), **GEN},
                         headers=conv.headers) as r:
        body = await r.json(content_type=None)
        h = r.headers
        got = {"status": r.status, "session": h.get("X-PFlash-Session"), "cache": h.get("X-PFlash-Cache"),
               "node": h.get("X-PFlash-Node"), "via": h.get("X-PFlash-Via"), "takeover": h.get("X-PFlash-Takeover"),
               "tried": [a.strip() for a in h.get("X-Balancer-Upstream", "").split(",") if a.strip()]}
    assert r.status == 200, (got, body)
    conv.messages.append(body["choices"][0]["message"])
    conv.sid = conv.sid or got["session"]
    assert got["session"] == conv.sid, "a conversation changed session"
    conv.turns.append(got)
    return got


def check_histories(index: RedisIndex, convs: list[Conv]) -> None:
    assert len({c.sid for c in convs}) == len(convs), "two conversations share a session"
    for c in convs:
        rec = index.get(c.sid)
        sent = c.messages[:-1]  # the history of the last request (its answer is not served yet)
        assert rec is not None and [m["content"] for m in rec.served] == [m["content"] for m in sent], c.k


async def wait_snapshots(index: RedisIndex, convs: list[Conv], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        missing = [c.k for c in convs if (s := index.snapshot(c.sid)) is None
                   or len(s.served_hashes) != len(c.messages) - 1]
        if not missing:
            return
        assert time.monotonic() < deadline, f"no current snapshot of conversations {missing}"
        await asyncio.sleep(0.5)


async def test_any_node_continues_any_session(gemma_model, tmp_path):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        cluster = await Cluster.start(http, gemma_model, tmp_path, 2, heartbeat_s=0.5)
        balancer = None
        index = RedisIndex(cluster.redis_url)
        try:
            balancer = Balancer.start("nginx", [n.addr for n in cluster.nodes], tmp_path / "nginx")
            await wait_balancer(http, balancer.url, balancer.proc, balancer.log)
            convs = [Conv(k, ("X-PFlash-Session", "X-Claude-Code-Session-Id", None)[k // 4]) for k in range(12)]
            # 1. three turns through nginx (the second of an unnamed session goes to the other node: step 2)
            for c in convs:
                first = await turn(http, balancer.url, c)
                assert first["node"] in ("node0", "node1") and first["cache"] == "miss"
            for c in convs:
                if c.headers:
                    got = await turn(http, balancer.url, c)
                    assert got["cache"] in FOLLOW_UP and got["node"] == c.turns[0]["node"] and got["via"] is None
                else:  # 2. straight to the node that does not hold it: forwarded to the holder
                    holder = index.holder(c.sid)
                    assert holder == c.turns[0]["node"]
                    other = next(n for n in cluster.nodes if n.name != holder)
                    got = await turn(http, other.url, c)
                    assert (got["via"], got["node"]) == (other.name, holder) and got["cache"] in FOLLOW_UP, got
            for c in convs:
                got = await turn(http, balancer.url, c)
                assert got["cache"] in FOLLOW_UP and got["node"] == c.turns[0]["node"], got
            named = [c for c in convs if c.headers]
            assert {c.turns[0]["node"] for c in named} == {"node0", "node1"}, "named sessions all on one node"
            check_histories(index, convs)
            stats = {n.name: (await n.stats(http))["sessions"]["cluster"] for n in cluster.nodes}
            assert sum(s["forwarded_out"] for s in stats.values()) >= 4  # step 2, plus unnamed turns of step 1
            assert sum(s["forwarded_in"] for s in stats.values()) == sum(s["forwarded_out"] for s in stats.values())
            assert sum(s["takeovers"] for s in stats.values()) == 0 and stats["node0"]["nodes_alive"] == 2

            # 3. node0 dies once every last turn is on disk; every session continues on node1
            await wait_snapshots(index, convs)
            held = {c.k: index.holder(c.sid) for c in convs}
            moved = [c for c in convs if held[c.k] == "node0"]
            assert moved and len(moved) < len(convs)
            cluster.node("node0").kill()
            for c in convs:
                got = await turn(http, balancer.url, c)
                assert got["node"] == "node1" and got["via"] is None and len(got["tried"]) <= 2, got
                if held[c.k] == "node0":
                    assert (got["takeover"], got["cache"]) == ("node0", "restored"), got
                else:
                    assert got["takeover"] is None and got["cache"] in FOLLOW_UP, got
            check_histories(index, convs)
            assert all(index.holder(c.sid) == "node1" for c in convs)
            s1 = (await cluster.node("node1").stats(http))["sessions"]["cluster"]
            assert s1["takeovers"] == len(moved) and s1["takeover_restored"] == len(moved)
            async with http.get(cluster.node("node1").url + "/pflash/metrics") as r:
                metrics = await r.text()
            assert f"pflash_takeovers_total {float(len(moved))}" in metrics
            assert f'pflash_takeover_turns_total{{cache="restored"}} {float(len(moved))}' in metrics
            assert 'pflash_node_info{node="node1"} 1.0' in metrics
            async with http.get(cluster.node("node1").url + "/pflash/api/overview") as r:
                overview = await r.json()
            assert overview["node"]["node"] == "node1" and overview["node"]["takeovers"] == len(moved)
            assert overview["node"]["takeover_restored"] == len(moved)
            async with http.get(cluster.node("node1").url + "/pflash/api/sessions") as r:
                listed = (await r.json())["sessions"]
            assert {s["id"]: s["node"] for s in listed} == {c.sid: "node1" for c in convs}
        finally:
            index.close()
            if balancer is not None:
                balancer.stop()
            cluster.stop()
