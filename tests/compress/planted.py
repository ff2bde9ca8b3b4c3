"""Planted literal facts asked word for word (issue 48): a fact planted in real code or prose at the start, middle
or end of a paste of a given size, and its question after (or before) the paste.

Real text, nothing written for the test: code is the Python standard library's own source (``asyncio``, then
``email``, ``json``, ... in order), prose the language reference's topics that ship with it
(``pydoc_data.topics``, hard-wrapped English). Sizes are in ``approx_tokens``; the fact is planted at a line start
(code: a comment before a ``def``, indented like it; prose: a sentence of its own at a paragraph start), so it is
a whole line of the message, as a fact in a real paste is.
"""

from __future__ import annotations

import asyncio
import pathlib
from dataclasses import dataclass
from typing import Literal

from pflash_proxy.compress.text import approx_line_tokens, split_lines

Kind = Literal["code", "prose"]
Where = Literal["start", "middle", "end"]
Ask = Literal["after", "before", "message"]

FACTS = (
    ("The launch code for the orbital relay is 7C-ALPHA-93.", "What is the launch code for the orbital relay?",
     "7C-ALPHA-93"),
    ("The spare key to the greenhouse is kept under the blue ceramic frog.",
     "Where is the spare key to the greenhouse kept?", "blue ceramic frog"),
    ("Dr. Ilse Marrow signed the Kestrel treaty in the year 1847.", "In which year did Dr. Ilse Marrow sign the "
     "Kestrel treaty?", "1847"),
)
POSITIONS: dict[str, float] = {"start": 0.05, "middle": 0.5, "end": 0.95}
_PACKAGES = ("asyncio", "email", "json", "http", "concurrent", "importlib", "logging", "urllib", "xml", "unittest",
             "multiprocessing", "sqlite3", "tomllib", "zoneinfo", "wsgiref", "xmlrpc", "ctypes", "curses", "dbm")


def _code_lines(tokens: int) -> list[str]:
    lib = pathlib.Path(asyncio.__file__).parent.parent
    out: list[str] = []
    used = 0
    for pkg in _PACKAGES:
        for f in sorted((lib / pkg).rglob("*.py")):
            if "test" in f.parts[-2] or f.name.startswith("test"):
                continue
            lines = split_lines(f.read_text(encoding="utf-8"))
            for line, n in zip(lines, approx_line_tokens(lines)):
                if used + n > tokens:
                    return out
                out.append(line)
                used += n
            if out and not out[-1].endswith("\n"):
                out[-1] += "\n"
    return out


def _prose_lines(tokens: int) -> list[str]:
    from pydoc_data.topics import topics

    out: list[str] = []
    used = 0
    for name in sorted(topics):
        lines = split_lines(topics[name].rstrip("\n") + "\n\n")
        for line, n in zip(lines, approx_line_tokens(lines)):
            if used + n > tokens:
                return out
            out.append(line)
            used += n
    return out


@dataclass(frozen=True)
class Planted:
    text: str  # the pasted body with the fact, no question
    fact: str
    question: str
    answer: str


def planted(kind: Kind, tokens: int, where: Where, fact: int = 0) -> Planted:
    """A paste of about ``tokens`` tokens of ``kind`` with fact number ``fact`` planted at ``where``."""
    sentence, question, answer = FACTS[fact % len(FACTS)]
    lines = _code_lines(tokens) if kind == "code" else _prose_lines(tokens)
    target = int(POSITIONS[where] * len(lines))
    if kind == "code":
        spots = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
    else:
        spots = [i for i in range(1, len(lines)) if not lines[i - 1].strip() and lines[i].strip()
                 and not lines[i].startswith(" ")]
    at = min(spots, key=lambda i: (abs(i - target), i))
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    plant = f"{indent}# {sentence}\n" if kind == "code" else f"{sentence}\n\n"
    return Planted("".join(lines[:at] + [plant] + lines[at:]), sentence, question, answer)


def messages(case: Planted, ask: Ask) -> tuple[list[dict[str, object]], int]:
    """The chat messages that send the paste and its question, and the index of the long message: the question
    after the paste in the same message, before it, or in a user message of its own."""
    if ask == "after":
        return [{"role": "user", "content": case.text + "\n" + case.question + "\n"}], 0
    if ask == "before":
        return [{"role": "user", "content": case.question + "\n\n" + case.text}], 0
    return [{"role": "user", "content": case.text}, {"role": "user", "content": case.question}], 0
