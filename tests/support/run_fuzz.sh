#!/usr/bin/env bash
# Builds one libFuzzer target with clang++-14 (-fsanitize=fuzzer,address,undefined) and
# runs it for a bounded time over its committed seeds. Shared by every fuzz target of
# the project; CTest runs it (see tests/reliability/CMakeLists.txt).
#
#   run_fuzz.sh NAME WORK_DIR SEED_DIR -- ARGS...
#
# ARGS describe the program: source files (*.cpp, *.cc) are compiled one object each;
# pkg:NAME adds `pkg-config --cflags`/`--libs NAME`; -l*, -L* and -Wl,* go to the link;
# everything else (-I, -D, -W...) goes to every compile. An object is rebuilt only when
# its source, this script, the flags, or a header under one of the -I directories is
# newer than it, so reruns start fuzzing at once.
#
# Environment:
#   KCACHE_FUZZ_SECONDS  bound of the run (default 20)
#   KCACHE_FUZZ_CXX      compiler (default clang++-14)
#   KCACHE_FUZZ_JOBS     parallel compiles (default 2)
#   KCACHE_FUZZ_ARGS     extra libFuzzer options, e.g. "-jobs=4 -max_len=65536"
#
# New inputs libFuzzer finds go to WORK_DIR/corpus (the seeds are never written),
# crashes to WORK_DIR/crash-* (replay: WORK_DIR/fuzz_NAME FILE). Exit status: libFuzzer's
# (0: nothing found), 77 (skipped) when clang++-14 or libFuzzer (libclang-rt-14-dev) is
# missing, 2 on bad usage.
set -euo pipefail

if [ $# -lt 4 ] || [ "$4" != "--" ]; then
  echo "usage: run_fuzz.sh NAME WORK_DIR SEED_DIR -- SOURCES/FLAGS..." >&2
  exit 2
fi
name=$1
work=$2
seeds=$3
shift 4
seconds=${KCACHE_FUZZ_SECONDS:-20}
cxx=${KCACHE_FUZZ_CXX:-clang++-14}
jobs=${KCACHE_FUZZ_JOBS:-2}

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIPPED: $cxx not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 77
fi
if [ ! -d "$seeds" ]; then
  echo "run_fuzz.sh: seed directory $seeds is missing" >&2
  exit 2
fi

sources=() cflags=() ldflags=() include_dirs=()
for arg in "$@"; do
  case "$arg" in
    *.cpp | *.cc) sources+=("$arg") ;;
    pkg:*)
      pkg=${arg#pkg:}
      read -r -a more <<<"$(pkg-config --cflags "$pkg")"
      cflags+=("${more[@]}")
      read -r -a more <<<"$(pkg-config --libs "$pkg")"
      ldflags+=("${more[@]}") ;;
    -l* | -L* | -Wl,*) ldflags+=("$arg") ;;
    -I*) cflags+=("$arg"); include_dirs+=("${arg#-I}") ;;
    *) cflags+=("$arg") ;;
  esac
done
if [ ${#sources[@]} -eq 0 ]; then
  echo "run_fuzz.sh: no sources for $name" >&2
  exit 2
fi

sanitize=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
compile=("$cxx" -std=c++20 -g -O1 -fno-omit-frame-pointer "${sanitize[@]}" "${cflags[@]}")
objdir=$work/obj
binary=$work/fuzz_$name
mkdir -p "$work/corpus" "$objdir"

# A change of flags (or compiler) rebuilds everything.
flags_file=$objdir/flags
if [ ! -f "$flags_file" ] || [ "$(cat "$flags_file")" != "${compile[*]}" ]; then
  rm -f "$objdir"/*.o "$binary"
  printf '%s' "${compile[*]}" >"$flags_file"
fi

probe_ok=$work/probe.ok
if [ ! -f "$probe_ok" ]; then
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$work/probe.cpp"
  if ! "$cxx" -fsanitize=fuzzer "$work/probe.cpp" -o "$work/probe" >/dev/null 2>&1; then
    echo "SKIPPED: $cxx cannot link libFuzzer (apt-get install libclang-rt-14-dev)" >&2
    exit 77
  fi
  touch "$probe_ok"
fi

# True when $1 (an object or the binary) is older than $2 or than this script or any
# header under the -I directories.
stale() {
  local out=$1 src=$2
  [ -f "$out" ] || return 0
  [ "$src" -nt "$out" ] || [ "$0" -nt "$out" ] && return 0
  local dir
  for dir in "${include_dirs[@]}"; do
    if [ -d "$dir" ] && [ -n "$(find "$dir" -newer "$out" \( -name '*.hpp' -o -name '*.h' \) -print -quit)" ]; then
      return 0
    fi
  done
  return 1
}

objects=() pids=()
for src in "${sources[@]}"; do
  obj=$objdir/$(printf '%s' "$src" | tr '/.' '__').o
  objects+=("$obj")
  if stale "$obj" "$src"; then
    echo "compiling $src" >&2
    ( "${compile[@]}" -c "$src" -o "$obj.tmp.$$" && mv "$obj.tmp.$$" "$obj" ) &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done

relink=0
[ -x "$binary" ] || relink=1
for obj in "${objects[@]}"; do
  if [ "$obj" -nt "$binary" ]; then relink=1; fi
done
if [ "$relink" = 1 ]; then
  echo "linking $binary" >&2
  "${compile[@]}" "${objects[@]}" "${ldflags[@]}" -o "$binary.tmp.$$"
  mv "$binary.tmp.$$" "$binary"
fi

# The first corpus directory receives new inputs; the seeds come second, read-only.
# libFuzzer exits 77 on a crash by default, which CTest would report as skipped:
# a crash must fail the test.
# shellcheck disable=SC2086  # KCACHE_FUZZ_ARGS is a list of options
exec "$binary" -error_exitcode=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" ${KCACHE_FUZZ_ARGS:-} "$work/corpus" "$seeds"
