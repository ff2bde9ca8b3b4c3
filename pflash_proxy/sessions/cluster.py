"""``ClusterNode``: this proxy as one node of several that share a ``ClusterIndex`` (``--index redis://``).

Nodes run the same model and slot layout and share the snapshot directory (``--slot-save-path``); a load balancer
spreads requests over them (``configs/``). Per node:

1. Heartbeat: at start and every ``--heartbeat-s`` the node writes its advertised URL under its id, expiring after
   three periods (``HEARTBEAT_PERIODS``); the same loop reads the list of live nodes. A node that stops cleanly
   removes its heartbeat after its resident sessions were saved.
2. ``place(sid, forwarded_by)``: where a turn of a known session runs. The index names no holder, or this node →
   here. Another node whose heartbeat lasts, and the request was not itself forwarded → that node's URL: the server
   sends the client's request there untouched (``ProxyRequest.forward.to``), where the session's slot is warm.
   A holder whose heartbeat expired, or that could not be reached (``peer_failed``: it is then passed over until
   its heartbeat would have expired) → here: a takeover.
3. ``begin_turn(sid)``: the session's turn lease in the index (``SET NX PX``, expiring after three heartbeat
   periods, renewed every period while the turn runs, freed by compare-and-delete at its end), so a session's
   turn runs on one node at a time even while two nodes disagree about its holder; a lease held by another node
   is waited for (polled) up to ``--queue-timeout-s``. Then ``claim``: this node becomes the holder
   (compare-and-set on the holder it saw); a previous holder that was another node makes the turn a takeover,
   served from the session's last snapshot in the shared directory (checksum-verified, ``snapshots.py``) or by a
   cold prefill.
4. Membership: the index is data anyone with write access to Redis can change, so a URL read from it is
   trusted only as far as the node's own configuration vouches for it. With ``--cluster-secret`` a heartbeat is
   ``<url> sig=<HMAC-SHA256(secret, node, url)>`` and only one that verifies counts as a live node; with
   ``--cluster-peers`` the URL must also be one of those. A holder whose URL fails either is taken over here,
   and a node with neither setting never forwards (the client's request, ``Authorization`` included, only ever
   goes to a node the configuration names or the secret vouches for).
5. The forwarding header: ``X-PFlash-Forwarded-By: <node>;<unix time>;<HMAC(secret, node, time, method, path,
   sha256(body))>``, honoured (served here, never forwarded again) only when it verifies and is at most
   ``FORWARD_WINDOW_S`` old; anything else a client sends under that name is ignored and never passed on.
Index calls block (Redis round trips): they run in the executor.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
import uuid
from dataclasses import dataclass
from collections.abc import Callable
from typing import TypeVar

from pflash_proxy.config import ClusterOptions
from pflash_proxy.errors import QueueTimeout
from pflash_proxy.sessions.index import ClusterIndex, StoreError, run
from pflash_proxy.sessions.stats import ClusterStats

T = TypeVar("T")

log = logging.getLogger("pflash_proxy.cluster")

HEARTBEAT_PERIODS = 3  # a heartbeat (and a turn lease) expires this many periods after it was last renewed
TURN_POLL_S = 0.05
FORWARD_WINDOW_S = 60  # a signed forwarded turn is honoured this long after (or, for clock skew, before) its time


def _mac(secret: str, *parts: str) -> str:
    msg = "\x00".join(parts).encode("utf-8", "surrogatepass")
    return hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def sign_heartbeat(secret: str | None, node: str, url: str) -> str:
    """What a node writes as its heartbeat: its URL, signed when the nodes share a secret (module docstring, 4)."""
    return f"{url} sig={_mac(secret, 'node', node, url)}" if secret else url


def heartbeat_url(secret: str | None, node: str, value: str) -> str | None:
    """The URL in a heartbeat value, or None when the nodes share a secret and its signature does not verify."""
    if not secret:
        return value.split(" sig=", 1)[0]
    url, sep, sig = value.partition(" sig=")
    return url if sep and hmac.compare_digest(sig, _mac(secret, "node", node, url)) else None


def sign_forward(secret: str, node: str, method: str, path_qs: str, body: bytes, now: float) -> str:
    """The ``X-PFlash-Forwarded-By`` value of a turn ``node`` forwards (module docstring, 5)."""
    ts = str(int(now))
    return f"{node};{ts};{_mac(secret, 'fwd', node, ts, method, path_qs, hashlib.sha256(body).hexdigest())}"


def verify_forward(secret: str | None, values: list[str], method: str, path_qs: str, body: bytes,
                   now: float) -> str | None:
    """The node that forwarded this request, when its one ``X-PFlash-Forwarded-By`` verifies; else None."""
    if not secret or len(values) != 1:
        return None
    node, ts, sig = (values[0].split(";") + ["", ""])[:3] if values[0].count(";") == 2 else ("", "", "")
    if not node or not ts.isdigit() or abs(now - int(ts)) > FORWARD_WINDOW_S:
        return None
    want = _mac(secret, "fwd", node, ts, method, path_qs, hashlib.sha256(body).hexdigest())
    return node if hmac.compare_digest(sig, want) else None


@dataclass
class TurnLease:
    sid: str
    token: str
    renew: asyncio.Task[None] | None = None


class ClusterNode:
    """This node among those sharing ``index``, given the cluster settings group, its own name and URL
    (``Settings.effective_node_id``/``effective_advertise_url``) and how long a slot is waited for
    (``--queue-timeout-s``: a turn lease is waited for as long)."""

    def __init__(self, cluster: ClusterOptions, index: ClusterIndex, *, node_id: str, url: str,
                 queue_timeout_s: float):
        self.queue_timeout_s = queue_timeout_s
        self.index = index
        self.node_id = node_id
        self.url = url
        self.secret = cluster.cluster_secret
        self.peers = {u.rstrip("/") for u in cluster.cluster_peers}
        self.period = cluster.heartbeat_s
        self.ttl_ms = int(cluster.heartbeat_s * HEARTBEAT_PERIODS * 1000)
        self.tag = re.sub(r"[^A-Za-z0-9]", "_", self.node_id)[:40]  # this node's temporary snapshot names
        self.live: dict[str, str] = {}  # the nodes whose heartbeat lasted at the last beat
        self._suspect: dict[str, float] = {}  # node -> monotonic time until which it is passed over
        self._beat: asyncio.Task[None] | None = None
        self.counters = {"forwarded_out": 0, "forwarded_in": 0, "forward_failures": 0, "takeovers": 0,
                         "takeover_hit": 0, "takeover_restored": 0, "takeover_miss": 0, "turn_waits": 0,
                         "heartbeat_failures": 0, "foreign_holders": 0}
        self._foreign_logged: set[str] = set()

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await run(self.index, fn, *args)

    # 1. Heartbeat -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self._run(self.index.heartbeat, self.node_id, sign_heartbeat(self.secret, self.node_id, self.url),
                        self.ttl_ms)
        self.live = self._members(await self._run(self.index.nodes))
        self._beat = asyncio.create_task(self._beat_loop())
        log.info("node %s (%s) joined the shared index %s; %d node(s) alive", self.node_id, self.url,
                 self.index.describe(), len(self.live))
        if not self.secret and not self.peers:
            log.warning("neither --cluster-secret nor --cluster-peers is set: this node never forwards a turn "
                        "(a URL in the shared index is not trusted); it serves every turn it receives, taking "
                        "sessions over from the node that held them")

    def member_url(self, node: str, value: str | None) -> str | None:
        """The URL of ``node`` from its heartbeat ``value`` when the configuration vouches for it (module
        docstring, 4): signed with the shared secret, and one of ``--cluster-peers`` when those are given."""
        if value is None or (not self.secret and not self.peers):
            return None
        url = heartbeat_url(self.secret, node, value)
        if url is None or (self.peers and url.rstrip("/") not in self.peers):
            return None
        return url

    def _members(self, nodes: dict[str, str]) -> dict[str, str]:
        """The live nodes the configuration vouches for (all of them, for the listing, when it vouches for none:
        then none is forwarded to)."""
        if not self.secret and not self.peers:
            return {n: heartbeat_url(None, n, v) or "" for n, v in nodes.items()}
        members = {n: u for n, v in nodes.items() if (u := self.member_url(n, v)) is not None}
        if self.node_id in nodes:
            members[self.node_id] = self.url
        return members

    async def stop(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
        try:
            await self._run(self.index.leave, self.node_id)
        except StoreError as exc:
            log.warning("could not remove node %s's heartbeat: %s", self.node_id, exc)

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self._run(self.index.heartbeat, self.node_id,
                                sign_heartbeat(self.secret, self.node_id, self.url), self.ttl_ms)
                self.live = self._members(await self._run(self.index.nodes))
            except StoreError as exc:
                self.counters["heartbeat_failures"] += 1
                log.warning("heartbeat of node %s failed: %s", self.node_id, exc)

    # 2. Placement -------------------------------------------------------------------------------------------
    async def place(self, sid: str, forwarded_by: str | None) -> tuple[str, str] | None:
        """(node, URL) of the live node that holds ``sid``, or None to serve the turn here (module docstring, 2);
        a turn placed elsewhere counts as forwarded (``peer_failed`` takes it back)."""
        if forwarded_by:
            return None
        holder = await self._run(self.index.holder, sid)
        if holder is None or holder == self.node_id:
            return None
        if self._suspect.get(holder, 0.0) > time.monotonic():
            return None
        value: str | None = await self._run(self.index.node_url, holder)
        url = self.member_url(holder, value)
        if url is None and value is not None and (self.secret or self.peers):
            self.counters["foreign_holders"] += 1
            if holder not in self._foreign_logged:  # once per node name: a Redis writer could vary it endlessly
                if len(self._foreign_logged) < 100:
                    self._foreign_logged.add(holder)
                log.warning("the shared index names node %r at a URL this node's configuration does not vouch for "
                            "(--cluster-secret/--cluster-peers); its sessions are served here", holder[:80])
        if url is None or url.rstrip("/") == self.url:
            return None
        self.counters["forwarded_out"] += 1
        return holder, url

    def peer_failed(self, node: str) -> None:
        """A forward to ``node`` found no one there: it is passed over until its heartbeat would have expired."""
        self.counters["forward_failures"] += 1
        self.counters["forwarded_out"] -= 1  # counted when the forward was decided; it did not happen
        self._suspect[node] = time.monotonic() + self.ttl_ms / 1000
        log.warning("node %s did not take a forwarded turn; its sessions are taken over here", node)

    # 3. Turns -----------------------------------------------------------------------------------------------
    async def begin_turn(self, sid: str) -> TurnLease:
        """Hold the session's turn lease (waiting while another node holds it), renewed until ``end_turn``."""
        token = f"{self.node_id}/{uuid.uuid4().hex[:12]}"
        timeout = self.queue_timeout_s or float("inf")
        deadline = time.monotonic() + timeout
        waited = False
        while not await self._run(self.index.acquire_turn, sid, token, self.ttl_ms):
            if not waited:
                waited = True
                self.counters["turn_waits"] += 1
            if time.monotonic() > deadline:
                raise QueueTimeout(f"session {sid[:8]}'s turn is held by another node; retry later", retry_after=2)
            await asyncio.sleep(TURN_POLL_S)
        turn = TurnLease(sid, token)
        turn.renew = asyncio.create_task(self._renew(turn))
        return turn

    async def _renew(self, turn: TurnLease) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                if not await self._run(self.index.renew_turn, turn.sid, turn.token, self.ttl_ms):
                    log.warning("session %s's turn lease was lost (expired)", turn.sid[:8])
                    return
            except StoreError as exc:
                log.warning("could not renew session %s's turn lease: %s", turn.sid[:8], exc)

    async def end_turn(self, turn: TurnLease) -> None:
        if turn.renew is not None:
            turn.renew.cancel()
        try:
            await self._run(self.index.release_turn, turn.sid, turn.token)
        except StoreError as exc:  # it expires by itself
            log.warning("could not release session %s's turn lease: %s", turn.sid[:8], exc)

    async def claim(self, sid: str, forwarded_by: str | None = None) -> str | None:
        """Make this node the session's holder; returns the node it was taken over from (None: no takeover).
        ``forwarded_by``: the node that forwarded this turn here (counted)."""
        if forwarded_by:
            self.counters["forwarded_in"] += 1
        seen = await self._run(self.index.holder, sid)
        if seen == self.node_id:
            return None
        await self._run(self.index.claim, sid, self.node_id, seen)
        if seen is None:
            return None
        self.counters["takeovers"] += 1
        log.info("session %s taken over from node %s", sid[:8], seen)
        return seen

    def note_takeover(self, cache: str) -> None:
        """A turn taken over here was served as ``cache`` (``hit``/``restored``/``miss``)."""
        self.counters[f"takeover_{cache}"] += 1

    def stats(self) -> ClusterStats:
        return ClusterStats(node=self.node_id, url=self.url, index=self.index.describe(), nodes_alive=len(self.live),
                            nodes=dict(self.live), **self.counters)
