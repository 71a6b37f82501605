#!/usr/bin/env bash
# Build the `kvfabric` Python wheel from this workspace (PyO3 + maturin, one
# abi3 wheel for CPython >= 3.11) and install it into a venv.
#   bash scripts/python-build.sh [VENV]     (default ~/.cache/kvfabric/pyenv)
# Prints the wheel's path. Idempotent: cargo rebuilds only what changed.
# The wheel links the system libraries the store uses (RocksDB's snappy, lz4,
# zstd, gflags; scripts/install-deps.sh installs them): it is built for the
# machine it runs on, not repaired into a manylinux wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${KVFABRIC_PYENV:-$HOME/.cache/kvfabric/pyenv}}"
# shellcheck disable=SC1091
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if ! "$VENV/bin/python" -c "import maturin, numpy" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin==1.16.0" "numpy>=1.26"
fi
OUT="${CARGO_TARGET_DIR:-target}/wheels"
# The dev profile is optimised (opt-level 2) and shares the test build's artifacts.
"$VENV/bin/maturin" build --quiet --profile dev -m python/Cargo.toml \
  --interpreter "$VENV/bin/python" --out "$OUT" --auditwheel skip >&2
WHEEL="$(ls -t "$OUT"/kvfabric-*.whl | head -1)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
echo "$WHEEL"
