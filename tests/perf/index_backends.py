"""The embedded session index (``sqlite.SqliteIndex``) on the calls a turn makes, and on opening, crashing and
pruning. ``BACKENDS`` names each index it runs, side by side, in a fresh directory of its own (the backends
alternate in every step, so all see the same machine load); the diskcache backend it was compared with is gone.

1. ``save``/``lookup``: ``--sessions`` conversations advance ``--turns`` turns each, round-robin (a turn: the
   request's ``lookup`` of its history plus a new user message, then ``save_session`` of the history plus that
   message and the answer, ``--message-chars`` characters each); every ``--recall-every``-th turn pastes a
   document whose recall source (the compressor's, lexical scorer, ``--doc-lines`` lines) the save stores;
   ``trace``: the turn's ``update_trace_log`` (a turn trace, and a compression trace with the document's text
   on a paste turn); ``response``: ``put_response`` then ``response``;
2. ``cold lookup``: a new index object on the same directory (a restart: nothing cached) looks every session up;
3. ``open``: opening an index of that many sessions, and its first snapshot listing;
4. ``crash``: a child process saves sessions and is killed (SIGKILL) mid-stream; the time to open its index
   again, and a check that every save it reported committed is read back;
5. ``prune``: forgetting half the sessions.

It prints one table, each call's ops/s, p50 and p99 (ms, wall clock) and its p50 CPU time (ms, the calling
thread's: what other processes on the machine do not change) per backend, and returns the numbers (``--out`` writes
them as JSON). Run it niced: ``nice -n 10 .venv/bin/python -m tests.perf.index_backends --sessions 200 --turns 20``.
``test_perf.py`` runs it on a tiny workload in ``make test`` (``PFLASH_INDEX_BENCH=full``: the default sizes).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pflash_proxy.sessions.identity import message_hash
from pflash_proxy.sessions.index import SessionIndex, SnapshotRecord
from pflash_proxy.sessions.index.sqlite import SqliteIndex

T = TypeVar("T")
BACKENDS: dict[str, Callable[[Path], SessionIndex]] = {"sqlite": SqliteIndex}
ROOT = Path(__file__).resolve().parents[2]


def _recall_source(lines: int):  # type: ignore[no-untyped-def]
    from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText
    from pflash_proxy.compress.scores import LexicalScorer
    from tests.perf.session_turns import document

    text = document(0, lines)
    tt = TokenizedText.from_text(text)
    request = RequestFinder().find([{"role": "user", "content": text + "Which dock got 700 crates?"}], 0, tt)
    out = Compressor(CompressionSettings(threshold=100), scorer=LexicalScorer()).compress(
        tt, request, tt.total_tokens + 50, True, "paste", "0")
    assert out.recall is not None
    return out.recall, text


def _message(role: str, s: int, turn: int, chars: int) -> dict[str, object]:
    body = f"session {s} turn {turn} {role}: " + "lorem ipsum dolor sit amet " * (chars // 27 + 1)
    return {"role": role, "content": body[:chars]}


class Timings:
    """Per call name and backend, the seconds each call took."""

    def __init__(self) -> None:
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.cpu: dict[str, dict[str, list[float]]] = {}

    def time(self, name: str, backend: str, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``, timed."""
        t0, c0 = time.perf_counter(), time.thread_time()
        out = fn(*args)
        c1, t1 = time.thread_time(), time.perf_counter()
        self.samples.setdefault(name, {}).setdefault(backend, []).append(t1 - t0)
        self.cpu.setdefault(name, {}).setdefault(backend, []).append(c1 - c0)
        return out

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        out: dict[str, dict[str, dict[str, float]]] = {}
        for name, by_backend in self.samples.items():
            for backend, xs in by_backend.items():
                xs = sorted(xs)
                out.setdefault(name, {})[backend] = {
                    "n": len(xs), "ops_s": len(xs) / sum(xs) if sum(xs) else float("inf"),
                    "p50_ms": 1e3 * statistics.median(xs),
                    "p99_ms": 1e3 * xs[min(len(xs) - 1, int(0.99 * len(xs)))],
                    "cpu_p50_ms": 1e3 * statistics.median(self.cpu[name][backend])}
        return out


def _turns(indexes: dict[str, SessionIndex], timings: Timings, args: argparse.Namespace) -> dict[str, list[str]]:
    """Step 1; returns each backend's session ids, in session order."""
    from pflash_proxy.sessions.traces import TurnTraces, append

    source, doc = _recall_source(args.doc_lines)
    histories: list[list[dict[str, object]]] = [[] for _ in range(args.sessions)]
    ids: dict[str, list[str]] = {b: [""] * args.sessions for b in indexes}
    for turn in range(args.turns):
        for s in range(args.sessions):
            paste = args.recall_every and turn % args.recall_every == 0
            request = histories[s] + [_message("user", s, turn, args.message_chars)]
            answer = _message("assistant", s, turn, args.message_chars)
            answer_hash = message_hash(answer)
            for backend, index in indexes.items():
                body = json.loads(json.dumps(request))  # parsed anew, as a request's body is
                rec, matched, hashes = timings.time("lookup", backend, index.lookup, f"seed{s}", body)
                assert (rec is None) == (turn == 0) and matched == len(histories[s]), (backend, s, turn, matched)
                if rec is None:
                    rec = index.new_session(f"seed{s}", False)
                if paste:
                    rec.recall_sources = [*rec.recall_sources, source]
                served = body + [answer]
                timings.time("save", backend, index.save_session, rec, hashes + [answer_hash], served)
                ids[backend][s] = rec.id
                traces = TurnTraces(turn)
                if paste:
                    traces.add({"v": 2, "kind": "compression", "turn": turn, "message": 0, "text": doc,
                                "units": {"start": list(range(50)), "score": [0.5] * 50}}, {"compressed": 1})
                traces.add({"v": 2, "kind": "turn", "turn": turn})
                timings.time("trace", backend, index.update_trace_log, rec.id, functools.partial(append, turn=traces))
                timings.time("response", backend, _response, index, f"resp_{s}_{turn}", rec.id, answer)
            histories[s] = request + [answer]  # what the proxy served: the next turn's request begins with it
    return ids


def _response(index: SessionIndex, rid: str, sid: str, answer: dict[str, object]) -> object:
    return index.put_response(rid, {"session": sid, "items": [answer]}), index.response(rid)


def _listing(index: SessionIndex) -> object:
    return index.snapshots(), index.count_sessions()


def _cold_lookups(dirs: dict[str, Path], ids: dict[str, list[str]], timings: Timings, args: argparse.Namespace) -> None:
    fresh = {b: BACKENDS[b](d) for b, d in dirs.items()}
    try:
        for s in range(args.sessions):
            for backend, index in fresh.items():
                rec = timings.time("cold get", backend, index.get, ids[backend][s])
                assert rec is not None and rec.turns == args.turns, backend
    finally:
        for index in fresh.values():
            index.close()


def _opens(dirs: dict[str, Path], timings: Timings, rounds: int) -> None:
    for _ in range(rounds):
        for backend, d in dirs.items():
            index = timings.time("open", backend, BACKENDS[backend], d)
            timings.time("open+list", backend, _listing, index)
            index.close()


_CHILD = """
import sys, os
sys.path.insert(0, {root!r})
from pathlib import Path
from typing import TypeVar
from tests.perf.index_backends import BACKENDS, _message
index = BACKENDS[{backend!r}](Path({directory!r}))
for s in range(10**9):
    rec = index.new_session("crash", False)
    msgs = [_message("user", s, 0, 2000), _message("assistant", s, 0, 2000)]
    index.save_session(rec, [f"h{{s}}a", f"h{{s}}b"], msgs)
    print(rec.id, flush=True)
"""


def _crash(work: Path, timings: Timings, rounds: int, saves: int) -> dict[str, int]:
    """Step 4: per backend, the saves a killed child reported committed, all read back (asserted)."""
    checked: dict[str, int] = {}
    for r in range(rounds):
        for backend in BACKENDS:
            d = work / f"crash-{backend}-{r}"
            proc = subprocess.Popen([sys.executable, "-c", _CHILD.format(root=str(ROOT), backend=backend,
                                                                         directory=str(d))],
                                    stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            committed = [proc.stdout.readline().strip() for _ in range(saves)]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            index = timings.time("reopen after kill", backend, BACKENDS[backend], d)
            try:
                missing = [sid for sid in committed if index.get(sid) is None]
                assert not missing, f"{backend}: {len(missing)} committed sessions lost after SIGKILL"
                checked[backend] = checked.get(backend, 0) + len(committed)
            finally:
                index.close()
    return checked


def _prunes(dirs: dict[str, Path], timings: Timings, sessions: int) -> None:
    for backend, d in dirs.items():
        index = BACKENDS[backend](d)
        try:
            for i in range(3):
                index.put_snapshot(SnapshotRecord(f"snap{i}", f"f{i}", 10, [], "m", 100))
            gone = timings.time("prune half", backend, functools.partial(index.prune, older_than=None,
                                                                          max_sessions=sessions // 2))
            assert isinstance(gone, list) and len(gone) == sessions - sessions // 2, (backend, len(gone))
        finally:
            index.close()


def _table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    names = list(BACKENDS)
    head = f"{'call':<18}{'n':>6}" + "".join(f"{b + ' ops/s':>16}{'p50 ms':>9}{'p99 ms':>9}{'cpu p50':>9}"
                                             for b in names)
    lines = [head, "-" * len(head)]
    for call, by_backend in summary.items():
        n = next(iter(by_backend.values()))["n"]
        cells = "".join(f"{r['ops_s']:>16.0f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['cpu_p50_ms']:>9.3f}"
                        for r in (by_backend[b] for b in names))
        lines.append(f"{call:<18}{n:>6}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--message-chars", type=int, default=600)
    ap.add_argument("--recall-every", type=int, default=5, help="every n-th turn pastes a document (0: never)")
    ap.add_argument("--doc-lines", type=int, default=1500)
    ap.add_argument("--opens", type=int, default=10)
    ap.add_argument("--crashes", type=int, default=3)
    ap.add_argument("--crash-saves", type=int, default=200)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    timings = Timings()
    with tempfile.TemporaryDirectory(prefix="index-bench-") as tmp:
        work = Path(tmp)
        dirs = {b: work / b for b in BACKENDS}
        indexes = {b: BACKENDS[b](d) for b, d in dirs.items()}
        try:
            ids = _turns(indexes, timings, args)
        finally:
            for index in indexes.values():
                index.close()
        _cold_lookups(dirs, ids, timings, args)
        _opens(dirs, timings, args.opens)
        volumes = {}
        for b, d in dirs.items():
            index = BACKENDS[b](d)
            volumes[b] = index.volume()
            index.close()
        checked = _crash(work, timings, args.crashes, args.crash_saves)
        _prunes(dirs, timings, args.sessions)
    summary = timings.summary()
    report: dict[str, object] = {"args": {k: str(v) for k, v in vars(args).items()}, "calls": summary,
                                 "volume_bytes": volumes, "crash_saves_read_back": checked}
    print(_table(summary))
    print(f"volume after the turns (bytes): {volumes}; saves read back after SIGKILL: {checked}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
