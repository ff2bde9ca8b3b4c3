"""Replay one recorded first turn through the pipeline and the stage's budget landing, offline.

``bench quality --dump-analyses FILE`` records each scorer's units and scores of each case's long message
(``bench/analyses.py``). This replays one of them:

1. Stages 1-3 from the record (units, pinned units, the scorer's scores; named definitions and blocks as the
   pipeline derives them), then ``Compressor.compress`` at the record's settings.
2. The stage's landing (``stages/compress.py``: ``Landing``): the served message is counted with a real tokenizer
   (``--tokenizer``, a GGUF read with llama-cpp-python's ``vocab_only``: gemma's counts are llama-server's) and
   re-selected with the measured error taken off, as the proxy does with llama-server's ``/tokenize``.
3. Print each round (units kept, the estimate, the real count, whether ``--gold`` is served), the omission
   markers' estimated and real tokens, and the gold unit's rank by score.

    python benchmarks/landing_replay.py --analyses FILE --case nolima-32k-4 --gold "Priya lives next to" \
        --tokenizer ~/.cache/pflash-proxy/models/gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pflash_proxy.bench import analyses  # noqa: E402
from pflash_proxy.compress.gutter import bare_text, find_gutter  # noqa: E402
from pflash_proxy.compress.named import definition_blocks, definitions, named_definitions, outline  # noqa: E402
from pflash_proxy.compress.pipeline import Analysis, Compressor, Landing  # noqa: E402
from pflash_proxy.compress.rewrite import MARKER_RE, marker_tokens_arrays  # noqa: E402
from pflash_proxy.compress.routed import is_code  # noqa: E402

ROUNDS = 4  # the stage's _BUDGET_ROUNDS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--analyses", type=Path, required=True)
    ap.add_argument("--case", required=True, help="case id prefix")
    ap.add_argument("--row", default="", help="the scorer row (default: the first recorded for the case)")
    ap.add_argument("--gold", required=True, help="a line of the gold evidence")
    ap.add_argument("--tokenizer", type=Path, required=True, help="GGUF whose tokenizer counts the served text")
    args = ap.parse_args()
    from llama_cpp import Llama

    vocab = Llama(model_path=str(args.tokenizer), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    recorded, _ = analyses.load(args.analyses)
    a = next(x for x in recorded if x.case_id.startswith(args.case) and args.row in x.row)
    settings = a.settings
    g = find_gutter(a.tt.lines)
    work = a.tt if g is None else bare_text(a.tt, g)
    defs = definitions(work)
    named, optional = named_definitions(work, a.units, a.request.text, defs)
    blocks = tuple(definition_blocks(work, a.units, 2 * settings.max_segment, defs))
    scores = np.asarray(a.scores, dtype=np.float64)
    analysis = Analysis(a.units, a.pinned, None, scores, {}, None if g is None else g.form,  # type: ignore[arg-type]
                        named, blocks, optional, outline(work.lines, defs) if is_code(a.units) else ())
    comp = Compressor(settings)
    gold_units = [u.index for u in a.units if any(args.gold in a.tt.lines[i] for i in range(u.start_line, u.end_line))]
    order = np.argsort(-scores)
    print(f"{a.case_id} ({a.row}): {len(a.units)} units, {a.tt.total_tokens} tokens; gold unit(s) {gold_units}, "
          f"rank {[int(np.flatnonzero(order == u)[0]) + 1 for u in gold_units]} by score")

    def run(adjust: int):  # type: ignore[no-untyped-def]
        return comp.compress(a.tt, a.request, a.prompt_tokens, a.in_conversation, a.source, a.label,
                             budget_adjust=adjust, analysis=analysis)

    first = run(0)
    marker = re.compile(MARKER_RE)
    found = [m for line in first.text.split("\n") if (m := marker.match(line))]
    markers = [m.group(0) for m in found]
    spans = [(int(m.group(1)) - 1, int(m.group(2) or m.group(1))) for m in found]
    estimated = int(marker_tokens_arrays(np.array([s for s, _ in spans]), np.array([e for _, e in spans])).sum()) \
        if spans else 0
    real = sum(count(m + "\n") for m in markers)
    print(f"budget {first.budget_tokens}; first round: {len(markers)} markers, estimated {estimated} tokens, "
          f"counted {real}")
    landing = Landing(first.budget_tokens, (first, count(first.text)))
    print(f"round 0: {first.units_kept} units, estimate {first.served_message_tokens}, counted {landing.best[1]}, "
          f"gold {args.gold in first.text}")
    for i in range(1, ROUNDS + 1):
        adjust = landing.next_adjust()
        if adjust is None:
            break
        out = run(adjust)
        n = count(out.text)
        landing.offer(out, n)
        print(f"round {i} (adjust {adjust}): {out.units_kept} units, estimate {out.served_message_tokens}, "
              f"counted {n}, gold {args.gold in out.text}")
    best, n = landing.best
    print(f"served: {best.units_kept} units, {n} tokens (budget {first.budget_tokens}), gold {args.gold in best.text}")


if __name__ == "__main__":
    main()
