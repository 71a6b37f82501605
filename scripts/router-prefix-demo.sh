#!/usr/bin/env bash
# Prefix-aware routing by hand (docs/ROUTER.md "Prefix-aware routing"):
# three `kvfabric engine`s, each with its own embedded node (no cluster, so
# a prefix is reused only where it was computed), and `kvfabric router
# --policy POLICY --engine-nodes ...` in front; six sequential requests that
# share a ~640-token prefix and differ in their last line. Prints each
# answer's prompt / cached tokens and text, the requests per engine, and the
# router's prefix and KV event series. Deterministic (greedy decoding).
#
#   scripts/router-prefix-demo.sh prefix|least-loaded|random|affinity
#
# KVFABRIC_BIN (default: kvfabric on PATH), KVFABRIC_MODEL_PATH (default:
# the reference model). Ports 31100-31400 on loopback.
set -u
BIN=${KVFABRIC_BIN:-kvfabric}
M=${KVFABRIC_MODEL_PATH:-$HOME/.cache/kvfabric/models/SmolLM2-135M-Instruct.Q4_1.gguf}
POLICY=${1:?policy}
D=$(mktemp -d)
pids=()
urls=()
nodes=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
for i in 0 1 2; do
  a=$((31100 + i)) g=$((31200 + i)) h=$((31300 + i))
  "$BIN" engine --model "$M" --listen 127.0.0.1:$a --node-id n$i --threads 1 \
    --kv-pool 64MiB --ram-capacity 64MiB --grpc-listen 127.0.0.1:$g \
    --http-listen 127.0.0.1:$h 2>"$D/e$i.log" &
  pids+=($!)
  urls+=("http://127.0.0.1:$a")
  nodes+=("http://127.0.0.1:$a=127.0.0.1:$g")
done
for i in 0 1 2; do
  until curl -sf 127.0.0.1:$((31100 + i))/health >/dev/null; do sleep 0.3; done
done
E=$(IFS=,; echo "${urls[*]}")
N=$(IFS=,; echo "${nodes[*]}")
"$BIN" router --listen 127.0.0.1:31400 --engines "$E" --policy "$POLICY" \
  --engine-nodes "$N" 2>"$D/router.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf 127.0.0.1:31400/health >/dev/null && break; sleep 0.2; done
sleep 1
SYS=$(python3 -c 'print("You are a careful assistant for a fabric of attention caches. " * 50)')
for q in rivers compilers bread tides maps clocks; do
  body=$(python3 -c 'import json, sys; print(json.dumps({"model": "smollm2", "prompt": sys.argv[1] + "Question: " + sys.argv[2] + "\nAnswer:", "max_tokens": 6, "temperature": 0}))' "$SYS" "$q")
  curl -s 127.0.0.1:31400/v1/completions -H 'content-type: application/json' -d "$body" |
    python3 -c 'import json, sys; v = json.load(sys.stdin); u = v["usage"]; print(sys.argv[1], "prompt", u["prompt_tokens"], "cached", u.get("prompt_tokens_details", {}).get("cached_tokens", 0), repr(v["choices"][0]["text"]))' "$q"
done
for i in 0 1 2; do
  echo -n "engine $i requests: "
  curl -s 127.0.0.1:$((31100 + i))/metrics | awk '/^kvfabric_engine_requests_total/ {s += $NF} END {print s + 0}'
done
curl -s 127.0.0.1:31400/metrics | grep -E '^kvfabric_router_(prefix|kv_event)'
