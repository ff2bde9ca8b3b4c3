"""Every-X wordings (``pflash_proxy/bench/cases/every_x.json``, the evals' cases), offline, **dev split** only:
each wording over a file of the split's code-task packages (a name defined once and named on 3-15 other lines,
picked as ``bench every-x`` picks it), as a paste (request then file, or file then request, alternating) and as
Claude Code's read (the request, then the Read result, in a running conversation), through the compress package
with ``approx_tokens`` counts. An every-X request is ok when served whole or (scope ``name``) compressed with
every line naming the name; a pointed one when compressed.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/every_x_offline.py [--cases-dir DIR] [--threshold 2048] [-v]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

from pflash_proxy.compress import Compressor, RequestFinder, TokenizedText
from pflash_proxy.compress.pipeline import CompressionSettings

sys.path.insert(0, str(Path(__file__).parent))
from code_tasks_offline import messages_for, site_dirs  # noqa: E402


def defs(text: str) -> dict[str, list[int]]:
    import ast

    out: dict[str, list[int]] = {}

    def walk(body: list, cls: str | None) -> None:
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.setdefault(f"{cls}.{n.name}" if cls else n.name, []).append(n.lineno)
            elif isinstance(n, ast.ClassDef) and cls is None:
                walk(n.body, n.name)

    walk(ast.parse(text).body, None)
    return out


def pick_name(text: str, seed: int, path: str) -> str | None:
    d = defs(text)
    bare = Counter(q.split(".")[-1] for q in d)
    lines = text.split("\n")
    cands = []
    for q, spans in d.items():
        name = q.split(".")[-1]
        if bare[name] != 1 or len(spans) != 1 or name.startswith("__") or len(name) < 4:
            continue
        pat = re.compile(rf"\b{re.escape(name)}\b")
        uses = sum(1 for i, line in enumerate(lines, 1) if pat.search(line) and i != spans[0]
                   and not line.lstrip().startswith(("def ", "async def ")))
        if 3 <= uses <= 15:
            cands.append(name)
    return random.Random(f"{seed}-{path}").choice(sorted(cands)) if cands else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases-dir", type=Path, default=Path("pflash_proxy/bench/cases"))
    ap.add_argument("--threshold", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", action="store_true")
    opts = ap.parse_args()
    data = json.loads((opts.cases_dir / "every_x.json").read_text())
    tasks = json.loads((opts.cases_dir / "code_tasks.json").read_text())["cases"]
    wordings = [{**w, "kind": "every"} for w in data["every"] if w["split"] == "dev"] + \
               [{**w, "kind": "pointed"} for w in data["pointed"] if w["split"] == "dev"]
    files = []
    for p in sorted({t["path"] for t in tasks if t["split"] == "dev"}):
        src = next((Path(d) / p for d in site_dirs() if (Path(d) / p).exists()), None)
        if src is None:
            continue
        text = src.read_text(encoding="utf-8")
        name = pick_name(text, opts.seed, p)
        if name is not None:
            files.append((p, text, name))
    comp = Compressor(CompressionSettings(threshold=opts.threshold))
    finder = RequestFinder()
    res: Counter[tuple[str, str, bool]] = Counter()
    for i, w in enumerate(wordings):
        path, text, name = files[i % len(files)]
        request = str(w["wording"]).format(name=name)
        pat = re.compile(rf"\b{re.escape(name)}\b")
        for variant in ("paste", "read"):
            if variant == "paste":
                msg = f"{request}\n\n{text}" if i % 2 == 0 else f"{text}\n\n{request}"
                msgs: list[dict[str, object]] = [{"role": "user", "content": msg}]
                idx, warm, wanted = 0, False, [ln for ln in text.split("\n") if pat.search(ln)]
            else:
                msgs = messages_for(request, path, text)
                idx, warm = 3, True
                wanted = [f"{n}\t{ln}" for n, ln in enumerate(text.split("\n"), 1) if pat.search(ln)]
            tt = TokenizedText.from_text(str(msgs[idx]["content"]))
            out = comp.compress(tt, finder.find(msgs, idx, tt), tt.total_tokens + 40, warm,
                                "paste" if variant == "paste" else "tool", "1")
            whole = out.mode != "compressed"
            every = all(x in out.text for x in wanted)
            ok = (whole or (w["scope"] == "name" and every)) if w["kind"] == "every" else not whole
            res[(w["kind"], variant, ok)] += 1
            if opts.v and not ok:
                print(f"  not ok: {w['kind']} {variant} {out.mode} {request!r} ({out.reason})")
    print("| kind | variant | ok |\n|---|---|---|")
    for kind in ("every", "pointed"):
        for variant in ("paste", "read"):
            n = res[(kind, variant, True)] + res[(kind, variant, False)]
            print(f"| {kind} | {variant} | {res[(kind, variant, True)]}/{n} |")
    print(f"\n{len(files)} files")


if __name__ == "__main__":
    main()
