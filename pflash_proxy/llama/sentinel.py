"""``Sentinel``: one kept-alive connection that tells the proxy its llama-server process is still the same one.

A TCP connection cannot outlive the process that accepted it. While the sentinel's connection stays open, the
llama-server that answered the proxy's last request on a slot is still running, so the slot still holds what the
slot table says (``--no-cache-idle-slots``), and the per-turn ``GET /slots`` check of ``UpstreamWatch.slot_lost``
can be skipped: the check then costs a turn nothing.

1. Only a plain-HTTP upstream on a loopback address is watched this way: an intermediary in front of llama-server
   (a TLS terminator, a balancer) keeps its own connections open across a restart behind it, so for any other
   upstream ``address`` is None, nothing is held, and every hit is checked with ``/slots`` as before. (An intermediary on the same
   host is not told apart: a restart it hides costs one turn a full prefill, which ``cache_n`` then shows.)
2. Connect and send ``GET /health`` every ``POLL_S`` (below cpp-httplib's 5 s keep-alive timeout, so the server
   keeps the connection), reading each answer whole; between polls, wait on the socket, so an EOF or a reset (the
   process exited) is seen at once.
3. ``epoch`` counts breaks: it grows when the open connection is lost (EOF, reset, a failed or non-200 poll) and
   while no connection is open ``alive`` is False; the next connection is tried ``POLL_S`` later (a server that
   ends every connection, an HTTP/1.0 one, is never held and never reconnected to in a loop).
4. cpp-httplib ends a connection after 100 requests (``CPPHTTPLIB_KEEPALIVE_MAX_COUNT``): after ``ROTATE_AFTER``
   polls the next connection is opened and answers a poll *while the current one is still open*, then the old one
   is closed; one process answered on both (llama-server listens with ``SO_REUSEPORT`` only when started with
   ``--reuse-port``), so the epoch does not change.
5. A caller records the epoch when it learns a slot's content (``current()``) and trusts it later only if
   ``vouches(epoch)``: alive, and no break since.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

log = logging.getLogger("pflash_proxy.llama.sentinel")

POLL_S = 2.0
ROTATE_AFTER = 40
_TIMEOUT_S = 5.0


def loopback_http(base_url: str) -> tuple[str, int] | None:
    """(host, port) of a plain-HTTP upstream on a loopback address, else None (step 1)."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    host = parts.hostname
    if host != "localhost":
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            return None
    return host, parts.port or 80


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes):
        self.reader, self.writer, self.request, self.polls = reader, writer, request, 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass(frozen=True)
class SentinelStats:
    """The sentinel's connection: open now, its epoch, connections lost (restarts, keep-alive ends not caught by
    rotation) and rotations."""

    alive: bool
    epoch: int
    breaks: int
    rotations: int

    def as_json(self) -> dict[str, object]:
        return asdict(self)


class Sentinel:
    def __init__(self, base_url: Callable[[], str], headers: dict[str, str] | None = None):
        self._base_url = base_url  # read at each connection: a spawned server's address is known only once started
        self._headers = headers or {}
        self.epoch = 0
        self._conn: _Conn | None = None
        self._task: asyncio.Task[None] | None = None
        self.breaks = 0  # connections lost (restarts, keep-alive ends not caught by rotation)
        self.rotations = 0

    @property
    def address(self) -> tuple[str, int] | None:
        return loopback_http(self._base_url())

    @property
    def alive(self) -> bool:
        return self._conn is not None

    def current(self) -> int | None:
        """The epoch to record beside what was just learnt of a slot; None when nothing vouches for it now."""
        return self.epoch if self._conn is not None else None

    def vouches(self, epoch: int | None) -> bool:
        """Step 5: the process that served ``epoch`` is still the one behind the open connection."""
        return epoch is not None and self._conn is not None and epoch == self.epoch

    def stats(self) -> SentinelStats:
        return SentinelStats(self.alive, self.epoch, self.breaks, self.rotations)

    def end_epoch(self) -> None:
        """What was learnt so far is not vouched for any more (the proxy learnt the server's state was lost)."""
        self.epoch += 1

    def _health_request(self, address: tuple[str, int]) -> bytes:
        lines = ["GET /health HTTP/1.1", f"Host: {address[0]}:{address[1]}", "Connection: keep-alive"]
        lines += [f"{k}: {v}" for k, v in self._headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="upstream-sentinel")

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._lose(None)

    async def stop(self) -> None:
        """``cancel``, then wait for the task to end."""
        task = self._task
        self.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _lose(self, why: str | None) -> None:
        if self._conn is None:
            return
        self._conn.close()
        self._conn = None
        self.epoch += 1
        if why is not None:
            self.breaks += 1
            # info once: an upstream that ends every connection (not llama-server) would log every POLL_S
            (log.info if self.breaks == 1 else log.debug)(
                "llama-server connection lost (%s): the next hit on each slot is checked with /slots", why)

    async def _connect(self) -> _Conn | None:
        address = self.address
        if address is None:
            return None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), _TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            return None
        conn = _Conn(reader, writer, self._health_request(address))
        if not await self._poll(conn):
            conn.close()
            return None
        return conn

    async def _poll(self, conn: _Conn) -> bool:
        """One ``GET /health`` on ``conn``, its answer read whole; False on anything but a kept-alive 200."""
        try:
            conn.writer.write(conn.request)
            await conn.writer.drain()
            head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), _TIMEOUT_S)
            status_line, *fields = head.decode("latin-1").split("\r\n")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or parts[1] != "200" or parts[0] != "HTTP/1.1":
                return False  # an HTTP/1.0 server closes after each answer: nothing to hold
            length, close = 0, False
            for f in fields:
                name, _, value = f.partition(":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection" and value == "close":
                    close = True
                elif name == "transfer-encoding":
                    return False  # /health answers with a length; anything else is not llama-server's
            if length:
                await asyncio.wait_for(conn.reader.readexactly(length), _TIMEOUT_S)
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return False
        conn.polls += 1
        return not close

    async def _run(self) -> None:
        while True:
            if self._conn is None:
                conn = await self._connect()  # None too while the upstream is not a loopback one (step 1)
                if conn is None:
                    await asyncio.sleep(POLL_S)
                    continue
                self._conn = conn  # a new connection: a new epoch began when the last one was lost
                continue
            conn = self._conn
            try:  # step 2: between polls, an EOF or a reset ends the wait at once
                data = await asyncio.wait_for(conn.reader.read(1), POLL_S)
            except asyncio.TimeoutError:
                data = None
            except OSError:
                data = b""
            if data is not None:  # EOF (b""), or bytes nobody asked for: the connection is not trusted any more
                self._lose("closed by the server" if data == b"" else "unexpected bytes")
                await asyncio.sleep(POLL_S)  # never a reconnect loop against a server that keeps closing
                continue
            if conn.polls >= ROTATE_AFTER:  # step 4: the next connection answers while this one is still open
                nxt = await self._connect()
                if nxt is not None and self._conn is conn and not conn.reader.at_eof():
                    self._conn = nxt
                    conn.close()
                    self.rotations += 1
                    continue
                if nxt is not None:
                    nxt.close()
            if not await self._poll(conn):
                self._lose("a health poll failed")
                await asyncio.sleep(POLL_S)
