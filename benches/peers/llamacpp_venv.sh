#!/usr/bin/env bash
# Builds, once, the Python venv in which `kvfabric bench engine` measures llama.cpp:
# PyPI llama-cpp-python compiled here from source with native CPU flags (AVX2/AVX-512
# as this machine has them), plus PyPI gguf + numpy for the F32 conversion of the model.
# Idempotent: a venv that already imports the pinned versions is left untouched (no
# rebuild); a half-built one (no ready marker) is rebuilt from scratch.
# Usage: llamacpp_venv.sh VENV_DIR LLAMA_CPP_PYTHON_VERSION GGUF_VERSION
# Progress goes to stdout; the full build log to VENV_DIR.build.log.
set -euo pipefail
venv="$1"
llama_version="$2"
gguf_version="$3"
marker="$venv/.kvfabric-ready"

ready() {
  [ -f "$marker" ] && "$venv/bin/python" - "$llama_version" "$gguf_version" <<'PY' 2>/dev/null
import sys, importlib.metadata as md
import llama_cpp, gguf, numpy  # noqa: F401
assert md.version("llama-cpp-python") == sys.argv[1], md.version("llama-cpp-python")
assert md.version("gguf") == sys.argv[2], md.version("gguf")
PY
}

if ready; then
  echo "llama.cpp venv ready: $venv"
  exit 0
fi

log="$venv.build.log"
echo "building the llama.cpp venv in $venv (llama-cpp-python==$llama_version from source, native flags; several minutes; log: $log)"
if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
  echo "$venv exists and is not a Python venv: refusing to replace it"
  exit 1
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==$gguf_version" "numpy>=1.26"
# GGML_NATIVE: -march=native; no GPU backends, no BLAS; llama.cpp's own CPU kernels.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF -DCMAKE_BUILD_TYPE=Release"
export FORCE_CMAKE=1
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# --no-cache-dir: never reuse a wheel built earlier with other flags.
"$venv/bin/python" -m pip install -v --no-cache-dir --disable-pip-version-check \
  --no-binary llama-cpp-python "llama-cpp-python==$llama_version" >"$log" 2>&1 &
pip_pid=$!
# Progress: the compile percentage from the build log while pip runs.
last=""
while kill -0 "$pip_pid" 2>/dev/null; do
  sleep 10
  now="$(grep -a -o -E '^\s*\[ *[0-9]+(%|/[0-9]+)\]' "$log" 2>/dev/null | tail -1 | tr -d ' [' || true)"
  step="$(grep -a -E '^(Collecting|Building|Installing|  Building|  Installing)' "$log" 2>/dev/null | tail -1 | cut -c1-80 || true)"
  line="${now:+compiled $now }${step}"
  if [ -n "$line" ] && [ "$line" != "$last" ]; then
    echo "  llama.cpp build: $line"
    last="$line"
  fi
done
if ! wait "$pip_pid"; then
  echo "llama-cpp-python build failed; last lines of $log:"
  tail -n 20 "$log"
  exit 1
fi
touch "$marker"
if ! ready; then
  echo "llama-cpp-python installed but does not import; see $log"
  rm -f "$marker"
  exit 1
fi
echo "llama.cpp venv ready: $venv"
