"""The session stages of the pipeline: identity → served history → slot lease → restore → verify.

``SessionStage.on_request`` (chat routes):
1. Seed = upstream model identity + the request's owner (its credential headers, hashed: ``identity``) (+ the
   ``X-PFlash-Session`` name, if given); find the session whose served history is the longest prefix of the
   request, or start one (a request that diverges inside a session's history forks a new session: a session's
   history is linear). Requests of different credentials never share a session record, hence never a served
   history, recall sources or inspector traces; a session id echoed by a client of another credential is ignored.
2. Replace the content of already-served messages by their served versions (byte-identical prefix turn after
   turn); every other field stays the client's own (``served_version``).
3. Lease a slot (queueing in the proxy, never at a busy slot).  If the lease displaced another session whose
   slot content has no current snapshot, save it first.  If this session is not resident but has a snapshot
   for this model identity, restore it; a failed restore deletes the snapshot and falls back to full prefill.
4. Pin the request with ``id_slot`` and add ``X-PFlash-Session/Slot/Cache/Cached-Tokens`` headers. A whole
   (non-streamed) answer's ``Cache``/``Cached-Tokens`` are what llama-server reused (its ``timings.cache_n``,
   ``manager.reported_cache``: a hit or restore that reused far less is a ``miss`` with ``X-PFlash-Cache-Reason``,
   a miss that reused a prefix the slot held a ``hit-prefix``); a stream's headers leave before that is known,
   so they carry the expectation, and the log line and the inspector trace carry the answer.
Under ``--cache-isolation credential``, between 3 and 4, a slot whose content another credential left and that this
request did not restore its own snapshot into is erased first (``sessions/isolation.py``; anonymous and batch
leases too).
With a shared index (``--index redis://``, ``sessions/cluster.py``), between 1 and 3: a session another live node
holds is not leased here: ``req.forward_to`` names that node and the server forwards the client's request there
(``X-PFlash-Via`` on the answer); a request forwarded to this node (``X-PFlash-Forwarded-By``) is always served
here. Otherwise the session's turn lease in the index is taken with the slot's, this node claims the session
(``X-PFlash-Node``; ``X-PFlash-Takeover`` names the node it held before: step 3 then restores the snapshot that
node left in the shared directory, or prefills cold), and ``on_finish`` frees the turn lease.
``SessionCommitStage`` (last in the pipeline, after compression may have changed the newest message) starts
writing the served history to disk as the request is forwarded; the answer's headers wait for the write
(``ProxyRequest.settle``), and so does the lease's release, so the next turn reads it.
``on_response`` compares the server's ``timings.cache_n`` with the table's expectation; ``on_finish`` releases
the lease (a request that went upstream and ended before its response did keeps it until llama-server's slot is
idle: ``SessionManager.release_when_idle``).  Completion routes (no messages) get an anonymous lease so they
never land on a busy slot.  The conversation routes (chat, Anthropic Messages, Responses) all work on the
internal conversation of ``pflash_proxy.dialects``; a name the client's dialect carries in the body
(``metadata.user_id``, ``prompt_cache_key``) names the session when no header does.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import contextlib
from collections.abc import AsyncIterator

from pflash_proxy.contract import (VIA_HEADER, ProxyRequest, RelayResult, SessionsView, Stage,
                                   StageHooks)
from pflash_proxy.sessions.cluster import NODE_HEADER, TAKEOVER_HEADER
from pflash_proxy.sessions.identity import message_hash, namespace_seed
from pflash_proxy.llama.engine import cache_counts
from pflash_proxy.inspector.trace import record_cache
from pflash_proxy.sessions.manager import SessionManager, reported_cache
from pflash_proxy.sessions.slots import Lease
from pflash_proxy.sessions.index import SessionRecord, StoreError

log = logging.getLogger("pflash_proxy.sessions")

SESSION_HEADER = "X-PFlash-Session"
DEGRADED_HEADER = "X-PFlash-Degraded"
CACHE_REASON_HEADER = "X-PFlash-Cache-Reason"  # why a turn that had a snapshot or a slot is a miss after all
# the conversation's name, when the client gives one: ours first, then what agents send on their own
SESSION_HEADERS = (SESSION_HEADER, "X-Claude-Code-Session-Id", "x-session-affinity", "session_id", "session-id")


# a request body below this is looked up in, and its served history written to, the embedded index on the event
# loop (hashing it and a few SQLite reads or one write: well under a millisecond, less than the hop to a worker
# thread and back)
INLINE_LOOKUP_BYTES = 32 * 1024
TURN_KEY = "sessions-turn"  # req.state: the session's turn lease in a shared index (cluster.py)


@dataclass
class SessionContext:
    record: SessionRecord | None
    lease: Lease
    matched: int  # leading messages that continue the served history
    client_hashes: list[str]
    served: list[dict]  # what the upstream receives, message by message
    cache: str  # hit | restored | miss
    expected_cached: int  # tokens the slot should already hold of this prompt
    extra: dict[str, Any] = field(default_factory=dict)


class SessionStage(Stage):
    name = "sessions"

    def __init__(self, manager: SessionManager):
        self.manager = manager
        self._seeds: dict[tuple[str, str | None, str | None], str] = {}  # namespace_seed's answers

    def bind(self, hooks: StageHooks) -> None:
        self.manager.snapshots.on_timing = hooks.on_snapshot_timing  # snapshot timings feed the metrics

    async def start(self) -> None:
        await self.manager.start()

    async def stop(self) -> None:
        await self.manager.stop()

    def sessions_view(self) -> SessionsView:
        return self.manager.view()

    def slot_guard(self, slot_id: int) -> contextlib.AbstractAsyncContextManager[None]:
        """A client's slot action runs under a lease of that very slot, after which the table no longer claims to
        know its content."""
        return self._slot_lease(slot_id)

    @contextlib.asynccontextmanager
    async def _slot_lease(self, slot_id: int) -> AsyncIterator[None]:
        lease = await self.manager.lease_slot(slot_id)
        try:
            yield
        finally:
            self.manager.release_unknown(lease)

    async def on_request(self, req: ProxyRequest) -> None:
        mgr = self.manager
        await mgr.ensure_ready()
        if req.kind == "completion" and is_batch(req.body.get("prompt")):
            await self._whole_server(req)
            return
        if req.kind != "chat":
            await self._anonymous(req)
            return
        # a header, else the name the client's dialect carries in the body (Anthropic metadata.user_id, Responses
        # prompt_cache_key)
        explicit = next((req.headers[h] for h in SESSION_HEADERS if req.headers.get(h)), None) \
            or (req.dialect.session_name(req.body) if req.dialect is not None else None)
        messages = list(req.messages)
        t_wait = time.monotonic()
        req.progress = "waiting for a llama-server slot"
        owner = mgr.owner(req.headers)
        cluster = mgr.cluster
        forwarded_by = req.forwarded_by  # verified by the server (sessions/cluster.py: signed by a node)
        if cluster is not None and req.forward_failed is not None:  # the holder did not answer: take over here
            cluster.peer_failed(req.state.pop("_forward_node", req.forward_failed))
        prefetched = None
        try:
            seed = await self._seed(explicit, owner)
            prefetched = mgr.prefetch_slots(seed)  # a likely hit's /slots check, asked while the lookup runs
            record, matched, hashes, lease = await self._lease_session(seed, explicit, owner, messages, req,
                                                                       forwarded_by)
        except StoreError as exc:  # the index is unreadable: serve this request whole, without a session
            mgr.store_failed("looking up the session", exc)
            req.response_headers[DEGRADED_HEADER] = "session index unavailable; served without a session"
            await self._anonymous(req)
            return
        if lease is None:  # another live node holds the session (its slot is warm): the server forwards the turn
            assert cluster is not None
            req.response_headers[VIA_HEADER] = cluster.node_id
            cluster.counters["forwarded_out"] += 1
            req.log_fields.update({"session": record.id[:8], "forwarded_to": req.forward_to})
            return
        taken_from = None
        if cluster is not None:
            if forwarded_by:
                cluster.counters["forwarded_in"] += 1
            try:
                taken_from = await cluster.claim(record.id)
            except StoreError as exc:
                mgr.store_failed("claiming the session", exc)
            req.response_headers[NODE_HEADER] = cluster.node_id
            if taken_from is not None:
                req.response_headers[TAKEOVER_HEADER] = taken_from
        req.log_fields["queue_ms"] = round((time.monotonic() - t_wait) * 1000, 2)
        served = [served_version(c, s) for c, s in zip(messages[:matched], record.served)] + messages[matched:]
        ctx = SessionContext(record, lease, matched, hashes, served, "miss", 0)
        req.state[self.name] = ctx
        mgr.note_seed(lease, seed)
        served_hashes = _hashes(served, messages, hashes)  # a message served as sent: the lookup's hash
        ctx.extra["hashed"] = (served, served_hashes)  # on_response reuses them for the messages left unchanged
        req.progress = "restoring the session" if not lease.resident else "checking the slot"
        lease.prefetched = prefetched
        ctx.cache, ctx.expected_cached = await mgr.prepare_slot(lease, served_hashes)
        if await mgr.isolation.prepare(lease, owner, replaced=ctx.cache != "miss"):  # --cache-isolation
            req.set_field("cache_prompt", False)
        if taken_from is not None and cluster is not None:  # restored from the shared directory, or cold
            cluster.counters[f"takeover_{ctx.cache}"] += 1
        if served[:matched] != messages[:matched]:
            req.set_messages(served)
        req.set_field("id_slot", lease.slot.id)
        req.response_headers.update({
            "X-PFlash-Session": record.id,
            "X-PFlash-Slot": str(lease.slot.id),
            "X-PFlash-Cache": ctx.cache,
            "X-PFlash-Cached-Tokens": str(ctx.expected_cached),
        })
        if lease.reason is not None:
            req.response_headers[CACHE_REASON_HEADER] = lease.reason
        # a whole answer's headers say what llama-server reused (its cache_n), not what the proxy expected
        req.on_answer.append(lambda answer: self._answer_headers(req, ctx, answer))
        req.log_fields.update({"session": record.id[:8], "slot": lease.slot.id, "cache": ctx.cache})

    async def _seed(self, explicit: str | None, owner: str | None) -> str:
        """The namespace of the lookup: the model identity and the owner, plus the client's session name. A
        client that echoes the proxy's own ``X-PFlash-Session`` value (a session id) continues that session's
        namespace, when the session is its own credential's."""
        mgr = self.manager
        if explicit and len(explicit) == 32 and all(c in "0123456789abcdef" for c in explicit):
            rec = await asyncio.get_running_loop().run_in_executor(None, mgr.store.get, explicit)
            if rec is not None and rec.owner == owner:
                return rec.seed
        key = (mgr.model_identity, explicit, owner)
        seed = self._seeds.get(key)
        if seed is None:
            if len(self._seeds) >= 4096:  # names and credentials are the clients': bounded
                self._seeds.clear()
            seed = self._seeds[key] = namespace_seed(*key)
        return seed

    async def _whole_server(self, req: ProxyRequest) -> None:
        """A batch (``prompt`` holds several prompts) runs one task per prompt on slots llama-server picks, so it
        is not pinned: it leases every slot (in slot order, so two batches never deadlock; sessions displaced
        are saved first) and leaves every slot unknown to the table afterwards."""
        mgr = self.manager
        leases: list[Lease] = []
        try:
            for slot in range(len(mgr.table.slots)):
                leases.append(await mgr.lease_slot(slot))
            owner = mgr.owner(req.headers)
            for lease in leases:  # --cache-isolation: llama-server may run any prompt of the batch on any slot
                if await mgr.isolation.prepare(lease, owner, replaced=False):
                    req.set_field("cache_prompt", False)
        except BaseException:
            for lease in leases:
                mgr.release_unknown(lease)
            raise
        req.state[self.name] = SessionContext(None, leases[0], 0, [], [], "miss", 0, {"batch": leases})
        req.response_headers["X-PFlash-Slot"] = "all"

    async def _anonymous(self, req: ProxyRequest) -> None:
        """A lease of its own for a request without a session (completion routes, an unusable index)."""
        t_wait = time.monotonic()
        req.progress = "waiting for a llama-server slot"
        lease = await self.manager.table.acquire("anon-" + uuid.uuid4().hex)
        req.log_fields["queue_ms"] = round((time.monotonic() - t_wait) * 1000, 2)
        req.state[self.name] = SessionContext(None, lease, 0, [], [], "miss", 0)
        await self.manager.prepare_slot(lease, None)
        if await self.manager.isolation.prepare(lease, self.manager.owner(req.headers), replaced=False):
            req.set_field("cache_prompt", False)
        req.set_field("id_slot", lease.slot.id)
        req.response_headers["X-PFlash-Slot"] = str(lease.slot.id)

    async def _lease_session(self, seed: str, explicit: str | None, owner: str | None, messages: list[dict],
                             req: ProxyRequest | None = None, forwarded_by: str | None = None
                             ) -> tuple[SessionRecord, int, list[str], Lease | None]:
        """Find (or start, or fork) the session and lease its slot, reading its record again under the lease.

        The lease serialises a session's requests, but the first read happens before the wait: a request that
        waited behind another one of the same session would otherwise decide (and later save) on a stale
        record, overwriting the other request's served history and recall sources. So the lookup is repeated
        once the lease is held; when the answer changed (the other request served more), the lease is returned
        and the decision taken again on the fresh record. The second lookup is skipped when no write that can
        change its answer (``save_session``, ``prune``) began or ended since the first one started
        (``SessionStore.write_mark``): it would read what the first one read.

        With several nodes (``sessions/cluster.py``): a session that another live node holds is not leased here
        (the lease is None and ``req.forward_to`` names that node); otherwise the session's turn lease in the
        shared index is taken with the slot's (``req.state[TURN_KEY]``, freed in ``on_finish``) before the record
        is read again, so a turn another node ran meanwhile is seen too (the shared index never vouches that
        nothing changed: ``RedisIndex.unchanged_since``).
        """
        mgr = self.manager
        cluster = mgr.cluster
        loop = asyncio.get_running_loop()

        # the embedded index only: a shared one (Redis) answers over the network
        inline = cluster is None and req is not None and len(req.raw_body) < INLINE_LOOKUP_BYTES

        async def lookup() -> Any:  # hashing a long history and SQLite reads: off the event loop
            if inline:  # a short history costs less than the hop to a worker thread and back
                return mgr.store.lookup(seed, messages)
            return await loop.run_in_executor(None, mgr.store.lookup, seed, messages)
        for attempt in range(9):
            mark = mgr.store.write_mark()
            found, matched, hashes = await lookup()
            key = _lookup_key(found, matched)
            if found is not None and found.owner != owner:  # a seed is never shared across owners: belt and braces
                found, matched = None, 0
            if found is None:
                record = mgr.store.new_session(seed, explicit is not None, owner=owner)
            elif matched < len(found.served):
                log.info("request diverges from session %s at message %d; forking", found.id[:8], matched)
                record = mgr.store.new_session(seed, explicit is not None, parent=found, upto=matched, owner=owner)
            else:
                record = found
            if cluster is not None and req is not None and record is found and req.forward_failed is None:
                target = await cluster.place(record.id, forwarded_by)
                if target is not None:
                    req.state["_forward_node"], req.forward_to = target
                    return record, matched, hashes, None
            lease = await mgr.table.acquire(record.id)
            try:
                if cluster is not None and req is not None:
                    req.state[TURN_KEY] = await cluster.begin_turn(record.id)
                if mgr.store.unchanged_since(mark):
                    return record, matched, hashes, lease
                again, matched2, _ = await lookup()
            except BaseException:
                await self._end_turn(req)
                mgr.table.release(lease)
                raise
            if _lookup_key(again, matched2) == key or attempt == 8:
                return record, matched, hashes, lease
            await self._end_turn(req)
            mgr.table.release(lease)  # another request of this session saved meanwhile: decide again
        raise AssertionError("unreachable")

    async def _end_turn(self, req: ProxyRequest | None) -> None:
        turn = req.state.pop(TURN_KEY, None) if req is not None else None
        if turn is not None and self.manager.cluster is not None:
            await self.manager.cluster.end_turn(turn)

    async def on_response(self, req: ProxyRequest, result: RelayResult) -> None:
        ctx: SessionContext | None = req.state.get(self.name)
        if ctx is None or "batch" in ctx.extra:
            return
        ctx.extra["settled"] = result.completed and not result.client_gone
        served_hashes = _hashes(ctx.served, *ctx.extra.get("hashed", ([], [])))
        cache_n = self.manager.observe(ctx.lease, ctx.cache, ctx.expected_cached, served_hashes, result)
        if cache_n is None:
            return
        reported, reason = reported_cache(ctx.cache, ctx.expected_cached, cache_n)
        req.log_fields.update({"cache": reported, "cached_tokens": cache_n})
        if reported == "hit-prefix":
            self.manager.counters["prefix_hits"] += 1
        if reported == ctx.cache or ctx.record is None:
            return
        req.log_fields["cache_announced"] = ctx.cache
        log.log(logging.INFO if reported == "hit-prefix" else logging.WARNING,
                "session %s: announced %s (~%d tokens expected from cache), llama-server reused %d: reported %s",
                ctx.record.id[:8], ctx.cache, ctx.expected_cached, cache_n, reported)
        record_cache(ctx.record, len(ctx.served) - 1, ctx.cache, reported, ctx.expected_cached, cache_n, reason)
        try:  # the inspector shows it; the lease is still held, so the next turn reads this record
            await asyncio.get_running_loop().run_in_executor(None, self.manager.store.update_record, ctx.record)
        except StoreError as exc:
            self.manager.store_failed("recording a cache trace", exc)

    def _answer_headers(self, req: ProxyRequest, ctx: SessionContext, answer: dict[str, Any] | None) -> None:
        """``X-PFlash-Cache`` / ``-Cached-Tokens`` of a whole answer from its own ``timings.cache_n``."""
        counts = cache_counts(answer)
        if counts is None:
            return
        reported, reason = reported_cache(ctx.cache, ctx.expected_cached, counts["cache_n"])
        req.response_headers["X-PFlash-Cache"] = reported
        req.response_headers["X-PFlash-Cached-Tokens"] = str(counts["cache_n"])
        if reason is not None:
            req.response_headers[CACHE_REASON_HEADER] = reason

    async def on_finish(self, req: ProxyRequest) -> None:
        await self._end_turn(req)
        ctx: SessionContext | None = req.state.get(self.name)
        if ctx is None:
            return
        if "batch" in ctx.extra:
            for lease in ctx.extra["batch"]:
                self.manager.release_unknown(lease)
            return
        if ctx.extra.get("forwarded") and not ctx.extra.get("settled"):  # the client left, or the upstream broke
            self.manager.release_when_idle(ctx.lease)
        else:
            self.manager.table.release(ctx.lease)
        if ctx.record is not None and self.manager.settings.save_every_turn:
            self.manager.save_in_background(ctx.record.id)

    async def save_all(self) -> int:
        return await self.manager.save_all_resident()

    def stats(self) -> dict[str, Any]:
        return self.manager.stats()


def is_batch(prompt: Any) -> bool:
    """llama-server's rule: a list holding strings or token lists is several prompts (a flat token list is one)."""
    return isinstance(prompt, list) and len(prompt) > 1 and any(isinstance(p, (str, list, dict)) for p in prompt)


def served_version(client: dict, stored: dict) -> dict:
    """The client's message with only what the proxy rewrote (its content) taken from the served history.

    Identity hashes role, content, tool calls, tool id and name; any other field (``reasoning_content``,
    provider extras) comes from this client, never from whichever client first served the same visible history.
    """
    if client == stored or stored.get("content") == client.get("content"):
        return client
    return {**client, "content": stored.get("content")}


def _hashes(messages: list[dict], before: list[dict], hashes: list[str]) -> list[str]:
    """``message_hash`` of each message, taken from ``hashes`` where the message equals the one at its position
    in ``before`` (the served history hashed before compression, most of which compression leaves alone)."""
    return [hashes[i] if i < len(before) and (m is before[i] or m == before[i]) else message_hash(m)
            for i, m in enumerate(messages)]


async def _write_inline(store: Any, *args: Any) -> None:
    """``store.save_session(*args)`` on the loop, unless a write of this process (a long history's save, a
    prune) is running: SQLite would make the loop wait for its lock, so that one waits in a worker thread."""
    if store.write_mark() is None:
        await asyncio.get_running_loop().run_in_executor(None, store.save_session, *args)
    else:
        store.save_session(*args)


def _lookup_key(rec: SessionRecord | None, matched: int) -> tuple[str, int, int, int]:
    """What a lookup decided on: the session, how much of the request it covers, its length and turn count."""
    return ("", 0, 0, 0) if rec is None else (rec.id, matched, len(rec.served), rec.turns)


class SessionCommitStage(Stage):
    """Persist the served history (after every stage that may change it): the write starts before the request is
    forwarded and runs beside it; the answer's headers, and the lease's release, wait for it."""

    name = "sessions-commit"

    def __init__(self, manager: SessionManager):
        self.manager = manager

    async def on_request(self, req: ProxyRequest) -> None:
        ctx: SessionContext | None = req.state.get(SessionStage.name)
        if ctx is not None:
            ctx.extra["forwarded"] = True  # the last stage: the request goes upstream next
        if ctx is None or ctx.record is None:
            return
        ctx.served = list(req.messages)
        # the write runs while the upstream works; the answer's headers wait for it (``settle``). A short history
        # in the embedded index is written on the loop, in a task that starts once the handler waits for the
        # upstream (the request has left by then): less than the hop to a worker thread and back
        store = self.manager.store
        write: asyncio.Future[None]
        if self.manager.cluster is None and len(req.raw_body) < INLINE_LOOKUP_BYTES:
            write = asyncio.ensure_future(_write_inline(store, ctx.record, ctx.client_hashes, ctx.served))
        else:
            write = asyncio.get_running_loop().run_in_executor(
                None, store.save_session, ctx.record, ctx.client_hashes, ctx.served)
        req.beside_upstream.append(self._committed(req, write))

    async def _committed(self, req: ProxyRequest, write: asyncio.Future[None]) -> None:
        try:
            await write
        except StoreError as exc:  # disk full, damaged index: the request is served, the history not kept
            self.manager.store_failed("saving the served history", exc)
            req.response_headers[DEGRADED_HEADER] = "session index unavailable; this turn was not saved"
        else:
            self.manager.store_ok()
            self.manager.note_write()
