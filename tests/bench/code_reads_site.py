"""A tiny site-packages written into a tmp directory for the code-reads tests: installed distributions with a
``RECORD`` each, source files of 8K+ characters with decorators, dunders, methods that two classes define, and
docstrings; plus files the generator must leave out (too short, a test file, a vendored copy, an excluded
package)."""

from __future__ import annotations

import textwrap
from pathlib import Path

WORDS = ("harbour", "ledger", "pigeon", "orchard", "lantern", "quarry", "meadow", "violin", "glacier", "tundra",
         "beacon", "saddle", "thimble", "walnut", "compass", "kettle", "marble", "falcon", "copper", "timber")


def _function(i: int, name: str) -> str:
    a, b, c = WORDS[i % len(WORDS)], WORDS[(i + 3) % len(WORDS)], WORDS[(i + 7) % len(WORDS)]
    deco = "@functools.lru_cache(\n    maxsize=None,\n)\n" if i % 3 == 0 else ("@staticmethod_like\n" if i % 3 == 1
                                                                             else "")
    return deco + textwrap.dedent(f'''\
        def {name}(items, limit=10):
            """Gather every {a} entry from the {b} records and weigh each against the {c} totals.

            Longer explanation that the generator ignores.
            """
            found = []
            for item in items:
                if len(found) >= limit:
                    break
                found.append(compute_{a}_weight(item))
            if not found:
                raise ValueError("no {a} entries among the {b} records")
            return sorted(found)
        ''')


def _class(name: str, other: str) -> str:
    return textwrap.dedent(f'''\
        class {name}:
            """A mapping of keys to values, kept in insertion order."""

            def __init__(self, data=None):
                self._data = dict(data or {{}})
                self._order = list(self._data)
                self._hits = 0

            def __setitem__(self, key, value):
                if key not in self._data:
                    self._order.append(key)
                self._data[key] = value
                self._hits += 1

            def __getitem__(self, key):
                self._hits += 1
                if key not in self._data:
                    raise KeyError(key)
                return self._data[key]

            def pop(self, key, default=None):
                """Remove the key and hand back what it held, or the fallback when absent."""
                if key in self._data:
                    self._order.remove(key)
                    return self._data.pop(key)
                return default

            def merge(self, other, overwrite=True):
                """Fold another mapping into this one, keeping or replacing clashing entries."""
                for key, value in other.items():
                    if overwrite or key not in self._data:
                        self[key] = value
                return self

            def describe(self, limit=5):
                """Summarise the first few entries for a log line."""
                shown = ", ".join(f"{{k}}={{self._data[k]!r}}" for k in self._order[:limit])
                more = len(self._order) - limit
                return shown + (f" (+{{more}} more)" if more > 0 else "")

            def {other}(self, threshold):
                """Count the stored values that exceed the threshold given by the caller."""
                total = 0
                for key in self._order:
                    if self._data[key] > threshold:
                        total += 1
                return total
        ''')


def module_text(stem: str, n_functions: int = 16) -> str:
    parts = ["import functools\n\n\ndef staticmethod_like(fn):\n    return fn\n\n\n"]
    parts += [_function(i, f"{stem}_{WORDS[i % len(WORDS)]}_{i}") + "\n\n" for i in range(n_functions)]
    parts += [_class(f"{stem.title()}Store", "count_above") + "\n\n", _class(f"{stem.title()}Cache", "tally") + "\n"]
    return "".join(parts)


def _dist(site: Path, name: str, version: str, files: dict[str, str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = []
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        record.append(f"{rel},,")
    record.append(f"{info.name}/METADATA,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


PACKAGES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")


def make_site(root: Path) -> Path:
    """Six fixture packages (four source files each) and the files that must be left out."""
    site = root / "site-packages"
    site.mkdir(parents=True)
    for stem in PACKAGES:
        _dist(site, f"{stem}pkg", "1.2.3", {
            f"{stem}pkg/__init__.py": "",
            f"{stem}pkg/core.py": module_text(stem),
            f"{stem}pkg/extra.py": module_text(stem + "x"),
            f"{stem}pkg/more.py": module_text(stem + "y"),
            f"{stem}pkg/other.py": module_text(stem + "z"),
            f"{stem}pkg/small.py": "def tiny():\n    return 1\n",  # under 8K characters
            f"{stem}pkg/tests/test_core.py": module_text("t" + stem),  # a test file
            f"{stem}pkg/_vendor/copied.py": module_text("v" + stem),  # a vendored copy
        })
    _dist(site, "jinja2", "3.1.0", {"jinja2/utils.py": module_text("jinja")})  # the agent-read study of 19528cf read it
    return site
