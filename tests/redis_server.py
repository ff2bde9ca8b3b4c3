"""A real ``redis-server`` for the tests of the shared session index (``--index redis://``).

``RedisServer.start(workdir)`` writes a config of its own in ``workdir`` (loopback only, a free port, no
persistence, its files and log there), starts Debian's ``redis-server`` with it in the foreground and waits for
``PING``; ``stop()`` ends it. ``binary()`` is None when redis-server is not installed (``scripts/setup.sh``
installs it from Debian as root), and the tests that need it are skipped then.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pflash_proxy.llama.spawn import free_port
from tests.conftest import stop_process


def binary() -> str | None:
    return shutil.which("redis-server") or next(
        (str(p) for p in (Path("/usr/bin/redis-server"), Path("/usr/sbin/redis-server")) if os.access(p, os.X_OK)),
        None)


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, workdir: Path) -> RedisServer:
        import redis

        exe = binary()
        assert exe, "redis-server not installed"
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = workdir / "redis.log"
        conf = workdir / "redis.conf"
        conf.write_text(f"bind 127.0.0.1\nport {port}\nprotected-mode yes\ndaemonize no\nsave \"\"\n"
                        f"appendonly no\ndir {workdir}\nlogfile {log}\n")
        proc = subprocess.Popen([exe, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        server = cls(port, proc, log)
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"redis-server exited: {log.read_text() if log.exists() else ''}"
            try:
                if redis.Redis(port=port, socket_timeout=1).ping():
                    return server
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline, "redis-server did not answer PING"
            time.sleep(0.05)

    def stop(self) -> None:
        stop_process(self.proc)
