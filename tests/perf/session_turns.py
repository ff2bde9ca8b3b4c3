"""What a session's index costs per turn as its compressed messages add up: lookup + commit on the embedded index.

1. Compress a synthetic document of ``--doc-lines`` lines (lexical scorer, the product's pipeline) ``--sources``
   times, as a session whose turns each pasted one such document: every compression leaves a recall source.
2. Store the session (its served history of ``--messages`` messages of ``--message-chars`` characters, and those
   sources) in a fresh embedded index (``open_index``: SQLite), then run ``--turns`` turns of what every request does: ``lookup`` of its history plus one
   new message (parsed anew from JSON each turn, as a request's body is), ``save_session`` of it.
3. Print the median milliseconds of a turn's lookup and save, the bytes of the session's record (``codec.encode``)
   and of the whole index (``volume``), as JSON.

    .venv/bin/python -m tests.perf.session_turns [--sources 3] [--turns 20]

``test_perf.py`` runs it on a tiny session in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from pflash_proxy.compress import CompressionSettings, Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.scores import LexicalScorer
from pflash_proxy.sessions.index import open_index
from pflash_proxy.sessions.index.codec import encode


def document(i: int, lines: int) -> str:
    return "\n".join(f"Entry {n} of ledger {i}: {n * 7} crates of {('tea', 'wool', 'salt', 'tin')[n % 4]} "
                     f"left dock {n % 13} for the {('north', 'east', 'south')[n % 3]} line on day {n % 31}."
                     for n in range(lines)) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", type=int, default=3)
    ap.add_argument("--doc-lines", type=int, default=1500)
    ap.add_argument("--messages", type=int, default=40)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--message-chars", type=int, default=300, help="characters of each history message")
    args = ap.parse_args(argv)
    comp = Compressor(CompressionSettings(threshold=100), scorer=LexicalScorer())
    sources = []
    for i in range(args.sources):
        text = document(i, args.doc_lines)
        tt = TokenizedText.from_text(text)
        request = RequestFinder().find([{"role": "user", "content": text + "Which dock got 700 crates?"}], 0, tt)
        out = comp.compress(tt, request, tt.total_tokens + 50, True, "paste", str(i))
        assert out.recall is not None
        sources.append(out.recall)
    history = [{"role": "user" if n % 2 == 0 else "assistant",
                "content": (f"message {n}: " + "tool output line " * (args.message_chars // 17 + 1))[:args.message_chars]}
               for n in range(args.messages)]
    lookups, saves = [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = open_index(Path(tmp))
        rec = store.new_session("seed", False)
        rec.recall_sources = list(sources)
        store.save_session(rec, store.lookup("seed", history)[2], history)
        for t in range(args.turns):
            history = [*history, {"role": "user" if len(history) % 2 == 0 else "assistant", "content": f"turn {t}"}]
            request = json.loads(json.dumps(history))  # parsed anew, as each request's body is
            t0 = time.perf_counter()
            found, _, hashes = store.lookup("seed", request)
            t1 = time.perf_counter()
            assert found is not None and len(found.recall_sources) == args.sources
            store.save_session(found, hashes, history)
            t2 = time.perf_counter()
            lookups.append((t1 - t0) * 1000)
            saves.append((t2 - t1) * 1000)
        record_bytes, stored_bytes = len(encode("session", found)), store.volume()
        store.close()
    report = {"sources": args.sources, "doc_lines": args.doc_lines, "messages": args.messages,
              "message_chars": args.message_chars,
              "turns": args.turns, "lookup_ms_p50": round(statistics.median(lookups), 2),
              "save_ms_p50": round(statistics.median(saves), 2),
              "record_bytes": record_bytes, "stored_bytes": stored_bytes}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
