#!/usr/bin/env bash
# `cmake --install` of the build tree into a temporary prefix, then a consumer built
# against it with find_package(kcache) and with pkg-config (kcache-loader.pc); both
# open a plain cache entry. Also runs the installed `kcache` (its RPATH finds the
# installed libraries). Run by CTest (loader:install_package).
#   test_install.sh BUILD_DIR WORK_DIR CMAKE CXX CC
set -euo pipefail
build=$1 work=$2 cmake=$3 cxx=$4 cc=$5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
for f in include/kcache/loader.h include/kcache/loader.hpp lib/libkcache_loader.so \
         lib/libkcache_core.so.0 lib/cmake/kcache/kcacheConfig.cmake lib/pkgconfig/kcache-loader.pc; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
if [ -e "$prefix/include/kcache/core" ] || [ -e "$prefix/include/kcache/loader/introspect.hpp" ]; then
  echo "internal headers were installed" >&2
  exit 1
fi
"$prefix/bin/kcache" --version

# A plain cache with one entry: PTX for sm_80 (chosen for sm_90, to JIT) and its
# signature.
cache=$work/cache/k1
mkdir -p "$cache"
printf '%s' '{"kcache_signature": 1, "kernel": "axpy", "params": [], "block": [64]}' >"$cache/axpy.json"
printf '.version 8.0\n.target sm_80\n.address_size 64\n.visible .entry axpy()\n{\n\tret;\n}\n' >"$cache/axpy.ptx"

expect_cpp="directory axpy.ptx ptx axpy 64
KCACHE_ERROR_NO_DRIVER"
expect_c="directory axpy.ptx"

# find_package
"$cmake" -S "$here" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" >"$work/consumer.log"
"$cmake" --build "$work/consumer" >>"$work/consumer.log"
out=$("$work/consumer/consumer_cpp" "$work/cache" k1)
[ "$out" = "$expect_cpp" ] || { echo "find_package consumer_cpp: got '$out'" >&2; exit 1; }
out=$("$work/consumer/consumer_c" "$work/cache" k1)
[ "$out" = "$expect_c" ] || { echo "find_package consumer_c: got '$out'" >&2; exit 1; }

# pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs kcache-loader)
"$cxx" -std=c++17 "$here/consumer.cpp" $flags -Wl,-rpath,"$prefix/lib" -o "$work/pc_consumer_cpp"
"$cc" "$here/consumer.c" $flags -Wl,-rpath,"$prefix/lib" -o "$work/pc_consumer_c"
out=$("$work/pc_consumer_cpp" "$work/cache" k1)
[ "$out" = "$expect_cpp" ] || { echo "pkg-config consumer_cpp: got '$out'" >&2; exit 1; }
out=$("$work/pc_consumer_c" "$work/cache" k1)
[ "$out" = "$expect_c" ] || { echo "pkg-config consumer_c: got '$out'" >&2; exit 1; }
echo "installed package: find_package and pkg-config consumers work"
