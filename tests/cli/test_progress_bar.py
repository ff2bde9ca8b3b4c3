"""The CLI's progress bar (``train``, ``bench``): a redrawn line on a terminal, a few plain lines elsewhere."""

from __future__ import annotations

import io

from pflash_proxy.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_it_prints_a_plain_line_every_tenth():
    out = io.StringIO()
    bar = Progress(200, "quality", stream=out)
    bar(0)
    for i in range(200):
        bar.advance(f"case-{i}")
    bar.write("  a verbose line")
    bar.close()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text
    assert len(lines) == 12  # 0 %, 10 % ... 100 %, and the message
    assert lines[0].startswith("quality [") and " 0/200 " in lines[0]
    assert " 200/200 100% " in lines[-2] and lines[-2].endswith("case-199")
    assert lines[-1] == "  a verbose line"


def test_on_a_terminal_it_redraws_and_keeps_messages_above_the_bar():
    out = Terminal()
    bar = Progress(4, "ttft", stream=out)
    bar.advance("first")
    bar.write("  ttft case-1 full: 1.0 s")
    assert out.getvalue().endswith("\r\x1b[K  ttft case-1 full: 1.0 s\n" + bar.line(1, "first"))
    bar.close()  # stopped short of the total: the line is ended once
    bar.close()
    assert out.getvalue().endswith("first\n") and not out.getvalue().endswith("\n\n")
    done = Terminal()
    bar = Progress(2, "answers", stream=done)
    bar.advance()
    bar.advance()  # the last item always draws, and ends the line
    assert done.getvalue().count("\n") == 1 and " 2/2 100% " in done.getvalue()
