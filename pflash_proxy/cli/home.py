"""One serving proxy per state directory (``--home``).

A state directory holds one proxy's sessions (its index and the lookup mirror it keeps in memory), its slot
snapshots and its spawned llama-server's log.  A second ``serve`` on the same directory would take sessions whose
slots are on another llama-server and write over the first one's records, so it is refused:

1. ``serve`` takes an exclusive ``flock`` on ``<home>/serve.lock`` (non-blocking) once its port is bound, and
   writes its pid and listening URLs into the file.  The lock is the open file's: the kernel frees it when the
   process ends in any way (``kill -9`` included), so a stale file never blocks a start.  The descriptor is not
   inherited by the spawned llama-server.
2. A ``serve`` that finds the lock taken exits 1 with one line naming the holder (pid, URL) and the way out.
3. ``holder(home)`` tells ``wrap`` the URL of the proxy serving from a directory, where one does.
4. Where ``fcntl`` is missing (not POSIX) or the file system refuses locks (some network mounts), nothing is
   locked (logged).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import IO, Sequence

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "serve.lock"
log = logging.getLogger("pflash_proxy.cli")


class HomeTaken(Exception):
    """Another process holds the directory's lock; ``pid`` and ``urls`` as it wrote them (empty if unreadable)."""

    def __init__(self, home: Path, pid: str, urls: list[str]):
        self.home, self.pid, self.urls = home, pid, urls
        who = f"pid {pid}" + (f" at {', '.join(urls)}" if urls else "") if pid else "another process"
        super().__init__(f"another pflash-proxy ({who}) serves from {home}; stop it, or give this one a state "
                         f"directory of its own (--home or PFLASH_HOME)")


def _holder_line(f: IO[str]) -> tuple[str, list[str]]:
    f.seek(0)
    words = f.read(4096).split()
    return (words[0], words[1:]) if words and words[0].isdigit() else ("", [])


def hold(home: Path, urls: Sequence[str]) -> IO[str] | None:
    """Take the directory's lock and write this process's pid and ``urls`` into it; the lock lasts while the
    returned file stays open (the caller keeps it for its lifetime).  ``HomeTaken`` if another process holds it;
    None where nothing can be locked."""
    if fcntl is None:
        return None
    f: IO[str] | None = None
    try:
        f = os.fdopen(os.open(home / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), "r+")
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        assert f is not None
        pid, taken_by = _holder_line(f)
        f.close()
        raise HomeTaken(home, pid, taken_by) from None
    except OSError as exc:  # unwritable, or a file system without locks (some network mounts: ENOLCK)
        if f is not None:
            f.close()
        log.warning("cannot lock %s (%s): serving without the one-proxy-per-directory lock", home / LOCK_NAME, exc)
        return None
    f.truncate()
    f.write(f"{os.getpid()} {' '.join(urls)}\n")
    f.flush()
    return f


def holder(home: Path) -> str | None:
    """The first URL of the proxy serving from ``home`` now, None when none holds its lock."""
    path = home / LOCK_NAME
    if fcntl is None or not path.exists():
        return None
    try:
        with open(path, "r+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                urls = _holder_line(f)[1]
                return next((u for u in urls if u.startswith("http")), None)
            return None  # free: nobody serves from it
    except OSError:
        return None
