"""The shipped balancer configs (configs/nginx, configs/haproxy) rendered for loopback nodes and run as processes.

1. ``render(kind, nodes, port, workdir)`` reads the shipped file and replaces, in every ``# NODES`` … ``# END NODES``
   block, the example server lines with one line per node (the block's first line with its address and ``node1``
   name changed), the listen port with a loopback one, and the access log path with one under ``workdir``.
   Every replacement must happen, so a template that no longer has the expected shape fails here, loudly.
2. ``Balancer.start(kind, nodes, workdir)`` writes the rendered file (``edit``: changed first, for a variant) (nginx: inside a minimal main config whose
   pid, error log and temp paths are under ``workdir``), checks it with ``nginx -t`` / ``haproxy -c`` and starts
   the binary in the foreground on a free loopback port; ``stop()`` ends it.
3. ``binary(kind)`` finds nginx or haproxy on PATH or in /usr/sbin (Debian's place, not on a non-root PATH).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pflash_proxy.llama.spawn import free_port
from tests.conftest import stop_process

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = {"nginx": ROOT / "configs" / "nginx" / "pflash-proxy.conf",
             "haproxy": ROOT / "configs" / "haproxy" / "pflash-proxy.cfg"}
EXAMPLE_ADDR = re.compile(r"\b\d+\.\d+\.\d+\.\d+:\d+\b")
NODES_BLOCK = re.compile(r"(# NODES[^\n]*\n)(.*?)(\n[ \t]*# END NODES)", re.DOTALL)


def binary(kind: str) -> str | None:
    return shutil.which(kind) or next((str(p) for p in (Path("/usr/sbin") / kind,) if os.access(p, os.X_OK)), None)


def _nodes_block(match: re.Match, nodes: list[str]) -> str:
    lines = [ln for ln in match.group(2).splitlines() if ln.strip().startswith("server ")]
    assert lines, f"no server line in a NODES block: {match.group(0)!r}"
    first = lines[0]
    assert EXAMPLE_ADDR.search(first), first
    out = []
    for i, addr in enumerate(nodes, 1):
        out.append(EXAMPLE_ADDR.sub(addr, first).replace("node1", f"node{i}"))
    return match.group(1) + "\n".join(out) + match.group(3)


def render(kind: str, nodes: list[str], port: int, workdir: Path) -> str:
    text = TEMPLATES[kind].read_text()
    text, blocks = NODES_BLOCK.subn(lambda m: _nodes_block(m, nodes), text)
    assert blocks == 2, f"{TEMPLATES[kind]}: expected 2 NODES blocks, found {blocks}"
    if kind == "nginx":
        text, n = re.subn(r"(?m)^(\s*)listen 8080;", rf"\g<1>listen 127.0.0.1:{port};", text)
        assert n == 1, "nginx template: no `listen 8080;`"
        text, n = re.subn(r"access_log /var/log/nginx/pflash-proxy\.access\.log",
                          f"access_log {workdir / 'access.log'}", text)
        assert n == 1, "nginx template: no access_log line"
    else:
        text, n = re.subn(r"(?m)^(\s*)bind :8080$", rf"\g<1>bind 127.0.0.1:{port}", text)
        assert n == 1, "haproxy template: no `bind :8080`"
    return text


@dataclass
class Balancer:
    kind: str
    url: str
    proc: subprocess.Popen
    log: Path

    @classmethod
    def start(cls, kind: str, nodes: list[str], workdir: Path, edit: Callable[[str], str] | None = None
              ) -> Balancer:
        exe = binary(kind)
        assert exe, f"{kind} not installed"
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        text = render(kind, nodes, port, workdir)
        if edit is not None:  # a variant of the shipped file (benchmarks/cluster.py: plain round-robin)
            text = edit(text)
        log = workdir / f"{kind}.log"
        if kind == "nginx":
            (workdir / "pflash-proxy.conf").write_text(text)
            temps = "\n".join(f"  {name}_temp_path {workdir / name};"
                              for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
            main = workdir / "nginx.conf"
            main.write_text(f"{'user root root;' if os.geteuid() == 0 else ''}\n"
                            f"pid {workdir / 'nginx.pid'};\nerror_log {log} info;\nworker_processes 1;\n"
                            f"events {{ worker_connections 256; }}\n"
                            f"http {{\n{temps}\n  include {workdir / 'pflash-proxy.conf'};\n}}\n")
            base = [exe, "-p", str(workdir), "-e", str(log), "-c", str(main)]
            check, run = base + ["-t"], base + ["-g", "daemon off;"]
        else:
            cfg = workdir / "haproxy.cfg"
            cfg.write_text(text)
            check, run = [exe, "-c", "-f", str(cfg)], [exe, "-db", "-f", str(cfg)]
        r = subprocess.run(check, check=False, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{kind} rejects the rendered config: {r.stdout}{r.stderr}"
        with open(log, "ab") as out:
            proc = subprocess.Popen(run, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return cls(kind, f"http://127.0.0.1:{port}", proc, log)

    def stop(self) -> None:
        stop_process(self.proc)
