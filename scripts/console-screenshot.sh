#!/usr/bin/env bash
# Regenerates docs/images/console.png, the console screenshot in
# docs/OPERATIONS.md: runs tests/console.rs (a real 3-node cluster on etcd
# under load, the page in headless Chromium, the planner sampling every key
# so its curve is drawn) and copies the screenshot it saves once every panel
# has data (target tmp dir, console/console.png) into docs/images/.
#
#   scripts/console-screenshot.sh
#
# Needs chromium, chromium-driver and etcd (scripts/install-deps.sh). Honours
# CARGO_TARGET_DIR. Fails if the test skipped (no browser) or failed.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test -p kvfabric --test console console_shows_the_cluster_in_a_real_browser \
  -- --exact --nocapture 2>&1 | tee "$log"
if grep -q '^SKIPPED' "$log"; then
  echo "console test skipped (no chromium/chromedriver): no screenshot" >&2
  exit 1
fi
shot=$(sed -n 's/^console screenshot: \(.*\/console\.png\)$/\1/p' "$log" | tail -n 1)
[ -n "$shot" ] && [ -f "$shot" ] || { echo "no console.png in the test's output" >&2; exit 1; }
mkdir -p docs/images
cp "$shot" docs/images/console.png
echo "docs/images/console.png <- $shot"
