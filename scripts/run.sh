#!/usr/bin/env bash
# Sets up, builds, and runs kcache with defaults: the db under ~/.cache/kcache
# (or $KCACHE_DB) mounted at ~/.cache/kcache/mnt (or $KCACHE_MOUNT) by kcache-fsd,
# which keeps running in the background; then prints the cache's statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${BUILD_DIR:-build}
mnt=${KCACHE_MOUNT:-$HOME/.cache/kcache/mnt}
"$build_dir/cli/kcache" init
mkdir -p "$mnt"
if grep -qs " $mnt fuse.kcache " /proc/mounts; then
  echo "kcache: already mounted at $mnt"
else
  "$build_dir/fsd/kcache-fsd" "$mnt"
  echo "kcache: mounted at $mnt"
fi
echo "  use it:     export TRITON_CACHE_DIR=$mnt   (or WAVE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, CCACHE_DIR ...)"
echo "  unmount:    fusermount3 -u $mnt"
echo
"$build_dir/cli/kcache" stats
