"""A TCP relay between the proxy and the real llama-server that plays one fault: the base relays every connection
as it is, and a test's subclass decides in ``fault`` what becomes of a request as it begins to arrive.

Every request on a connection is looked at as it begins, not only a connection's first bytes: the proxy's pooled
keep-alive connection carries its own calls first (``/props``, ``/slots``), then the client's request. On loopback
a request's head arrives at the start of a read (the next request is sent after the last answer)."""

from __future__ import annotations

import asyncio
import socket
import struct


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy one direction of a relayed connection until it ends, then close the other side."""
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close the client's side of a connection with an RST, not a FIN: what a process that dies leaves."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultRelay:
    """Listens on a loopback port (``start`` returns it; after a ``close`` it listens on the same one again) and
    relays each connection to ``target_port`` until ``fault`` ends it. ``writers``: the connections open now."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = 0
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def fault(self, data: bytes, writer: asyncio.StreamWriter) -> bool:
        """Called with every read of a connection before it is relayed: True when the fault ended the connection
        (nothing more is relayed on it). The base relays everything."""
        return False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        back: asyncio.Task | None = None
        try:
            while data := await reader.read(65536):
                if await self.fault(data, writer):
                    return
                if up_writer is None:
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
                    back = asyncio.create_task(pipe(up_reader, writer))
                up_writer.write(data)
                await up_writer.drain()
        except (asyncio.CancelledError, ConnectionError, OSError):  # the relay closing at the end of the test
            writer.close()
        finally:
            self.writers.discard(writer)
            if up_writer is not None:
                up_writer.close()
            if back is not None:
                back.cancel()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
