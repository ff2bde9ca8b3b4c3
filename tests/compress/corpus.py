"""Real text for the compression tests: varied prose, a needle, stdlib code."""

from __future__ import annotations

import inspect
import json
import textwrap


PARAGRAPHS = [
    "The harbour town woke slowly that winter. Fishing boats sat in the mud at low tide, and the gulls "
    "argued over scraps behind the market hall while the baker swept frost from his step.",
    "Railway timetables in the nineteenth century were a patchwork of local times. Each town kept its own "
    "noon by the sun, so a traveller crossing the country had to adjust a pocket watch at every junction.",
    "Sourdough depends on a stable culture of wild yeast and lactic acid bacteria. Feeding the starter at "
    "regular intervals keeps the acidity in check and the rise predictable from one bake to the next.",
    "Glaciers carve valleys into a characteristic U shape. Meltwater streams carry fine rock flour that "
    "turns mountain lakes an opaque turquoise during the summer months.",
    "A good code review asks whether the change is needed at all before it asks whether it is written well. "
    "Reviewers who start with naming tend to miss the larger design problems entirely.",
    "The orchestra tuned to the oboe's A while the audience found their seats. Somewhere in the balcony a "
    "programme slipped from a railing and drifted down onto the stalls below.",
    "Migratory birds navigate using the earth's magnetic field, the position of the sun and the pattern of "
    "stars. Young birds on their first journey rely more heavily on instinct than experience.",
    "Spreadsheets became the accidental database of a generation of small businesses, holding inventories, "
    "payrolls and customer lists long after they had outgrown a single sheet.",
]

# The seed's curve with a flat message share of 0.3: the default before the budget was shaped by read size (issue
# 48). The mechanism tests (a pin that takes most of the budget, a definition of 0.7 of it, a gate that finds more
# relevant units than the budget keeps) size their messages against this budget, so they pin it rather than
# follow the default's numbers for small messages.
FLAT_CURVE = "16384:0.315 32768:0.270 65536:0.270 120000:0.225 message:0.3"

NEEDLE = ("The vault combination for the Zebulon archive is 7421-ORCHID, and only the night curator "
          "Margarethe Voss is allowed to open it.")


def prose_paragraphs(n: int) -> list[str]:
    out = []
    for i in range(n):
        base = PARAGRAPHS[i % len(PARAGRAPHS)]
        out.append(f"{base} (Section {i + 1}.)")
    return out


def document_with_needle(n_paragraphs: int = 40, needle_at: int = 17) -> str:
    """Prose paragraphs plus two stdlib-code sections in markdown fences, with a needle."""
    paras = prose_paragraphs(n_paragraphs)
    paras.insert(needle_at, NEEDLE)
    code1 = inspect.getsource(textwrap.dedent)
    code2 = inspect.getsource(json.dumps)
    paras.insert(8, "```python\n" + code1.rstrip("\n") + "\n```")
    paras.insert(30, "```python\n" + code2.rstrip("\n") + "\n```")
    return "\n\n".join(paras) + "\n"
