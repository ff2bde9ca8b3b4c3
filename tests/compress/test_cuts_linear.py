"""Issue 26 item 4: the literal pass of ``compress/cuts.py`` is linear on any input, and finds the same spans.

An unclosed ``/*``, triple quote or template backtick (or a quote that never closes on a long line) made every
later opener of the same kind rescan to the end of the message: 16/32/64/128 KB took 0.8/2.7/10.9/43.8 s.
The work is counted, not timed: ``_literal_spans(work=...)`` adds up the bytes each regex attempt scanned.
"""

from __future__ import annotations

import inspect
import random
import re

import numpy as np
import pytest

from pflash_proxy.compress import cuts
from pflash_proxy.compress.cuts import LineTable, _literal_spans, raw_starts, split_priority
from pflash_proxy.compress.kinds import ContentKind

# the pass as it was (e3db3f4): one alternation tried at every opener byte; the reference for the spans
_REF_PY = re.compile(
    rb'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""|' + rb"'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''|"
    rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|' + rb"'[^'\\\n]*(?:\\.[^'\\\n]*)*'|#[^\n]*", re.S)
_REF_C = re.compile(
    rb"/\*[^*]*\*+(?:[^/*][^*]*\*+)*/|//[^\n]*|" + rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|'
    rb"'(?:\\.|[^'\\\n]){0,4}'|`[^`\\]*(?:\\.[^`\\]*)*`", re.S)


def _reference_spans(data: bytes, python: bool, fences=()) -> list[int]:
    pat, first = (_REF_PY, b"\"'#") if python else (_REF_C, b"/\"'`")
    arr = np.frombuffer(data, dtype=np.uint8)
    cand = np.isin(arr, np.frombuffer(first, dtype=np.uint8))
    for a, b in fences:
        cand[a:b] = False
    flat, end = [], 0
    for p in np.flatnonzero(cand).tolist():
        if p < end:
            continue
        m = pat.match(data, p)
        if m is not None:
            end = m.end()
            flat += [p, end]
    return flat


def _spans(data: bytes, python: bool, fences=(), work=None) -> list[int]:
    return _literal_spans(data, np.frombuffer(data, dtype=np.uint8), python, fences, work)


# adversarial inputs: a first literal that never closes, then many openers of the same kind (escaped where a
# plain one would close it), or one logical line full of escaped quotes
ADVERSARIAL = {
    "c_unclosed_block": (False, "int a;\n/* never closed\n", "int f(void) { return g(1); } /* note\n"),
    "py_unclosed_triple": (True, 'x = 1\ns = """never closed\n', 'a = b \\"""c\n'),
    "js_unclosed_template": (False, "const a = 1;\nconst s = `never closed\n", "let x = \\`tick\\` + 1;\n"),
    "c_escaped_quotes_line": (False, 'char *s = "', '\\" \\" \\" \\" '),
    "py_continued_quotes": (True, 's = "', '\\" \\\' \\" \\\n'),
    "py_unclosed_single_triple": (True, "x = '''never closed\n", "a = b \\'''c\n"),
}


def _build(head: str, rep: str, size: int) -> bytes:
    return (head + rep * ((size - len(head)) // len(rep) + 1)).encode()[:size]


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_literal_pass_work_is_linear_on_adversarial_input(name):
    python, head, rep = ADVERSARIAL[name]
    small = _build(head, rep, 8_192)
    assert _spans(small, python) == _reference_spans(small, python)  # (the reference is the quadratic pass)
    per_byte = []
    for size in (16_384, 262_144):
        work = [0]
        _spans(_build(head, rep, size), python, work=work)
        per_byte.append(work[0] / size)
    # each byte is scanned a bounded number of times, whatever the size (the quadratic pass: ~size / len(rep))
    assert max(per_byte) <= 3, per_byte
    assert per_byte[1] <= per_byte[0] + 0.05, per_byte


@pytest.mark.parametrize("python", [True, False])
def test_literal_spans_equal_the_single_alternation_on_random_input(python):
    rng = random.Random(26)
    alphabet = ['"', "'", "`", "#", "/", "*", "\\", "\n", "x", " ", '"""', "'''", "/*", "*/", "```\n"]
    for _ in range(3000):
        data = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))).encode()
        fences = []
        if rng.random() < 0.3:
            a = rng.randrange(len(data))
            fences = [(a, min(len(data), a + rng.randrange(1, 6)))]
        assert _spans(data, python, fences) == _reference_spans(data, python, fences), (data, fences)


def test_literal_spans_equal_the_single_alternation_on_real_sources():
    import collections
    import json.decoder
    py = (inspect.getsource(collections) + inspect.getsource(json.decoder)).encode()
    c_like = b"".join(
        b'/* block %d */\nint f%d(const char *s) { return s[0] == \'"\' ? 1 : `t${x}`.length; } // end\n' % (i, i)
        for i in range(200))
    for data, python in ((py, True), (c_like, False), (py, False), (c_like, True)):
        work = [0]
        assert _spans(data, python, work=work) == _reference_spans(data, python)
        assert work[0] <= 2 * len(data)


def test_the_cutter_runs_one_linear_literal_pass_behind_an_unclosed_block_comment(monkeypatch):
    """The whole cutter, end to end, on 512 KB behind an unclosed ``/*``."""
    python, head, rep = ADVERSARIAL["c_unclosed_block"]
    data = _build(head, rep, 524_288).decode()
    calls = []
    real = cuts._literal_spans

    def counting(*a, **kw):
        work = [0]
        out = real(*a, work=work)
        calls.append(work[0])
        return out

    monkeypatch.setattr(cuts, "_literal_spans", counting)
    t = LineTable.build(data)
    starts = raw_starts(t, ContentKind.CODE)
    split_priority(t, ContentKind.CODE)
    assert len(calls) == 1 and calls[0] <= 2 * len(data)
    assert len(starts) > 10_000  # a comment that never closes is no literal: every function still starts a unit
