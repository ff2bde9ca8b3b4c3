"""What a node trusts of the shared index and of a forwarding header (``sessions/cluster.py``, steps 4 and 5), as
plain functions (the node in front of real Redis and llama-server: ``test_cluster_node_real.py``).

1. A heartbeat URL counts only when the configuration vouches for it: signed with the shared secret, and one of
   ``--cluster-peers`` when those are given; with neither, no URL from the index is ever forwarded to.
2. ``X-PFlash-Forwarded-By`` verifies only as one header, signed with the secret over node, time, method, path and
   body, and at most ``FORWARD_WINDOW_S`` old (or ahead).
3. A client's header of that name never reaches llama-server or another node (``forwardable_headers``).
"""

from __future__ import annotations

import time

import pytest
from multidict import CIMultiDict

from pflash_proxy.config import ConfigError, load_settings
from pflash_proxy.llama.upstream import forwardable_headers
from pflash_proxy.sessions.cluster import (FORWARD_WINDOW_S, ClusterNode, heartbeat_url, sign_forward,
                                           sign_heartbeat, verify_forward)
from tests.conftest import make_settings

SECRET = "s" * 32


class NoIndex:
    def describe(self) -> str:
        return "nowhere"


def node(tmp_path, **kw) -> ClusterNode:
    settings = make_settings("http://127.0.0.1:9", tmp_path, index="redis://127.0.0.1:1/0", node_id="me", **kw)
    return ClusterNode(settings.cluster, NoIndex(), node_id=settings.effective_node_id,  # type: ignore[arg-type]
                       url=settings.effective_advertise_url, queue_timeout_s=settings.limits.queue_timeout_s)


def test_heartbeats_count_only_as_far_as_the_configuration_vouches(tmp_path):
    a, planted = "http://10.0.0.11:8090", "http://evil.example:80"
    signed = node(tmp_path, cluster_secret=SECRET)
    assert signed.member_url("n1", sign_heartbeat(SECRET, "n1", a)) == a
    assert signed.member_url("n1", a) is None and signed.member_url("n1", f"{a} sig={'0' * 64}") is None
    assert signed.member_url("n2", sign_heartbeat(SECRET, "n1", a)) is None  # signed for another node
    assert signed.member_url("n1", sign_heartbeat("t" * 32, "n1", a)) is None
    assert signed.member_url("n1", sign_heartbeat(SECRET, "n1", a).replace("10.0.0.11", "10.0.0.12")) is None
    listed = node(tmp_path, cluster_peers=[a + "/"])
    assert listed.member_url("n1", a) == a and listed.member_url("n1", planted) is None
    both = node(tmp_path, cluster_secret=SECRET, cluster_peers=[a])
    assert both.member_url("n1", sign_heartbeat(SECRET, "n1", a)) == a
    assert both.member_url("n1", sign_heartbeat(SECRET, "n1", planted)) is None  # signed, but not a peer
    neither = node(tmp_path)
    assert neither.member_url("n1", a) is None and neither.member_url("n1", None) is None
    assert heartbeat_url(None, "n1", sign_heartbeat(SECRET, "n1", a)) == a  # listings show the URL alone


def test_a_forwarding_mark_verifies_only_as_signed_and_recent():
    raw, now = b'{"messages": []}', time.time()
    mark = sign_forward(SECRET, "n1", "POST", "/v1/chat/completions", raw, now)
    assert verify_forward(SECRET, [mark], "POST", "/v1/chat/completions", raw, now) == "n1"
    assert verify_forward(SECRET, [mark], "POST", "/v1/chat/completions", raw, now + FORWARD_WINDOW_S - 1) == "n1"
    for values, method, path, body, at in (
            ([mark], "POST", "/v1/chat/completions", raw, now + FORWARD_WINDOW_S + 2),  # replayed later
            ([mark], "POST", "/v1/chat/completions", raw + b" ", now),  # another body
            ([mark], "POST", "/v1/messages", raw, now),
            ([mark, mark], "POST", "/v1/chat/completions", raw, now),  # more than one
            (["n1"], "POST", "/v1/chat/completions", raw, now),  # what a client could send
            ([mark.replace("n1;", "n2;", 1)], "POST", "/v1/chat/completions", raw, now),
            (["n1;x;y;z"], "POST", "/v1/chat/completions", raw, now), ([""], "POST", "/", b"", now)):
        assert verify_forward(SECRET, values, method, path, body, at) is None
    assert verify_forward(None, [mark], "POST", "/v1/chat/completions", raw, now) is None  # no secret: none


def test_a_clients_internal_header_is_never_passed_on():
    headers = CIMultiDict([("Authorization", "Bearer k"), ("X-PFlash-Forwarded-By", "n1"),
                           ("x-pflash-forwarded-by", "n2"), ("X-PFlash-Session", "mine")])
    kept = [k.lower() for k, _ in forwardable_headers(headers)]
    assert kept == ["authorization", "x-pflash-session"]


def test_the_cluster_settings_are_checked():
    base = {"upstream": "http://127.0.0.1:9"}
    s = load_settings({**base, "cluster_peers": ["http://a:1/, http://b:2"]}, environ={})
    assert s.cluster.cluster_peers == ["http://a:1", "http://b:2"]
    s = load_settings(base, environ={"PFLASH_CLUSTER_PEERS": "http://a:1,http://b:2", "PFLASH_CLUSTER_SECRET": SECRET})
    assert s.cluster.cluster_peers == ["http://a:1", "http://b:2"] and s.cluster.cluster_secret == SECRET
    for bad in ({"cluster_peers": ["a:1"]}, {"cluster_secret": "short"}):
        with pytest.raises(ConfigError):
            load_settings({**base, **bad}, environ={})
