#!/usr/bin/env bash
# Builds the loader's libFuzzer target with clang++-14 and runs it for a bounded time
# over the committed seeds (tests/loader/corpus). Run by CTest (loader:fuzz_introspect).
#   run_fuzz.sh SOURCE_DIR WORK_DIR
# KCACHE_FUZZ_SECONDS (default 20) bounds the run. Exits 77 (skipped) when clang++-14
# or libFuzzer (libclang-rt-14-dev) is missing. New inputs libFuzzer finds go to
# WORK_DIR/corpus, crashes to WORK_DIR/crash-*; the seeds are never written.
set -euo pipefail

src=$1
work=$2
seconds=${KCACHE_FUZZ_SECONDS:-20}
cxx=${KCACHE_FUZZ_CXX:-clang++-14}

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIPPED: $cxx not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 77
fi
mkdir -p "$work/corpus"

sources=("$src"/loader/src/*.cpp)
target=$src/tests/loader/fuzz_introspect.cpp
binary=$work/fuzz_introspect

# Rebuild only when a source or header changed since the last build.
stale=1
if [ -x "$binary" ]; then
  stale=0
  for f in "${sources[@]}" "$target" "$src"/loader/src/*.hpp "$src"/loader/include/kcache/loader/*.hpp \
           "$src"/core/include/kcache/core/error.hpp "$0"; do
    if [ "$f" -nt "$binary" ]; then stale=1; break; fi
  done
fi
if [ "$stale" = 1 ]; then
  probe=$work/probe.cpp
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
  if ! "$cxx" -fsanitize=fuzzer "$probe" -o "$work/probe" >/dev/null 2>&1; then
    echo "SKIPPED: $cxx cannot link libFuzzer (apt-get install libclang-rt-14-dev)" >&2
    exit 77
  fi
  echo "building $binary" >&2
  "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$src/loader/include" -I"$src/loader/src" -I"$src/core/include" \
    "${sources[@]}" "$target" -lfmt -lzstd -o "$binary.tmp"
  mv "$binary.tmp" "$binary"
fi

# The first corpus directory receives new inputs; the seeds come second, read-only.
exec "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" "$src/tests/loader/corpus"
