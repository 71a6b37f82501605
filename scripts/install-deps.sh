#!/usr/bin/env bash
# Installs the system packages kvfabric needs to build, test and benchmark, idempotently.
# Safe to run many times: packages already present are skipped without touching apt.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config cmake     # C/C++ for -sys crates
  libclang-dev                         # bindgen (librocksdb-sys)
  protobuf-compiler libprotobuf-dev    # protoc + well-known types for tonic/prost code generation (ours and etcd-client's)
  librocksdb-dev                       # RocksDB 7.8 shared library: disk-tier index, linked, not rebuilt
  libibverbs-dev librdmacm-dev rdma-core libnl-3-dev libnl-route-3-dev  # `rdma` feature (compiles without a NIC)
  etcd-server                          # membership tests start a real etcd on loopback
  prometheus                           # promtool: scripts/test.sh checks deploy/prometheus/alerts.yml
  redis-server fio iperf3              # peers the benchmarks measure against
  python3-pip python3-venv unzip       # model fetch (PyPI wheel) and llama.cpp reference
  iproute2 procps curl ca-certificates
  chromium chromium-driver             # tests/console.rs drives the browser console in headless Chromium (WebDriver)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The etcd-server package starts a system etcd on 2379; our tests start their own on other ports.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
  ${SUDO:-} systemctl stop etcd || true
fi

# The prometheus package starts a system Prometheus on 9090; only its promtool is wanted.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
  ${SUDO:-} systemctl stop prometheus || true
fi

# Python venv for the engine's independent numpy oracle (engine/tests/model_oracle.rs).
PYENV="${KVFABRIC_PYENV:-$HOME/.cache/kvfabric/pyenv}"
if ! "$PYENV/bin/python" -c "import gguf, numpy" 2>/dev/null; then
  echo "install-deps: creating the oracle venv in $PYENV"
  python3 -m venv "$PYENV"
  "$PYENV/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==0.19.0" "numpy>=1.26"
fi

# Python venv with the official openai client (engine/tests/openai_client.rs).
OPENAI_VENV="${KVFABRIC_OPENAI_VENV:-$HOME/.cache/kvfabric/openai-venv}"
# jsonschema validates the structured outputs (response_format json_schema).
if ! "$OPENAI_VENV/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
  echo "install-deps: creating the openai client venv in $OPENAI_VENV"
  [ -x "$OPENAI_VENV/bin/python" ] || python3 -m venv "$OPENAI_VENV"
  "$OPENAI_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openai>=1.50,<3" "jsonschema>=4.17,<5"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; installing the Rust toolchain with rustup" >&2
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
