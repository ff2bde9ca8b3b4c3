"""Several pflash-proxy nodes sharing one Redis index and one snapshot directory, on loopback (issue 28).

``Cluster.start(model, workdir, n)``:
1. a ``redis-server`` of its own (``tests/redis_server.py``), unless a URL is given;
2. ``n`` llama-servers (gemma-3-270m, one thread each, 2 slots) whose ``--slot-save-path`` is one shared directory;
3. one ``pflash-proxy serve`` per llama-server with ``--index redis://…``, ``--node-id nodeI``, ``--advertise-url``,
   that directory as ``--slot-save-path``, ``--snapshot-every-turn``, a short ``--heartbeat-s`` and one
   ``PFLASH_CLUSTER_SECRET`` (signed heartbeats and forwards);
4. waits until every proxy answers ``/pflash/stats``. ``Node.kill()`` kills a node (proxy and llama-server,
   SIGKILL: no snapshot on the way out, no heartbeat removed); ``Cluster.stop()`` ends everything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from pflash_proxy.llama.spawn import free_port
from tests.conftest import LlamaServer, start_llama_server, wait_for_proxy, wait_until_served
from tests.redis_server import RedisServer

CLUSTER_SECRET = "tests-cluster-secret-" + "0" * 16  # every node signs its heartbeat and forwards with it


@dataclass
class Node:
    name: str
    addr: str  # 127.0.0.1:PORT, as a balancer names it
    proc: subprocess.Popen
    llama: LlamaServer
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def kill(self) -> None:
        for proc in (self.proc, self.llama.proc):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.llama.stop()

    async def stats(self, http: aiohttp.ClientSession) -> dict:
        async with http.get(self.url + "/pflash/stats") as r:
            assert r.status == 200, await r.text()
            return await r.json()


@dataclass
class Cluster:
    redis_url: str
    shared: Path
    nodes: list[Node] = field(default_factory=list)
    redis: RedisServer | None = None

    @classmethod
    async def start(cls, http: aiohttp.ClientSession, model: Path, workdir: Path, n: int, *,
                    redis_url: str | None = None, heartbeat_s: float = 0.5, parallel: int = 2,
                    ctx_per_slot: int = 1024, threads: int = 1, extra: list[str] | None = None) -> Cluster:
        redis = RedisServer.start(workdir / "redis") if redis_url is None else None
        shared = workdir / "shared-slots"
        shared.mkdir(parents=True, exist_ok=True)
        cluster = cls(redis_url or (redis.url if redis else ""), shared, redis=redis)
        try:
            for i in range(n):
                llama = start_llama_server(model, workdir / f"llama{i}", parallel=parallel, ctx_per_slot=ctx_per_slot,
                                           extra=["-t", str(threads)], slot_dir=shared)
                port, log = free_port(), workdir / f"proxy{i}.log"
                home = workdir / f"home{i}"
                with open(log, "wb") as out:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "pflash_proxy", "serve", "--upstream", llama.url, "--port", str(port),
                         "--home", str(home), "--slot-save-path", str(shared), "--index", cluster.redis_url,
                         "--node-id", f"node{i}", "--advertise-url", f"http://127.0.0.1:{port}",
                         "--snapshot-every-turn", "--heartbeat-s", str(heartbeat_s), *(extra or [])],
                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env={**os.environ, "PFLASH_HOME": str(home), "PFLASH_CLUSTER_SECRET": CLUSTER_SECRET})
                cluster.nodes.append(Node(f"node{i}", f"127.0.0.1:{port}", proc, llama, log))
            for node in cluster.nodes:
                await _wait_up(http, node)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.redis is not None:
            self.redis.stop()


async def _wait_up(http: aiohttp.ClientSession, node: Node) -> None:
    await wait_for_proxy(node.url, 120, node.proc, node.log)


async def wait_balancer(http: aiohttp.ClientSession, url: str, proc: subprocess.Popen, log: Path) -> None:
    """Until the balancer in front answers ``/health`` (a node's, through it)."""
    await wait_until_served(url + "/health", 30, proc, log, "the balancer")
