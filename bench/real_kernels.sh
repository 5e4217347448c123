#!/usr/bin/env bash
# Compiles the CUDA kernels of bench/kernels/ with nvcc into a cache-like tree (one
# directory per kernel/config/arch, holding kernel.cubin, kernel.ptx and
# kernel.json), stores the tree in a fresh db with kcache-bench-store-dir, and prints
# raw bytes, stored bytes, the ratio and the blob count (dedup). Figures only.
#
# usage: bench/real_kernels.sh [--keep]
# env:   NVCC (default /usr/local/cuda/bin/nvcc)
#        STORE_DIR (default <repo>/build-bench/bench/kcache-bench-store-dir)
#        DURABILITY (full | no_meta_sync | none; default full)
#        JOBS (parallel nvcc runs; default nproc)
# No GPU needed: nvcc only compiles.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
nvcc="${NVCC:-/usr/local/cuda/bin/nvcc}"
store_dir="${STORE_DIR:-$repo/build-bench/bench/kcache-bench-store-dir}"
durability="${DURABILITY:-full}"
jobs="${JOBS:-$(nproc)}"
keep=0
[[ "${1:-}" == "--keep" ]] && keep=1

if [[ ! -x "$nvcc" ]]; then
    echo "real_kernels.sh: no nvcc at $nvcc (set NVCC)" >&2
    exit 1
fi
if [[ ! -x "$store_dir" ]]; then
    echo "real_kernels.sh: no $store_dir; build it: cmake --build build-bench --target kcache-bench-store-dir (or set STORE_DIR)" >&2
    exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/kcache-real-kernels-XXXXXX")"
if [[ $keep == 0 ]]; then trap 'rm -rf "$work"' EXIT; fi
tree="$work/cache"
mkdir -p "$tree"

# Which real architectures this nvcc accepts (nvcc 13 dropped sm_5x/6x/70).
supported="$("$nvcc" --list-gpu-arch | sed 's/compute_/sm_/')"
pick() {  # pick ARCH... -> those this nvcc supports
    local a
    for a in "$@"; do grep -qx "$a" <<<"$supported" && echo "$a"; done
}

# One job per line: "<dir name>|<source>|<kernel name>|<nvcc -D flags>|<arch>".
jobs_file="$work/jobs.txt"
: >"$jobs_file"
for arch in $(pick sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120); do
    echo "vector_add-$arch|vector_add.cu|vector_add||$arch" >>"$jobs_file"
done
for arch in $(pick sm_80 sm_90); do
    for dtype in float double half; do
        for tile in 8 16 32; do
            echo "matmul_tiled-$dtype-t$tile-$arch|matmul.cu|matmul_tiled<$dtype,$tile>|-DDTYPE=$dtype -DTILE=$tile|$arch" >>"$jobs_file"
        done
    done
done
for arch in $(pick sm_80 sm_89); do
    for block in 128 256 512; do
        echo "reduce_sum-b$block-$arch|reduction.cu|reduce_sum|-DBLOCK=$block|$arch" >>"$jobs_file"
    done
done
for arch in $(pick sm_80 sm_90 sm_100); do
    for dtype in float half; do
        echo "softmax_rows-$dtype-$arch|softmax.cu|softmax_rows<$dtype>|-DDTYPE=$dtype|$arch" >>"$jobs_file"
    done
done
# A cache-key bug as it happens: a flag that changes nothing in the code lands the
# same kernel under a second key. Its cubin and ptx are byte-identical (dedup).
echo "vector_add-sm_80-saltedkey|vector_add.cu|vector_add|-DUNUSED_CACHE_SALT=1|sm_80" >>"$jobs_file"

compile_one() {  # one job line -> <tree>/<dir>/{kernel.cubin,kernel.ptx,kernel.json}
    local line="$1" dir src kernel flags arch out
    IFS='|' read -r dir src kernel flags arch <<<"$line"
    out="$tree/$dir"
    mkdir -p "$out"
    # shellcheck disable=SC2086
    "$nvcc" -cubin -arch="$arch" $flags -o "$out/kernel.cubin" "$here/kernels/$src"
    # shellcheck disable=SC2086
    "$nvcc" -ptx -arch="$arch" $flags -o "$out/kernel.ptx" "$here/kernels/$src"
    printf '{"kernel": "%s", "source": "%s", "arch": "%s", "flags": "%s", "compiler": "nvcc %s", "cubin_bytes": %d}\n' \
        "$kernel" "$src" "$arch" "$flags" "$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" \
        "$(stat -c %s "$out/kernel.cubin")" >"$out/kernel.json"
}
export -f compile_one
export nvcc here tree

count="$(wc -l <"$jobs_file")"
echo "compiling $count kernel configurations with nvcc $("$nvcc" --version | sed -n "s/.*release \([0-9.]*\).*/\1/p") ($jobs parallel) ..."
start=$(date +%s.%N)
tr '\n' '\0' <"$jobs_file" | xargs -0 -P "$jobs" -I{} bash -c 'compile_one "$1"' _ {}
end=$(date +%s.%N)
files="$(find "$tree" -type f | wc -l)"
raw="$(find "$tree" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')"
printf 'compiled in %.1f s: %d directories, %d files, %d raw bytes\n' \
    "$(echo "$end - $start" | bc)" "$count" "$files" "$raw"
echo "archs: $(pick sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 | tr '\n' ' ')"
echo "identical files (by content) on disk: $(find "$tree" -type f -exec sha256sum {} + | awk '{print $1}' | sort | uniq -d | wc -l) digests appear more than once"
echo "zstd -3 of each file on its own, summed (for comparison): $(find "$tree" -type f -exec sh -c 'for f; do zstd -q -3 -c "$f" | wc -c; done' _ {} + 2>/dev/null | awk '{s+=$1} END {print s}') bytes"
echo
"$store_dir" "$tree" "$work/db" "$durability"
if [[ $keep == 1 ]]; then echo "kept $work"; fi
