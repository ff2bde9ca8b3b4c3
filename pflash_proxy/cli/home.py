"""One serving proxy per state directory (``--home``) and per slot folder (``--slot-save-path``), and only in a
directory this user alone controls.

A state directory holds one proxy's sessions (its index and the lookup mirror it keeps in memory), its slot
snapshots and its spawned llama-server's log.  A second ``serve`` on the same directory would take sessions whose
slots are on another llama-server and write over the first one's records, so it is refused:

1. ``check_home``: the state directory must belong to this user and be writable by nobody else (group or other
   write bits refused, as is a symbolic link another user owns): anyone who can write into it could plant a
   ``serve.lock`` link, records or snapshots.  A directory that fails is refused (``Untrusted``: one line, exit
   1), never repaired: what it holds may already be someone else's.  It is created 0700 where missing.
2. ``serve`` takes an exclusive ``flock`` on ``<home>/serve.lock`` (non-blocking) once its port is bound, and
   writes its pid, its listening URLs and a random nonce into the file.  The file is opened without following
   a symbolic link (``O_NOFOLLOW``) and must be a regular file of this user with one link: a link, a FIFO, a
   directory or a device under that name is refused in one line (never followed, written through, or served
   without the lock).  The lock is the open file's: the kernel frees it when the process ends in any way
   (``kill -9`` included), so a stale file never blocks a start.  The descriptor is not inherited by the
   spawned llama-server.
3. A ``serve`` that finds the lock taken exits 1 with one line naming the holder (pid, URL) and the way out.
4. ``hold_slots``: the slot folder gets the same lock (``pflash-slots.lock``, the same safe open), since a proxy
   reconciles its folder at start-up (a file its index does not name is deleted): a second proxy on the folder
   exits 1 naming the first.  Nodes of one shared index (``--index redis://``) share their folder by design:
   they take the lock shared, so that they exclude a proxy with an index of its own but not each other.
5. ``holder(home)`` tells ``wrap`` the URL of the proxy serving from a directory, and the nonce to check it by:
   only from a lock file that passes step 2's checks, in a home that passes step 1's, and held by a live
   process.  ``wrap`` then asks that URL for ``server.keys.proof(nonce, challenge)`` (``PROOF_PATH``) before using it.
6. Where ``fcntl`` is missing (not POSIX) or the file system refuses locks (some network mounts), nothing is
   locked (logged).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

from pflash_proxy.config import private_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "serve.lock"
SLOTS_LOCK_NAME = "pflash-slots.lock"
SHARED_LINE = "shared\n"  # what the nodes of a shared index write into the slot folder's lock
# errors of a file system that has no locks: serve unlocked (logged), as before
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
log = logging.getLogger("pflash_proxy.cli")


class Untrusted(Exception):
    """A state directory, slot folder or lock file this process must not use; the message is one line."""


class Unopenable(Untrusted):
    """A lock file that could not be opened or created at all (no permission, a read-only file system)."""


class HomeTaken(Exception):
    """Another process holds the directory's lock; ``pid`` and ``urls`` as it wrote them (empty if unreadable)."""

    def __init__(self, home: Path, pid: str, urls: list[str], what: str = "serves from",
                 way_out: str = "give this one a state directory of its own (--home or PFLASH_HOME)"):
        self.home, self.pid, self.urls = home, pid, urls
        who = f"pid {pid}" + (f" at {', '.join(urls)}" if urls else "") if pid.isdigit() else \
            "the nodes of a shared --index" if pid == "shared" else "another process"
        super().__init__(f"another pflash-proxy ({who}) {what} {home}; stop it, or {way_out}")


@dataclass
class Held:
    """A lock this process holds while ``file`` stays open; ``nonce``: what ``wrap`` checks the URL by."""

    file: IO[str]
    nonce: str


def check_home(home: Path) -> Path:
    """``home`` created (0700) when missing; ``Untrusted`` when it belongs to another user, others can write
    into it, or it is a symbolic link that another user (not root) owns. Returns ``home``."""
    uid = os.getuid()
    try:
        link = os.lstat(home)
    except FileNotFoundError:
        return private_dir(home)
    except OSError as exc:
        raise Untrusted(f"cannot read the state directory {home}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (uid, 0):
        raise Untrusted(f"the state directory {home} is a symbolic link owned by uid {link.st_uid}, not by this "
                        f"user (uid {uid}): give --home (PFLASH_HOME) a directory of your own")
    try:
        st = os.stat(home)
    except OSError as exc:
        raise Untrusted(f"cannot read the state directory {home}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"the state directory {home} is not a directory")
    if st.st_uid != uid:
        raise Untrusted(f"the state directory {home} belongs to uid {st.st_uid}, not to this user (uid {uid}): "
                        f"give --home (PFLASH_HOME) a directory of your own")
    if st.st_mode & 0o022:
        raise Untrusted(f"the state directory {home} is writable by others (mode {st.st_mode & 0o7777:o}): "
                        f"anything in it may have been planted; check it, then `chmod 700 {home}`")
    return private_dir(home)


def open_lock(path: Path, write: bool) -> int:
    """A descriptor of the lock file ``path``, created 0600 when ``write`` and missing; never through a symbolic
    link, never anything but a regular file of this user with one link (``Untrusted`` otherwise)."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    flags |= os.O_RDWR | os.O_CREAT if write else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        why = {errno.ELOOP: "is a symbolic link", errno.EISDIR: "is a directory",
               errno.ENXIO: "is not a regular file"}.get(exc.errno or 0)
        if why is None:
            raise Unopenable(f"cannot open {path}: {exc.strerror or exc}") from None
        raise Untrusted(f"{path} {why}: refused (remove it; only a regular file of this user serves as the lock)"
                        ) from None
    st = os.fstat(fd)
    problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
               else f"belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})" if st.st_uid != os.getuid()
               else f"has {st.st_nlink} hard links" if st.st_nlink != 1 else None)
    if problem:
        os.close(fd)
        raise Untrusted(f"{path} {problem}: refused (remove it; only a regular file of this user serves as the "
                        f"lock)")
    return fd


def _holder_line(f: IO[str]) -> tuple[str, list[str], str]:
    """(pid, URLs, nonce) as the holder wrote them; empty where unreadable."""
    try:
        f.seek(0)
        words = f.read(4096).split()
    except (OSError, ValueError):
        return "", [], ""
    if words[:1] == ["shared"]:
        return "shared", [], ""
    if not words or not words[0].isdigit():
        return "", [], ""
    urls = [w for w in words[1:] if w.startswith(("http://", "https://", "unix://"))]
    nonce = next((w[6:] for w in words[1:] if w.startswith("nonce=")), "")
    return words[0], urls, nonce


def _take(path: Path, line: str, shared: bool) -> IO[str] | None:
    """``path`` opened safely and locked (shared or exclusive), ``line`` written into it when exclusive; None
    where nothing can be locked. ``BlockingIOError`` (with the holder's line read) when another process holds it."""
    fd = open_lock(path, write=True)
    f = os.fdopen(fd, "r+")
    try:
        fcntl.flock(f, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        held = _holder_line(f)
        f.close()
        raise _Busy(*held) from None
    except OSError as exc:
        f.close()
        if exc.errno in _NO_LOCKS:  # a file system without locks (some network mounts: ENOLCK)
            log.warning("cannot lock %s (%s): serving without the one-proxy-per-directory lock", path, exc)
            return None
        raise Untrusted(f"cannot lock {path}: {exc.strerror or exc}") from None
    try:  # shared holders all write the same line (SHARED_LINE): none of them tears another's
        f.truncate(0)
        f.write(line)
        f.flush()
    except OSError as exc:  # a full disk: the lock holds all the same; wrap will not find this proxy
        log.warning("cannot write %s (%s): the lock is held, but wrap will not find this proxy", path, exc)
    return f


class _Busy(Exception):
    def __init__(self, pid: str, urls: list[str], nonce: str):
        super().__init__(pid)
        self.pid, self.urls = pid, urls


def hold(home: Path, urls: Sequence[str]) -> Held | None:
    """Take the directory's lock and write this process's pid, ``urls`` and a fresh nonce into it; the lock lasts
    while the returned file stays open (the caller keeps it for its lifetime).  ``HomeTaken`` if another process
    holds it; ``Untrusted`` for a lock file that is not a regular file of this user; None where nothing can be
    locked."""
    if fcntl is None:
        return None
    nonce = secrets.token_hex(16)
    try:
        f = _take(home / LOCK_NAME, f"{os.getpid()} {' '.join(urls)} nonce={nonce}\n", shared=False)
    except _Busy as busy:
        raise HomeTaken(home, busy.pid, busy.urls) from None
    return Held(f, nonce) if f is not None else None


def hold_slots(folder: Path, urls: Sequence[str], home: Path, shared: bool) -> IO[str] | None:
    """Take the slot folder's lock: exclusive, with this process's pid, ``urls`` and ``home`` written into it, or
    ``shared`` (the nodes of one shared index). ``HomeTaken`` when another proxy holds it in a way that excludes
    this one; ``Untrusted`` as ``hold``; None where nothing can be locked or the lock file cannot be created (a
    folder this user cannot write into, logged)."""
    if fcntl is None:
        return None
    try:
        return _take(folder / SLOTS_LOCK_NAME, SHARED_LINE if shared else
                     f"{os.getpid()} {' '.join(urls)} home={home}\n", shared)
    except Unopenable as exc:  # a folder this user cannot write into: it cannot delete a snapshot there either
        log.warning("%s: serving without the one-proxy-per-slot-folder lock", exc)
        return None
    except _Busy as busy:
        raise HomeTaken(folder, busy.pid, busy.urls, "keeps its slot snapshots in",
                        "give this one a slot folder of its own (--slot-save-path)") from None


def holder(home: Path) -> tuple[str, str] | None:
    """The first URL of the proxy serving from ``home`` now and the nonce it wrote; None when none holds its lock
    or the lock file or its directory are not to be trusted (steps 1, 2 and 5)."""
    path = home / LOCK_NAME
    if fcntl is None:
        return None
    try:
        check_home(home)
        fd = open_lock(path, write=False)
    except (Untrusted, OSError) as exc:
        if path.exists() or path.is_symlink():
            log.warning("not using %s: %s", path, exc)
        return None
    with os.fdopen(fd, "r") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            _, urls, nonce = _holder_line(f)
            url = next((u for u in urls if u.startswith("http")), None)
            return (url, nonce) if url and nonce else None
        except OSError:
            return None
        return None  # free: nobody serves from it


