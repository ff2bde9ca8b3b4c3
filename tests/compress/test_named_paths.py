"""A file path in the request names the file, not a definition: an agent's "I'll read ledger.py first." and its
Read call do not make ``class ledger`` a named definition that is always kept (users'-words code tasks, dev:
python-dateutil's relativedelta.py, whose class docstring took half the budget of every read of it)."""

from __future__ import annotations

from pflash_proxy.compress.pipeline import CompressionSettings, Compressor
from pflash_proxy.compress.request import RequestSpec
from pflash_proxy.compress.text import TokenizedText

DOC = "\n".join(f"    Paragraph {k} of the ledger's long story: entries, balances and the audit trail "
                f"that every posting leaves behind in book number {k}." for k in range(60))


def helper(k: int) -> str:
    return (f"def posting_{k}(book, amount):\n"
            f"    total = book.balance(kind={k}) + amount * {k + 1}\n"
            f"    return book.record(total, tag='p{k}')\n")


GOLD = ("def reverse_entry(book, entry):\n"
        '    """Undo an entry by booking its opposite."""\n'
        "    book.record(-entry.amount, tag='undo')\n"
        "    return entry.amount\n")


def test_the_file_name_in_the_narration_and_call_names_no_definition():
    text = ("class ledger:\n    \"\"\"\n" + DOC + "\n    \"\"\"\n\n    size = 0\n\n\n"
            + "\n\n".join([helper(k) for k in range(40)] + [GOLD] + [helper(k) for k in range(40, 80)]))
    tt = TokenizedText.from_text(text)
    task = "How do I undo something I booked by mistake?"
    request = RequestSpec(task + "\nI'll read ledger.py first.\n"
                          'Read({"file_path": "/home/user/project/books/ledger.py"})', 0, "tool-call", None, task)
    out = Compressor(CompressionSettings(threshold=256)).compress(tt, request, tt.total_tokens + 40, True, "tool",
                                                                  "1")
    assert out.mode == "compressed" and out.analysis is not None
    assert out.analysis.named == frozenset()  # before: the units of `class ledger` (its docstring), always kept
    assert GOLD.rstrip("\n") in out.text
