"""The shipped balancer configs as a user gets them: each is accepted by its binary (``nginx -t`` inside a minimal
main config, ``haproxy -c``), and the two NODES lists of a file name the same nodes (the one thing a user edits)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.cluster.balancers import NODES_BLOCK, TEMPLATES, binary


def _nodes(kind: str) -> list[list[tuple[str, str]]]:
    """Per NODES block, the (name, address) of each server line (nginx lines have no name)."""
    blocks = []
    for m in NODES_BLOCK.finditer(TEMPLATES[kind].read_text()):
        lines = [ln.split() for ln in m.group(2).splitlines() if ln.strip().startswith("server ")]
        blocks.append([(w[1], w[2]) if kind == "haproxy" else ("", w[1].rstrip(";")) for w in lines])
    return blocks


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_both_node_lists_name_the_same_nodes(kind):
    blocks = _nodes(kind)
    assert len(blocks) == 2 and blocks[0] and blocks[0] == blocks[1], blocks
    if kind == "haproxy":  # the least-connections backend follows the affinity backend's health checks
        text = TEMPLATES[kind].read_text()
        for name, _ in blocks[0]:
            assert re.search(rf"server {name} \S+ track pflash_affinity/{name}\b", text), name


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_the_shipped_file_is_accepted_as_it_is(kind, tmp_path):
    exe = binary(kind)
    if exe is None:
        pytest.skip(f"{kind} not installed (scripts/setup.sh installs Debian's {kind} as root)")
    if kind == "haproxy":
        cmd = [exe, "-c", "-f", str(TEMPLATES[kind])]
    else:
        temps = "\n".join(f"  {name}_temp_path {tmp_path / name};"
                          for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        # nginx -t opens the log files: the access log goes to tmp_path, nothing else of the file changes
        conf = tmp_path / "pflash-proxy.conf"
        conf.write_text(TEMPLATES[kind].read_text().replace("/var/log/nginx/pflash-proxy.access.log",
                                                            str(tmp_path / "access.log")))
        main = tmp_path / "nginx.conf"
        main.write_text(f"pid {tmp_path / 'nginx.pid'};\nevents {{}}\nhttp {{\n{temps}\n  include {conf};\n}}\n")
        cmd = [exe, "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(main)]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_a_clients_internal_header_does_not_reach_a_node(kind, tmp_path):
    """The balancer removes ``X-PFlash-Forwarded-By`` (only nodes set it, for each other) from what a client
    sends; a session header still goes through. The node behind it records the headers it receives."""
    if binary(kind) is None:
        pytest.skip(f"{kind} not installed (scripts/setup.sh installs Debian's {kind} as root)")
    import json
    import threading
    import time
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.cluster.balancers import Balancer

    seen: list[dict] = []

    class Node(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            if self.path != "/health":
                seen.append({k.lower(): v for k, v in self.headers.items()})
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            self._answer()

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer()

        def log_message(self, *args) -> None:
            pass

    node = ThreadingHTTPServer(("127.0.0.1", 0), Node)
    threading.Thread(target=node.serve_forever, daemon=True).start()
    balancer = Balancer.start(kind, [f"127.0.0.1:{node.server_address[1]}"], tmp_path)
    try:
        deadline = time.monotonic() + 30
        for session in (None, "s1"):
            while True:
                headers = {"Content-Type": "application/json", "X-PFlash-Forwarded-By": "node2",
                           **({"X-PFlash-Session": session} if session else {})}
                req = urllib.request.Request(balancer.url + "/v1/chat/completions", data=b"{}", headers=headers)
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        assert r.status == 200
                    break
                except OSError:  # the balancer still starting, or its health check not passed yet
                    assert time.monotonic() < deadline, balancer.log.read_text()
                    time.sleep(0.3)
        assert len(seen) >= 2
        assert all("x-pflash-forwarded-by" not in h for h in seen), seen
        assert seen[-1].get("x-pflash-session") == "s1"
    finally:
        balancer.stop()
        node.shutdown()
