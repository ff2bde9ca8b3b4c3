"""A one-line progress bar on stderr for long work (``train``, ``bench``), no dependency; below both and the CLI.

``Progress(total, label)`` is called with the number of items done (or ``advance()``d one item at a time); it
redraws at most every 0.5 s with the rate and the time left (from the mean time per item so far). On a
non-terminal stderr (a log file, CI, a pipe) it prints a plain line every 10 % instead of redrawing, so a log
gets at most 11 lines and no carriage returns. ``write(text)`` prints a message line without garbling the bar.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 28) -> None:
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self._last = 0.0
        self._decile = -1
        self.done = 0
        self._drawn = ""  # the bar line now on a terminal's screen, "" when none is

    def line(self, done: int, note: str = "") -> str:
        frac = min(done / self.total, 1.0)
        el = time.monotonic() - self.t0
        left = el / done * (self.total - done) if done else 0.0
        bar = "#" * int(frac * self.width)
        return (f"{self.label} [{bar:<{self.width}}] {done}/{self.total} {frac:4.0%} "
                f"{el:5.0f}s elapsed, {left:5.0f}s left{'  ' + note if note else ''}")

    def __call__(self, done: int, note: str = "") -> None:
        now = time.monotonic()
        self.done = done
        if self.tty:
            if now - self._last >= 0.5 or done >= self.total:
                self._drawn = self.line(done, note)
                self.stream.write("\r" + self._drawn + "\x1b[K")  # clear what a longer line left behind
                if done >= self.total:
                    self.stream.write("\n")
                    self._drawn = ""
                self.stream.flush()
                self._last = now
        elif int(10 * done / self.total) != self._decile:
            self._decile = int(10 * done / self.total)
            self.stream.write(self.line(done, note) + "\n")
            self.stream.flush()

    def advance(self, note: str = "", n: int = 1) -> None:
        """``n`` more items done, for loops that do not count for themselves."""
        self(self.done + n, note)

    def write(self, text: str) -> None:
        """One message line (a verbose report) above the bar: on a terminal the bar is cleared and redrawn."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K" + text + "\n" + self._drawn)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line on a terminal when the work stopped short of ``total`` (an error, a skipped step)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = ""
