#!/usr/bin/env bash
# `cmake --install` of this build into a fresh prefix, then examples/consumer configured with
# find_package(shardopt) against it, built and run (with the header, the CMake package, and the
# pkg-config file checked to be where the docs say).
#   install_consumer.sh BUILD_DIR SOURCE_DIR MPIEXEC
set -euo pipefail
build=$1 src=$2 mpiexec=$3
work=$(mktemp -d /tmp/shardopt_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
for f in include/shardopt.h lib/cmake/shardopt/shardoptConfig.cmake \
         lib/cmake/shardopt/shardoptTargets.cmake lib/pkgconfig/shardopt.pc; do
    [ -f "$work/prefix/$f" ] || { echo "install: $f missing"; exit 1; }
done
ls "$work/prefix"/lib/libshardopt.so* >/dev/null
PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --libs shardopt | grep -q -- '-lshardopt'
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# the consumer must run against the installed library, not the build tree's
ldd "$work/consumer/consumer" | grep -F "$work/prefix/lib/libshardopt" ||
    { ldd "$work/consumer/consumer"; echo "install_consumer: not linked to the installed library"; exit 1; }
"$mpiexec" -n 1 "$work/consumer/consumer"
