"""Would the current unit cutter cut the recorded bench cases as they were cut? (``bench quality --dump-analyses``)

A change to ``compress/cuts.py`` after a long bench run leaves that run's report valid for the product exactly
when every recorded message still segments into the same units: this re-segments each recorded first-turn message
(heuristic segmenter, the recorded min/max segment) and lists the cases whose units differ.

    .venv/bin/python benchmarks/same_units.py ANALYSES.pkl [...]
"""

from __future__ import annotations

import sys

from pflash_proxy.bench import analyses
from pflash_proxy.compress.units import UnitSegmenter


def main(paths: list[str]) -> int:
    changed = 0
    for path in paths:
        records, _ = analyses.load(path)
        seen, same, differ = set(), 0, []
        for a in records:
            if (a.case_id, a.tt.total_tokens) in seen:
                continue  # every scorer row of a case saw the same message
            seen.add((a.case_id, a.tt.total_tokens))
            seg = UnitSegmenter(a.settings.min_segment, a.settings.max_segment)
            now = [(u.start_line, u.end_line) for u in seg.segment(a.tt, None)]
            if now == [(u.start_line, u.end_line) for u in a.units]:
                same += 1
            else:
                differ.append(f"{a.case_id} ({len(a.units)} -> {len(now)} units)")
        changed += len(differ)
        print(f"{path}: {same} messages cut as recorded; different: {', '.join(differ) or 'none'}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
