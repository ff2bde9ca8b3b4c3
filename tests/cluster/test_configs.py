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
