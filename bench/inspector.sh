#!/usr/bin/env bash
# Figures for the inspector on a large db: fills a db with N synthetic entries
# (default 1,000,000), prints the model's first load, memory per entry, sort, filter,
# refresh and duplicates-scan times (kcache-bench-inspector measure), then the real
# program's frame times under Xvfb with Mesa's llvmpipe, with llvmpipe's default
# threads and with LP_NUM_THREADS=0 (rendering on the calling thread). Figures only.
#
# usage: bench/inspector.sh [ENTRIES]
# env:   BUILD_DIR (default <repo>/build)   FRAMES (default 300)   KEEP=1 keeps the db
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
build="${BUILD_DIR:-$repo/build}"
entries="${1:-1000000}"
frames="${FRAMES:-300}"
bench="$build/bench/kcache-bench-inspector"
inspector="$build/gui/kcache-inspector"
for f in "$bench" "$inspector"; do
    if [[ ! -x "$f" ]]; then
        echo "inspector.sh: no $f; build it: cmake --build $build --target kcache-bench-inspector kcache-inspector" >&2
        exit 1
    fi
done
command -v xvfb-run >/dev/null || { echo "inspector.sh: xvfb-run not found (apt-get install xvfb xauth)" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/kcache-bench-inspector-XXXXXX")"
if [[ "${KEEP:-0}" != 1 ]]; then trap 'rm -rf "$work"' EXIT; fi
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$bench" fill --db "$work/db" --entries "$entries"
"$bench" measure --db "$work/db"
for threads in default 0; do
    echo "kcache-inspector, 1600x1000, $frames frames, LP_NUM_THREADS=$threads:"
    env XDG_CONFIG_HOME="$work/config" $([[ $threads == default ]] || echo "LP_NUM_THREADS=$threads") \
        xvfb-run -a -s "-screen 0 1920x1080x24" \
        "$inspector" --db "$work/db" --frames "$frames" --report-frame-times
done
echo "machine: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
if [[ "${KEEP:-0}" == 1 ]]; then echo "kept $work"; fi
