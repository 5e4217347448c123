#!/usr/bin/env bash
# Sets up, builds, and runs kcache with defaults: the db under ~/.cache/kcache
# (or $KCACHE_DB), created if missing, and its statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${BUILD_DIR:-build}
"$build_dir/cli/kcache" init
"$build_dir/cli/kcache" stats
