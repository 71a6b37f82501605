#!/usr/bin/env bash
# The reference model as an HF directory vLLM can load, cached under
# ~/.cache/kvfabric/models/smollm2-135m-hf. Idempotent: prints the directory.
#
# vLLM 0.32 cannot load GGUF, so transformers' GGUF loader (needs `gguf` and
# `accelerate`, both in the vLLM venv of scripts/vllm-env.sh) dequantizes the
# reference GGUF (SmolLM2-135M-Instruct Q4_1, `kvfabric model path`) into f32
# weights; the GGUF quantization tag is cleared before save_pretrained, or
# vLLM would look for a GGUF file. No model hub is reached.
#
# Env: KVFABRIC_VLLM_VENV (the venv), KVFABRIC_MODEL_PATH (the GGUF; default:
# `cargo run --bin kvfabric -- model path`), KVFABRIC_VLLM_MODEL_DIR (output).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KVFABRIC_VLLM_VENV:-$HOME/.cache/kvfabric/vllm-venv}"
OUT="${KVFABRIC_VLLM_MODEL_DIR:-$HOME/.cache/kvfabric/models/smollm2-135m-hf}"

if [ -f "$OUT/.complete" ]; then
  echo "$OUT"
  exit 0
fi
GGUF="${KVFABRIC_MODEL_PATH:-}"
if [ -z "$GGUF" ]; then
  # shellcheck disable=SC1091
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
  cargo run --quiet --bin kvfabric -- model fetch >/dev/null
  GGUF="$(cargo run --quiet --bin kvfabric -- model path)"
fi
[ -f "$GGUF" ] || { echo "vllm-model: no GGUF at $GGUF" >&2; exit 1; }

echo "vllm-model: converting $GGUF into $OUT" >&2
TMP="$OUT.tmp.$$"
rm -rf "$TMP"
trap 'rm -rf "$TMP"' EXIT
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" - "$GGUF" "$TMP" <<'PY'
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf_path, out = sys.argv[1], sys.argv[2]
folder, name = os.path.split(os.path.abspath(gguf_path))
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
# The loader dequantized the weights; a leftover GGUF tag would make
# save_pretrained refuse and vLLM look for a GGUF file.
model.hf_quantizer = None
if hasattr(model, "quantization_method"):
    model.quantization_method = None
for cfg in (model.config, getattr(model, "generation_config", None)):
    if cfg is not None and hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
print(f"vllm-model: {sum(p.numel() for p in model.parameters())} parameters, "
      f"{model.config.num_hidden_layers} layers", file=sys.stderr)
PY
touch "$TMP/.complete"
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
mv "$TMP" "$OUT"
trap - EXIT
echo "$OUT"
