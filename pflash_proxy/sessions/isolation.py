"""Cache isolation between credentials (``--cache-isolation credential|shared``).

llama-server keeps a slot's KV after a request, and the next request on that slot reuses the longest common token
prefix, reporting how much (the answer's cache report, and the time itself). A slot that one
credential's session leaves would thus tell another credential's request how far its guess matches the other's
last prompt. Under ``credential`` (the default) the proxy prevents it:

1. Every slot records whose content it holds (``Slot.owner``): the owner key of the last request prepared on it
   (``identity.credential``, or ``NO_CREDENTIAL`` for a request that sends none); ``UNKNOWN_OWNER`` for content
   the proxy did not put there: before this process's first use of the slot (llama-server keeps its slots
   across a restart of the proxy, so they may hold what another credential sent the proxy's previous run),
   after a restart of llama-server the proxy noticed (``SlotTable.mark_all_empty``: a slot whose content the
   proxy lost track of may still hold it), after a client's slot action.
2. Isolation between owners this process served is in force as soon as it has seen two of them (one user of a
   server pays nothing); content of an unknown owner is erased whatever this process has seen (step 3).
3. A request prepared on a slot whose content is another owner's (isolation in force) or unknown, and that did
   not replace the content with its own snapshot (a ``miss``, an anonymous or batch request), gets the slot
   erased first (``Slots.erase``): it starts empty. So the first request after a restart of the proxy reads
   nothing another credential left, at the cost of one erase per slot. When the erase fails (llama-server
   without ``--slot-save-path``: 501), the request is sent with ``cache_prompt: false`` instead, so it reuses
   nothing either.
4. A ``hit`` is the session's own content; a ``restored`` slot holds the session's own snapshot, which replaced
   the slot's content in whole; neither is erased.

Under ``shared`` the slots' content is reused across credentials as llama-server does on its own.
llama-server's host-RAM prompt cache (``--cache-ram``) is not the proxy's: it is shared by every request, so the
proxy keeps it off for the requests it pins (``-sps 0``: a pinned request never loads from it).
"""

from __future__ import annotations

import logging

from pflash_proxy.engine import EngineError, Slots
from pflash_proxy.sessions.slots import NO_CREDENTIAL, UNKNOWN_OWNER, Lease

log = logging.getLogger("pflash_proxy.sessions")


class CacheIsolation:
    def __init__(self, mode: str, slots: Slots):
        self.mode = mode
        self.slots = slots
        self._owners: set[str] = set()  # owners seen, up to two (all that decides whether isolation is in force)
        # erases (those of unknown content among them) and requests sent cold because an erase failed
        self.counters = {"isolation_erases": 0, "isolation_erases_unknown": 0, "isolation_cold": 0}

    @property
    def active(self) -> bool:
        return self.mode == "credential" and len(self._owners) >= 2

    async def prepare(self, lease: Lease, owner: str | None, replaced: bool) -> bool:
        """Make ``lease``'s slot fit for ``owner``'s request; ``replaced``: the slot now holds that request's own
        content (a hit, a restored snapshot). True when the request must be sent with ``cache_prompt: false``
        (the slot could not be erased)."""
        key = owner if owner is not None else NO_CREDENTIAL
        if len(self._owners) < 2:
            self._owners.add(key)
        slot = lease.slot
        previous, slot.owner = slot.owner, key
        unknown = previous == UNKNOWN_OWNER
        if replaced or self.mode != "credential" or previous is None or previous == key:
            return False
        if not (self.active or unknown):
            return False
        try:
            await self.slots.erase(slot.id)
        except EngineError as exc:
            self.counters["isolation_cold"] += 1
            log.warning("could not erase slot %d before another credential's request (%s); sent with "
                        "cache_prompt: false", slot.id, exc)
            return True
        self.counters["isolation_erases"] += 1
        self.counters["isolation_erases_unknown"] += int(unknown)
        slot.tokens = slot.prompt_tokens = 0
        slot.served_hashes = []
        return False
