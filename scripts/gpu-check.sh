#!/usr/bin/env bash
# The checks of the VRAM tier that need an NVIDIA GPU (CI has none, so its
# tests skip there with a printed reason): the transfer crate's cuda tests,
# the store's VRAM tier tests, the cluster test of a peer reading a
# VRAM-only block, and `kvfabric bench store --tiers vram` (three runs).
#
#   scripts/gpu-check.sh            build with `--features cuda` here, then run
#   scripts/gpu-check.sh BIN_DIR    run prebuilt binaries from BIN_DIR
#                                   (kvfabric, transfer_tests, store_tests,
#                                   vram_cluster; each may be gzipped: NAME.gz;
#                                   shared libraries they need in BIN_DIR/lib)
#
# Logs and the bench's JSON go to $OUT (default target/gpu-check). Needs the
# CUDA driver and NVRTC (libnvrtc.so*) somewhere on the host; found below.
set -uo pipefail
OUT=${OUT:-target/gpu-check}
mkdir -p "$OUT"
BLOCKS=${BLOCKS:-1024}

# unpack SRC_DIR DST_DIR: copy each file, gunzipping NAME.gz to NAME.
unpack() {
    mkdir -p "$2"
    for f in "$1"/*; do
        [ -f "$f" ] || continue
        name=$(basename "$f" .gz)
        case "$f" in
        *.gz) gunzip -c "$f" >"$2/$name" ;;
        *) cp "$f" "$2/$name" ;;
        esac
        chmod +x "$2/$name"
    done
}
bins=$(mktemp -d)
if [ $# -ge 1 ]; then
    unpack "$1" "$bins"
    # Shared libraries the binaries were linked against on the build host
    # (e.g. Debian's librocksdb), when the GPU host lacks them: BIN_DIR/lib.
    if [ -d "$1/lib" ]; then
        unpack "$1/lib" "$bins/lib"
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$bins/lib"
    fi
else
    cargo build --release --features cuda -p kvfabric || exit 1
    cp target/release/kvfabric "$bins/"
    pick() { # pick PACKAGE TARGET_KIND TARGET_NAME OUT_NAME
        cargo test --features cuda -p "$1" --no-run --message-format=json 2>/dev/null |
            python3 -c "import json,sys
for l in sys.stdin:
    m=json.loads(l)
    t=m.get('target',{})
    if m.get('executable') and t.get('name')=='$3' and '$2' in t.get('kind',[]): print(m['executable'])" |
            head -1 | xargs -I{} cp {} "$bins/$4"
    }
    pick kvfabric-transfer lib kvfabric_transfer transfer_tests
    pick kvfabric-store lib kvfabric_store store_tests
    pick kvfabric-node test vram_cluster vram_cluster
fi

# NVRTC: cudarc looks for libnvrtc.so (or .so.12, ...); CUDA 13 ships .so.13.
nvrtc=$(ldconfig -p | awk '/libnvrtc\.so/{print $NF}' | grep -v builtins | head -1)
if [ -z "$nvrtc" ]; then
    nvrtc=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null | grep -v builtins | sort | head -1)
fi
libs=$(mktemp -d)
if [ -n "$nvrtc" ]; then
    ln -sf "$nvrtc" "$libs/libnvrtc.so"
    export LD_LIBRARY_PATH="$libs:$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
fi
echo "nvrtc: ${nvrtc:-none found}" | tee "$OUT/env.log"
for b in "$bins"/*; do
    [ -f "$b" ] && ldd "$b" 2>&1 | grep "not found" | sed "s|^|$(basename "$b"): |"
done
nvidia-smi -L 2>&1 | tee -a "$OUT/env.log"
{ nvidia-smi; lscpu | grep -E 'Model name|^CPU\(s\)'; free -g | head -2; } >>"$OUT/env.log" 2>&1

status=0
run() { # run NAME TIMEOUT CMD...
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
        echo "   ok"
    else
        echo "   FAILED (rc $?)"
        status=1
    fi
    grep -E "^test |test result|skipped|panicked|Error|error" "$OUT/$name.log" | tail -25
}
run transfer_tests 120 "$bins/transfer_tests" cuda --nocapture --test-threads 2
run store_tests 180 "$bins/store_tests" vram:: --nocapture
run vram_cluster 90 "$bins/vram_cluster" --nocapture
# Twice with the default 8 clients (the spread between runs), once with 16.
for i in 1 2 3; do
    clients=8
    [ "$i" = 3 ] && clients=16
    echo "== bench $i (--clients $clients)"
    RUST_BACKTRACE=0 timeout 90 "$bins/kvfabric" bench store --json --tiers vram --blocks "$BLOCKS" --clients "$clients" \
        >"$OUT/bench$i.json" 2>"$OUT/bench$i.err" || { echo "   FAILED"; status=1; tail -5 "$OUT/bench$i.err"; }
    cat "$OUT/bench$i.json"
    echo
done
# SWEEP=1: promotions checked by the host instead of the GPU (the peer of
# the default), and the staging's knobs (slice, depth, slots) around the defaults.
if [ -n "${SWEEP:-}" ]; then
    j=0
    for knobs in "--vram-verify host" "--vram-verify host --clients 16" \
        "--vram-staging-slice 1MiB --vram-staging-depth 2" \
        "--vram-staging-slice 2MiB --vram-staging-depth 2 --clients 16"; do
        j=$((j + 1))
        echo "== sweep $j: $knobs"
        # shellcheck disable=SC2086
        RUST_BACKTRACE=0 timeout 90 "$bins/kvfabric" bench store --json --tiers vram --blocks "$BLOCKS" $knobs \
            >"$OUT/sweep$j.json" 2>"$OUT/sweep$j.err" || { echo "   FAILED"; tail -5 "$OUT/sweep$j.err"; }
        python3 -c "import json,sys
r=json.load(open(sys.argv[1]))
print({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items() if 'vs' in k or 'slowdown' in k or k.endswith('gbps')})" "$OUT/sweep$j.json" 2>/dev/null
    done
fi
exit $status
