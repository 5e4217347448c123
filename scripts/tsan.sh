#!/usr/bin/env bash
# ThreadSanitizer run of the daemon (issue 12, point 5): builds kcache-fsd, the kcache
# CLI and the tests that drive the daemon with -fsanitize=thread in a build directory
# of their own (build-tsan, or $TSAN_BUILD_DIR), runs every fsd test and the
# reliability tests that drive a mount under it, and fails when any process of the run
# (a test program, a daemon it started, a kcache CLI it ran) reported a race, a lock
# order inversion or another TSan finding.
#
#   scripts/tsan.sh                  # build and run everything (see bench/README.md for times)
#   scripts/tsan.sh -R 'fsd:.*evict' # extra arguments go to ctest
#
# Every report goes to $BUILD/tsan-logs/report.<pid> (the daemons' stderr is the
# fixture's, so stderr alone would lose them); the script prints them and exits 1 if
# there are any. Only third-party noise is suppressed, each with its reason, in
# tests/support/tsan.supp. Not part of CTest or CI: the instrumented build and run take
# longer than CI's budget leaves (see docs/fsd.md, "ThreadSanitizer").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TSAN_BUILD_DIR:-build-tsan}
jobs=${TSAN_JOBS:-2}
flags="-fsanitize=thread -fno-omit-frame-pointer"
# C++ only: the one C target is the tests' kcache_fsd_testlib, which uninstrumented
# Python dlopens through the mount (libtsan cannot be dlopened: "cannot allocate
# memory in static TLS block"). Our shared libraries get no -fsanitize at link time
# either: the instrumented programs that load them bring libtsan.

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKCACHE_WERROR=ON \
    -DKCACHE_BUILD_BENCH=OFF -DKCACHE_BUILD_GUI=OFF \
    -DCMAKE_C_FLAGS= -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS= >/dev/null
targets=(kcache-fsd kcache test_fsd test_fsd_direct test_fsd_unit test_fsd_uring
         test_reliability_crash test_reliability_equivalence test_reliability_soak)
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

logs=$PWD/$build/tsan-logs
rm -rf "$logs" && mkdir -p "$logs"
# die_after_fork=0: the tests fork children from a program with threads (the fixture's
# watchdog); the children only make syscalls and exec, which TSan supports.
# halt_on_error=0: a daemon that stopped at its first report would fail the test for
# the wrong reason; every report is collected instead.
# TSan's shadow memory leaves no room for LMDB's default 1 TiB map (mmap fails with
# EINVAL, which the store does not take for "try smaller"): a smaller one for every
# process of the run.
export KCACHE_MAP_SIZE=${KCACHE_MAP_SIZE:-4G}
export TSAN_OPTIONS="log_path=$logs/report die_after_fork=0 halt_on_error=0 second_deadlock_stack=1 history_size=4 suppressions=$PWD/tests/support/tsan.supp"
# Only the programs built above have tests listed (CTest lists a Catch2 program's tests
# once it is built), so -L picks the fsd tests and the crash, equivalence and soak
# tests, over /dev/fuse and over io_uring (label uring: its fixture needs root, else
# those runs skip); the fuzzers (clang, their own sanitizers) are left out.
status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 \
    -L 'fsd|reliability|uring' -E 'fuzz_' "$@" || status=$?
# The crash test kills daemons on purpose; only real findings count.
reports=$(find "$logs" -type f | sort)
if [[ -n "$reports" ]]; then
    for f in $reports; do
        echo "==== $f"
        cat "$f"
    done
    echo "ThreadSanitizer: $(echo "$reports" | wc -l) process(es) reported findings (above)" >&2
    exit 1
fi
echo "ThreadSanitizer: no findings"
exit "$status"
