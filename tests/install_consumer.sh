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
# The documented one-line build through pkg-config, from this non-default prefix: plain cc (the
# MPI flags come from the .pc's Requires), run without LD_LIBRARY_PATH (the .pc's rpath), linked
# to the installed library. The .pc once named the configure-time prefix (/usr/local).
flags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs shardopt)
case "$flags" in
*"$work/prefix/"*) ;;
*) echo "install_consumer: pkg-config flags do not name the prefix: $flags"; exit 1 ;;
esac
cc -std=c11 "$src/examples/consumer/main.c" -o "$work/consumer_pc" $flags >"$work/pc.log" 2>&1 ||
    { cat "$work/pc.log"; echo "install_consumer: the pkg-config build failed: cc ... $flags"; exit 1; }
# ldd's output taken whole first: `ldd | grep -q` under pipefail fails at random (grep -q exits
# at the first match and ldd, still writing, dies of SIGPIPE)
libs=$(ldd "$work/consumer_pc")
grep -q "libshardopt.* => $work/prefix/.*libshardopt" <<<"$libs" ||
    { ldd "$work/consumer_pc"; echo "install_consumer: pkg-config build not linked to the installed library"; exit 1; }
env -u LD_LIBRARY_PATH "$mpiexec" -n 1 "$work/consumer_pc"
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# the consumer must run against the installed library, not the build tree's
ldd "$work/consumer/consumer" | grep -F "$work/prefix/lib/libshardopt" ||
    { ldd "$work/consumer/consumer"; echo "install_consumer: not linked to the installed library"; exit 1; }
"$mpiexec" -n 1 "$work/consumer/consumer"
# SHARDOPT_CONFIG_INIT's apply_env: init applies the environment, so a bad launcher setting is
# refused with the variable named instead of being ignored
if out=$(SHARDOPT_OFFLOAD=bogus "$mpiexec" -n 1 "$work/consumer" 2>&1); then
    echo "install_consumer: SHARDOPT_OFFLOAD=bogus was ignored: $out"; exit 1
fi
grep -q "SHARDOPT_OFFLOAD (env) = 'bogus'" <<<"$out" ||
    { echo "install_consumer: SHARDOPT_OFFLOAD=bogus refused without naming it: $out"; exit 1; }
