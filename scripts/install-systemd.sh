#!/usr/bin/env bash
# Install pflash-proxy as a systemd service (`make install-systemd`; never run by `make test`).
#
# 1. A virtual environment in $PREFIX/venv (default /opt/pflash-proxy/venv) with pflash-proxy installed by pip:
#    from this checkout by default, or from SPEC (a wheel file, `pflash-proxy`, `pflash-proxy[drafter]` ...).
#    An existing venv is reused, so running this again upgrades in place.
# 2. systemd/pflash-proxy.service and llama-server.service into $UNIT_DIR (/etc/systemd/system); with another
#    PREFIX, the proxy unit's ExecStart is pointed at that venv.
# 3. The settings examples into $CONF_DIR (/etc/pflash-proxy): env.example and llama-server.env.example always;
#    env and llama-server.env only when missing (your settings are never overwritten).
# 4. `systemctl daemon-reload` (SYSTEMCTL= skips it), then the `systemctl enable --now` line to run.
#
# Variables: PYTHON (python3, 3.11 or newer), PREFIX, SPEC, EXTRAS (e.g. drafter: SPEC=".[drafter]"), PIP_ARGS
# (extra pip options), UNIT_DIR, CONF_DIR, SYSTEMCTL (systemctl). Needs root for the default paths.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

PYTHON=${PYTHON:-python3}
PREFIX=${PREFIX:-/opt/pflash-proxy}
EXTRAS=${EXTRAS:-}
SPEC=${SPEC:-$ROOT${EXTRAS:+[$EXTRAS]}}
PIP_ARGS=${PIP_ARGS:-}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
CONF_DIR=${CONF_DIR:-/etc/pflash-proxy}
SYSTEMCTL=${SYSTEMCTL-systemctl}
VENV=$PREFIX/venv

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "install-systemd: $PYTHON is not Python 3.11 or newer (set PYTHON=...)" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "install-systemd: creating $VENV"
  mkdir -p "$PREFIX"
  "$PYTHON" -m venv "$VENV"
fi
echo "install-systemd: installing $SPEC into $VENV"
# shellcheck disable=SC2086  # PIP_ARGS is a list of options
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $PIP_ARGS --upgrade "$SPEC"
if [ ! -x "$VENV/bin/pflash-proxy" ]; then
  echo "install-systemd: $VENV/bin/pflash-proxy is missing after the install" >&2
  exit 1
fi

mkdir -p "$UNIT_DIR" "$CONF_DIR"
sed "s#^ExecStart=/opt/pflash-proxy/venv/bin/pflash-proxy #ExecStart=$VENV/bin/pflash-proxy #" \
  "$ROOT/systemd/pflash-proxy.service" > "$UNIT_DIR/pflash-proxy.service"
cp "$ROOT/systemd/llama-server.service" "$UNIT_DIR/llama-server.service"
chmod 0644 "$UNIT_DIR/pflash-proxy.service" "$UNIT_DIR/llama-server.service"
for pair in "pflash-proxy.env.example:env" "llama-server.env.example:llama-server.env"; do
  example=${pair%%:*} target=${pair##*:}
  install -m 0644 "$ROOT/systemd/$example" "$CONF_DIR/${target}.example"
  if [ -e "$CONF_DIR/$target" ]; then
    echo "install-systemd: keeping your $CONF_DIR/$target (the new example is $CONF_DIR/${target}.example)"
  else
    install -m 0644 "$ROOT/systemd/$example" "$CONF_DIR/$target"
  fi
done
echo "install-systemd: units in $UNIT_DIR, settings in $CONF_DIR/env and $CONF_DIR/llama-server.env"

if [ -n "$SYSTEMCTL" ]; then
  "$SYSTEMCTL" daemon-reload
fi
cat <<MSG

Next:
  1. Point the proxy at your llama-server: PFLASH_UPSTREAM in $CONF_DIR/env (default http://127.0.0.1:8080).
     To let systemd run llama-server too, set LLAMA_SERVER and LLAMA_MODEL in $CONF_DIR/llama-server.env
     and start it with the proxy (SSD snapshots need that: both units share one user and /var/lib/pflash-proxy).
  2. Start it, now and at every boot:
       sudo systemctl enable --now pflash-proxy                  # in front of your own llama-server
       sudo systemctl enable --now llama-server pflash-proxy     # with the companion llama-server unit
  3. Check: systemctl status pflash-proxy; journalctl -u pflash-proxy -f; curl http://127.0.0.1:8090/pflash/stats
MSG
