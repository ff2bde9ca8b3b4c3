"""Request bodies in memory, bounded: ``--max-pending-mb`` across every request being handled.

A request's body is read whole before it waits for a slot (its messages say which session, hence which slot,
it waits for), so the bytes held grow with the queue: 256 waiting requests of 64 MB would be 16 GB. The budget
counts the bytes of every body from the moment it is read (a chunked upload: chunk by chunk) until its request
ends; a body that would go beyond it gets 429 ``queue_full`` with ``Retry-After`` at once, before it is read
(or as soon as a chunked upload crosses the bound). One request is always admitted, so a single body within
``--max-body-mb`` never fails for this reason.
"""

from __future__ import annotations

from pflash_proxy.errors import QueueFull

RETRY_AFTER_S = 2


class BodyBudget:
    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.used = 0
        self.refused = 0

    def reserve(self, n: int, held: int = 0) -> None:
        """Count ``n`` more bytes for a request already holding ``held``; QueueFull beyond the bound."""
        if self.limit and self.used - held > 0 and self.used + n > self.limit:
            self.refused += 1
            raise QueueFull(f"request bodies waiting in the proxy already hold {self.used:,} bytes "
                            f"(--max-pending-mb is {self.limit / 2**20:g}); retry later", retry_after=RETRY_AFTER_S)
        self.used += n

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)
