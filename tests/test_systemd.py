"""The shipped systemd units start as shipped (issue 14): `systemd-analyze verify` finds nothing wrong with them,
their optional settings files may be missing, and `scripts/install-systemd.sh` lays down a venv, the units and
the settings files (never overwriting the user's) without touching the real system (PREFIX, UNIT_DIR, CONF_DIR
in tmp_path, a fake systemctl)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = ("pflash-proxy.service", "llama-server.service")
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (Debian package "
                                   "systemd; scripts/setup.sh installs it when it runs as root with apt-get)")


def _settings(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.read_text().replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(*units: Path) -> str:
    """`systemd-analyze verify` on the unit files; returns what it said about them (nothing when clean)."""
    r = subprocess.run([ANALYZE, "verify", "--man=no", *map(str, units)], capture_output=True, text=True,
                       timeout=120, cwd=units[0].parent)
    said = [line for line in (r.stdout + r.stderr).splitlines() if any(u.name in line for u in units)]
    assert r.returncode == 0 and not said, r.stdout + r.stderr
    return "\n".join(said)


def test_the_units_say_what_the_install_needs():
    proxy, llama = (_settings(ROOT / "systemd" / u) for u in UNITS)
    assert proxy["ExecStart"] == ["/opt/pflash-proxy/venv/bin/pflash-proxy serve"]
    for unit, env in ((proxy, "/etc/pflash-proxy/env"), (llama, "/etc/pflash-proxy/llama-server.env")):
        assert unit["EnvironmentFile"] == ["-" + env]  # optional: a missing file is no failure
        assert unit["StateDirectory"] == ["pflash-proxy"] and unit["User"] == ["pflash"]
        assert "ReadWritePaths" not in unit and "ReadOnlyPaths" not in unit  # no path that must exist
    assert "PFLASH_HOME=/var/lib/pflash-proxy" in proxy["Environment"]
    assert "PFLASH_UPSTREAM=http://127.0.0.1:8080" in proxy["Environment"]  # starts without the env file
    assert "PFLASH_SLOT_SAVE_PATH=/var/lib/pflash-proxy/slots" in proxy["Environment"]
    assert "--slot-save-path /var/lib/pflash-proxy/slots" in llama["ExecStart"][0]
    # the hardening leaves the proxy its state directory and TCP
    assert {"AF_INET", "AF_INET6"} <= set(proxy["RestrictAddressFamilies"][0].split())
    assert "MemoryDenyWriteExecute" not in proxy
    example = (ROOT / "systemd" / "pflash-proxy.env.example").read_text()
    assert re.search(r"^PFLASH_UPSTREAM=http://127\.0\.0\.1:8080$", example, re.M)


@needs_analyze
def test_systemd_analyze_verifies_both_units(tmp_path):
    """verify insists that ExecStart's binary exists: the copies point it at an existing one, nothing else
    changes (the installed unit, verified below, keeps its real path)."""
    copies = []
    for name in UNITS:
        text = (ROOT / "systemd" / name).read_text()
        binary = re.search(r"^ExecStart=(\S+)", text, re.M).group(1)
        if not Path(binary).exists():
            text = text.replace(f"ExecStart={binary}", f"ExecStart={shutil.which('true')}")
        (tmp_path / name).write_text(text)
        copies.append(tmp_path / name)
    _verify(*copies)


def _install(tmp_path: Path, wheel: Path, **env: str) -> subprocess.CompletedProcess:
    calls = tmp_path / "systemctl.calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(0o755)
    variables = {"PREFIX": str(tmp_path / "opt"), "UNIT_DIR": str(tmp_path / "units"),
                 "CONF_DIR": str(tmp_path / "etc"), "SYSTEMCTL": str(fake), "SPEC": str(wheel),
                 # the wheel alone: its dependencies are not what this test is about (tests/test_install.py)
                 "PIP_ARGS": "--no-deps --no-index", **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "install-systemd.sh")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **variables})


def test_install_script_lays_down_venv_units_and_settings(tmp_path, wheel):
    r = _install(tmp_path, wheel)
    assert r.returncode == 0, r.stdout + r.stderr
    exe = tmp_path / "opt" / "venv" / "bin" / "pflash-proxy"
    assert exe.is_file() and os.access(exe, os.X_OK)
    unit = tmp_path / "units" / "pflash-proxy.service"
    assert _settings(unit)["ExecStart"] == [f"{exe} serve"]
    assert (tmp_path / "units" / "llama-server.service").read_text() == \
        (ROOT / "systemd" / "llama-server.service").read_text()
    env = tmp_path / "etc" / "env"
    assert env.read_text() == (ROOT / "systemd" / "pflash-proxy.env.example").read_text()
    assert (tmp_path / "etc" / "llama-server.env").is_file() and (tmp_path / "etc" / "env.example").is_file()
    assert (tmp_path / "systemctl.calls").read_text() == "daemon-reload\n"
    assert "sudo systemctl enable --now pflash-proxy" in r.stdout
    if ANALYZE is not None:
        _verify(unit)  # as installed: ExecStart is the venv's real pflash-proxy

    # again, with the user's settings edited: they are kept, the example is refreshed, the venv reused
    env.write_text("PFLASH_UPSTREAM=http://127.0.0.1:9999\n")
    r = _install(tmp_path, wheel)
    assert r.returncode == 0, r.stdout + r.stderr
    assert env.read_text() == "PFLASH_UPSTREAM=http://127.0.0.1:9999\n"
    assert "keeping your" in r.stdout and "creating" not in r.stdout


def test_make_test_does_not_install_the_service():
    make = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*)$", make, re.M).group(1)
    assert "install-systemd" not in test_rule and re.search(r"^install-systemd:", make, re.M)
