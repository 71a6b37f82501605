#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what is needed, builds kvfabric,
# fetches the reference model and starts a node + engine on the embedded default,
# serving the OpenAI API on http://127.0.0.1:8000 (override with KVFABRIC_* env or flags).
# Idempotent: re-running skips what is already installed, built or fetched.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
# shellcheck disable=SC1091
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

cargo build --release --bin kvfabric
./target/release/kvfabric model fetch >/dev/null
exec ./target/release/kvfabric engine --model smollm2 "$@"
