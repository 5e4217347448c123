#!/usr/bin/env bash
# Clang's thread-safety analysis over kcache's product sources (issue 20, Deliver 6;
# every component since issue 34): every source of core, remote, gui, loader, cli and
# fsd (not the tests, benches or third-party code) compiles with -Wthread-safety
# -Wthread-safety-beta -Werror, so a field touched without the lock that guards it
# (GUARDED_BY), a function called without the lock it REQUIRES, or two locks taken
# against THE LOCK ORDER (fsd/src/daemon/lock_order.hpp; clang 14 checks ACQUIRED_BEFORE/AFTER
# only under -beta) fails.
#
#   scripts/check_thread_safety.sh BUILD                  # every product source of BUILD
#   scripts/check_thread_safety.sh BUILD fsd/src/state/a.cpp .. # only these (product sources)
#
# BUILD is a configured build directory (its compile_commands.json: CMake writes it,
# CMAKE_EXPORT_COMPILE_COMMANDS is on); nothing is built, each source is only parsed
# and analyzed (-fsyntax-only) with the flags it is compiled with. The build itself
# may use GCC: the annotations (core/include/kcache/core/thread_annotations.hpp) are
# empty there. Runs as a CTest test (static:); exits 77 (skipped, with a message)
# when clang++-14 is not installed. Exit 1 names each failing file with clang's output.
set -euo pipefail
cd "$(dirname "$0")/.."
if (($# < 1)); then
    echo "usage: scripts/check_thread_safety.sh BUILD [FILE...]" >&2
    exit 2
fi
build=$1
shift
clang=$(command -v clang++-14 || true)
if [[ -z "$clang" ]]; then
    echo "check_thread_safety: clang++-14 is not installed (apt-get install clang-14): skipped" >&2
    exit 77
fi
db=$build/compile_commands.json
if [[ ! -f "$db" ]]; then
    echo "check_thread_safety: no $db (configure $build with cmake first)" >&2
    exit 1
fi
jobs=${KCACHE_CHECK_JOBS:-$(nproc)}
exec python3 - "$db" "$clang" "$PWD" "$jobs" "$@" <<'EOF'
import concurrent.futures, json, os, shlex, subprocess, sys

db, clang, root, jobs, only = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
# The product: each component's sources (its tests are under tests/, its benches under
# bench/; third-party sources lie outside the tree).
COMPONENTS = ("core", "remote", "gui", "loader", "cli", "fsd")
product = tuple(os.path.join(os.path.realpath(root), c) + os.sep for c in COMPONENTS)
wanted = {os.path.realpath(os.path.join(root, f)) for f in only}
# The sources' own flags (GCC's, in the build) plus these. Not clang's: GCC's warning
# options it lacks, and compound literals (libfuse's FUSE_BUFVEC_INIT; GCC takes them).
FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Wthread-safety-beta", "-Werror",
         "-Wno-unknown-warning-option", "-Wno-c99-extensions", "-ferror-limit=0"]

def command_of(entry):
    args = entry.get("arguments") or shlex.split(entry["command"])
    # Drop a compiler launcher (ccache) and the compiler; drop the output.
    while args and os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    out, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c":
            out.append(a)
    return [clang] + out + FLAGS  # last: after the sources' -Wpedantic

entries = []
seen = set()
for e in json.load(open(db)):
    path = os.path.realpath(os.path.join(e["directory"], e["file"]))
    if not path.startswith(product) or path in seen:
        continue
    if wanted and path not in wanted:
        continue
    seen.add(path)
    entries.append((path, e))
missing = wanted - seen
if missing:
    print("check_thread_safety: not product sources of this build: " +
          ", ".join(sorted(missing)), file=sys.stderr)
    sys.exit(1)
if not entries:
    print(f"check_thread_safety: no product source in {db}", file=sys.stderr)
    sys.exit(1)

def check(item):
    path, e = item
    r = subprocess.run(command_of(e), cwd=e["directory"], capture_output=True, text=True)
    return path, r.returncode, r.stdout + r.stderr

failed = []
with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
    for path, rc, output in pool.map(check, sorted(entries)):
        if rc != 0:
            failed.append(path)
            sys.stderr.write(output)
rel = lambda p: os.path.relpath(p, root)
if failed:
    print(f"check_thread_safety: {len(failed)} of {len(entries)} product sources fail clang's "
          "thread-safety analysis: " + ", ".join(map(rel, failed)), file=sys.stderr)
    sys.exit(1)
which = (f"the {len(entries)} product sources given" if only else
         f"all {len(entries)} product sources ({', '.join(COMPONENTS)})")
print(f"check_thread_safety: {which} pass clang's -Wthread-safety -Wthread-safety-beta -Werror")
EOF
