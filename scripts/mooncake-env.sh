#!/usr/bin/env bash
# Builds, once, the Python venv that holds Mooncake, the peer of `kvfabric bench transfer`,
# `bench store` and `bench cluster`: PyPI mooncake-transfer-engine-non-cuda (its CPU build:
# transfer_engine_bench, mooncake_master and the mooncake.store Python API).
# Idempotent: a venv that already imports the pinned version is left untouched; a half-built
# one (no ready marker) is rebuilt from scratch.
# The venv is ~/.cache/kvfabric/mooncake-venv, or $KVFABRIC_MOONCAKE_VENV when set.
# Usage: scripts/mooncake-env.sh        (prints the venv path as its last line on success)
# Exit status 1, with the reason on stderr, when it cannot be installed.
set -euo pipefail
version="${KVFABRIC_MOONCAKE_VERSION:-0.3.13.post1}"
venv="${KVFABRIC_MOONCAKE_VENV:-$HOME/.cache/kvfabric/mooncake-venv}"
marker="$venv/.kvfabric-ready"

ready() {
  [ -f "$marker" ] && [ -x "$venv/bin/mooncake_master" ] && [ -x "$venv/bin/transfer_engine_bench" ] \
    && "$venv/bin/python" - "$version" <<'PY' 2>/dev/null
import sys, importlib.metadata as md
from mooncake.store import MooncakeDistributedStore  # noqa: F401
assert md.version("mooncake-transfer-engine-non-cuda") == sys.argv[1]
PY
}

if ready; then
  echo "$venv"
  exit 0
fi

if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
  echo "$venv exists and is not a Python venv: refusing to replace it" >&2
  exit 1
fi
log="$venv.install.log"
mkdir -p "$(dirname "$venv")"
echo "installing mooncake-transfer-engine-non-cuda==$version into $venv (log: $log)" >&2
rm -rf "$venv"
if ! python3 -m venv "$venv" >"$log" 2>&1; then
  echo "python3 -m venv failed; see $log" >&2
  exit 1
fi
if ! "$venv/bin/python" -m pip install --disable-pip-version-check \
  "mooncake-transfer-engine-non-cuda==$version" >>"$log" 2>&1; then
  echo "pip install mooncake-transfer-engine-non-cuda==$version failed; last lines of $log:" >&2
  tail -n 5 "$log" >&2
  exit 1
fi
touch "$marker"
if ! ready; then
  rm -f "$marker"
  echo "mooncake installed but its tools or mooncake.store do not load; see $log" >&2
  exit 1
fi
echo "$venv"
