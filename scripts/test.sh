#!/usr/bin/env bash
# Sets up, builds, and runs every test through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${BUILD_DIR:-build}
# --timeout: a test without a TIMEOUT of its own ends after 15 minutes (the longest
# takes about 5); without it a hung test would hold CI until its own limit (enable_testing()
# alone sets no default timeout).
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 900 "$@"
