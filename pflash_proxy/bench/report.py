"""Writing a bench's results: JSON, a markdown file of tables, and a PNG chart when matplotlib is importable.

1. ``Table(title, headers, rows)``: one markdown table; cells are rendered with ``fmt`` (floats to 2-3
   significant decimals, None as "–").
2. ``Chart(title, ylabel, categories, series)``: one grouped bar chart (category on x, one bar per series).
3. ``write_report(out_dir, name, data, tables, notes, chart)`` writes ``NAME.json`` (``data`` plus the tables),
   ``NAME.md`` (title, notes, tables) and, if matplotlib can be imported, ``NAME.png``.  matplotlib is not a
   dependency: without it the PNG is skipped and the markdown says so.  Returns the paths written and the
   markdown text.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: Sequence[Sequence[object]]  # cells: numbers, strings, None (shown as –), booleans (yes/no)


@dataclass
class Chart:
    title: str
    ylabel: str
    categories: list[str]
    series: dict[str, list[float | None]]


@dataclass
class Written:
    paths: list[Path] = field(default_factory=list)
    markdown: str = ""
    png_skipped: str | None = None


def fmt(v: object) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(t: Table) -> str:
    lines = [f"### {t.title}", "", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines) + "\n"


def mean(xs: Sequence[float | None]) -> float | None:
    given = [x for x in xs if x is not None]
    return statistics.fmean(given) if given else None


def median(xs: Sequence[float | None]) -> float | None:
    given = [x for x in xs if x is not None]
    return statistics.median(given) if given else None


def pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "–"


def try_png(path: Path, chart: Chart) -> str | None:
    """Draw the chart; returns None when written, else the reason it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed; PNG chart skipped (pip install matplotlib to get it)"
    n_series = max(len(chart.series), 1)
    width = 0.8 / n_series
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(chart.categories) * n_series / 2 + 3), 4))
    for i, (name, values) in enumerate(chart.series.items()):
        xs = [j + (i - (n_series - 1) / 2) * width for j in range(len(chart.categories))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
    ax.set_xticks(range(len(chart.categories)))
    ax.set_xticklabels(chart.categories)
    ax.set_ylabel(chart.ylabel)
    ax.set_title(chart.title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_report(out_dir: Path | str, name: str, title: str, data: Mapping[str, object], tables: list[Table],
                 notes: Sequence[str] = (), chart: Chart | None = None) -> Written:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = Written()
    if chart is not None:
        png = out / f"{name}.png"
        written.png_skipped = try_png(png, chart)
        if written.png_skipped is None:
            written.paths.append(png)
    parts = [f"# {title}", ""]
    parts += [f"- {n}" for n in notes]
    if written.png_skipped:
        parts.append(f"- {written.png_skipped}")
    elif chart is not None:
        parts.append(f"- chart: `{name}.png`")
    parts.append("")
    parts += [markdown_table(t) for t in tables]
    written.markdown = "\n".join(parts)
    md = out / f"{name}.md"
    md.write_text(written.markdown)
    js = out / f"{name}.json"
    payload = dict(data)
    payload["tables"] = [asdict(t) for t in tables]
    payload["notes"] = list(notes) + ([written.png_skipped] if written.png_skipped else [])
    js.write_text(json.dumps(payload, indent=2, default=str))
    written.paths[:0] = [js, md]
    return written
