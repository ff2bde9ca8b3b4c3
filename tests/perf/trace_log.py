"""What a session's trace write costs once the session has compressed documents: CPU and bytes per write.

1. Open an embedded index (``open_index``: SQLite) in a temporary directory and save one session.
2. Compress ``--documents`` synthetic source files of ``--doc-chars`` characters each (``Compressor`` with the
   lexical scorer, a question at each file's end) and add each outcome's compression trace, with a turn trace,
   in one trace write per document (``sessions.traces.record_compression``, ``append``,
   ``update_trace_log``): the log the inspector keeps for such a session.
3. Time ``--writes`` more trace writes that add one turn trace each (a follow-up question that compressed
   nothing): the loop thread's CPU per write (``time.thread_time``: this thread only), the stored log's size, and
   the bytes each write stores (the log, and any text or unit table it writes under a key of its own), read from
   the index's ``traces`` and ``trace_part`` tables on a connection of its own.
4. Print one markdown row and write the JSON to ``--out``.

    .venv/bin/python -m tests.perf.trace_log [--documents 16] [--doc-chars 66000] [--writes 20]

``test_perf.py`` runs it on three small documents in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.scores import LexicalScorer
from pflash_proxy.sessions.index import open_index
from pflash_proxy.sessions.traces import TurnTraces, append, record_compression

ROOT = Path(__file__).resolve().parents[2]


def document(i: int, chars: int) -> str:
    lines, n = [], 0
    while n < chars:
        line = f"def handler_{i}_{len(lines)}(request):\n    return render(request, 'page_{len(lines) % 97}.html')\n"
        lines.append(line)
        n += len(line)
    return "".join(lines)


def stored_bytes(db: sqlite3.Connection, sid: str) -> tuple[int, int]:
    """The bytes of the session's stored trace log, and of the log with its parts."""
    (log,) = db.execute("SELECT coalesce(sum(length(data)), 0) FROM traces WHERE sid = ?", (sid,)).fetchone()
    (parts,) = db.execute("SELECT coalesce(sum(length(data)), 0) FROM trace_part WHERE sid = ?", (sid,)).fetchone()
    return log, log + parts


def measure(documents: int, doc_chars: int, writes: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix="pflash-trace-bench-"))
    store = open_index(home)
    db = sqlite3.connect(home / "sessions" / "index.db")
    rec = store.new_session("seed", False)
    store.save_session(rec, ["h"], [{"role": "user", "content": "hello"}])
    compressor = Compressor(CompressionSettings(threshold=100), scorer=LexicalScorer())
    for i in range(documents):
        text = document(i, doc_chars)
        tt = TokenizedText.from_text(text)
        message = {"role": "user", "content": text + f"What does handler_{i}_3 render?"}
        request = RequestFinder().find([message], 0, tt)
        outcome = compressor.compress(tt, request, tt.total_tokens // 4, True, "paste", str(i))
        traces = TurnTraces(i + 1)
        record_compression(traces, 0, message, tt, request, outcome, tt.total_tokens, tt.total_tokens, "lexical",
                           "heuristic", tt.total_tokens // 4)
        traces.add({"v": 2, "kind": "turn", "turn": i + 1})
        store.update_trace_log(rec.id, lambda kept, t=traces: append(kept, t))
    cpu, written = [], []
    for n in range(writes):
        traces = TurnTraces(documents + n + 1)
        traces.add({"v": 2, "kind": "turn", "turn": documents + n + 1})
        before = stored_bytes(db, rec.id)[1]
        t0 = time.thread_time()
        store.update_trace_log(rec.id, lambda kept, t=traces: append(kept, t))
        cpu.append((time.thread_time() - t0) * 1000)
        log_bytes, total = stored_bytes(db, rec.id)
        written.append(log_bytes + max(0, total - before))
    log_bytes = stored_bytes(db, rec.id)[0]
    kept = store.trace_log(rec.id)
    texts = sum(1 for t in (kept.traces if kept else []) if isinstance(t.get("text"), str))
    db.close()
    store.close()
    shutil.rmtree(home)
    return {"documents": documents, "doc_chars": doc_chars, "writes": writes,
            "cpu_ms_per_write_p50": statistics.median(cpu), "cpu_ms_per_write_max": max(cpu),
            "log_bytes": log_bytes, "bytes_stored_per_write_p50": statistics.median(written),
            "texts_read_back": texts}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--documents", type=int, default=16)
    ap.add_argument("--doc-chars", type=int, default=66_000)
    ap.add_argument("--writes", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "trace_log.json")
    args = ap.parse_args(argv)
    out = measure(args.documents, args.doc_chars, args.writes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print("| documents × chars | CPU per write, p50 (max) | stored log | bytes stored per write | texts read back |")
    print("|---|---|---|---|---|")
    print(f"| {out['documents']} × {out['doc_chars']:,} | {out['cpu_ms_per_write_p50']:.2f} ms "
          f"({out['cpu_ms_per_write_max']:.2f}) | {out['log_bytes']:,} B | {round(out['bytes_stored_per_write_p50']):,} B | "
          f"{out['texts_read_back']} |")


if __name__ == "__main__":
    main()
