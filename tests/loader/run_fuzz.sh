#!/usr/bin/env bash
# Builds one of the loader's libFuzzer targets with clang++-14 and runs it for a bounded
# time over its committed seeds (tests/loader/corpus/TARGET). Run by CTest
# (loader:fuzz_introspect, loader:fuzz_signature).
#   run_fuzz.sh SOURCE_DIR WORK_DIR [TARGET]
# TARGET: introspect (default; inspect() over cubin/fatbin/PTX bytes) or signature
# (parse_signature() over JSON).
# KCACHE_FUZZ_SECONDS (default 20) bounds the run. Exits 77 (skipped) when clang++-14
# or libFuzzer (libclang-rt-14-dev) is missing. New inputs libFuzzer finds go to
# WORK_DIR/corpus, crashes to WORK_DIR/crash-*; the seeds are never written.
set -euo pipefail

src=$1
work=$2
name=${3:-introspect}
seconds=${KCACHE_FUZZ_SECONDS:-20}
cxx=${KCACHE_FUZZ_CXX:-clang++-14}

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIPPED: $cxx not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 77
fi
mkdir -p "$work/corpus"

case "$name" in
  introspect)
    sources=("$src"/loader/src/{cubin,decompress,elf,fatbin,introspect,ptx}.cpp) ;;
  signature)
    sources=("$src"/loader/src/signature.cpp) ;;
  *)
    echo "run_fuzz.sh: unknown target $name" >&2
    exit 2 ;;
esac
target=$src/tests/loader/fuzz_$name.cpp
binary=$work/fuzz_$name

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
    "${sources[@]}" "$target" -lfmt -lzstd -llz4 -o "$binary.tmp"
  mv "$binary.tmp" "$binary"
fi

# The first corpus directory receives new inputs; the seeds come second, read-only.
exec "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" "$src/tests/loader/corpus/$name"
