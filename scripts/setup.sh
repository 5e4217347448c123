#!/usr/bin/env bash
# Installs every Debian package kcache needs, then configures and builds it.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#   BUILD_DIR (default: build)   CMAKE_BUILD_TYPE (default: RelWithDebInfo)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  liblmdb-dev lmdb-utils libzstd-dev libxxhash-dev liblz4-dev
  libfmt-dev libexpected-dev nlohmann-json3-dev libcli11-dev
  catch2 libbenchmark-dev
  libfuse3-dev fuse3 ccache python3
  python3-dev  # Python.h: the multi-user test builds Triton launchers under /usr/bin/python3 (tests/compat/users.py)
  liburing-dev  # kcache-fsd --io-uring (FUSE over io_uring)
  # the libFuzzer targets (tests/support/run_fuzz.sh); clang++-14 for the thread-safety
  # check (scripts/check_thread_safety.sh, a CTest test)
  clang-14 libclang-rt-14-dev
  clang-format-14  # the format check (scripts/check_format.sh, a CTest test)
  # the inspector (gui/): Dear ImGui, GLFW, stb_image_write for --screenshot; Xvfb,
  # xauth and Mesa's llvmpipe for its screenshot test without a display
  libimgui-dev libglfw3-dev libstb-dev xvfb xauth libgl1-mesa-dri
  # the shared tier (remote/): the hiredis client, and redis-server for its tests
  # (redis-cli: the Redis Cluster test joins its nodes with `redis-cli --cluster create`)
  libhiredis-dev redis-server redis-tools
  openssl  # the CLI that makes the TLS tests' CA and certificates (rediss://)
  libssl-dev  # OpenSSL 3: TLS to Redis (remote/src/tls.cpp), signed entries (remote/src/trust.cpp)
  perl  # prove, which runs pjdfstest on the mount (tests/posix)
  xfslibs-dev  # xfs/xfs.h, which fsstress (xfstests, tests/posix/xfstests.py) includes
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The compat suite's real compilers (tests/compat/requirements.txt) in the project venv
# .venv/ (ignored by git). Skipped when .venv already holds exactly those requirements;
# KCACHE_SKIP_VENV=1 skips it altogether (the compat tests then skip, exit 77).
if [ "${KCACHE_SKIP_VENV:-0}" != 1 ]; then
  requirements=tests/compat/requirements.txt
  stamp=.venv/.kcache-requirements
  if [ ! -x .venv/bin/python ] || ! cmp -s "$requirements" "$stamp"; then
    venv_python=$(command -v python3.11 || command -v python3)
    echo "setup: installing the compat suite's compilers into .venv ($venv_python)"
    if "$venv_python" -m venv .venv &&
       .venv/bin/python -m pip install -q --disable-pip-version-check -r "$requirements"; then
      cp "$requirements" "$stamp"
    elif [ "${CI:-}" = true ]; then
      echo "setup: installing $requirements into .venv failed" >&2
      exit 1
    else
      echo "setup: WARNING: installing $requirements into .venv failed;" \
           "the compat tests will skip" >&2
    fi
  fi
fi

build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
