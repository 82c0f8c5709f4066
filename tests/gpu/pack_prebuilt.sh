#!/usr/bin/env bash
# Packs a CUDA build made on this (Debian) machine, with the Debian runtime libraries it needs
# (Open MPI with its plugins and help files, PMIx, hwloc, OpenBLAS, oneDNN, cJSON, ISA-L), into one
# archive for a GPU machine whose image has CUDA but none of those libraries:
#   tests/gpu/pack_prebuilt.sh BUILD_DIR ARCHIVE.tar.xz
# On the GPU machine, SHARDOPT_GPU_PREBUILT=ARCHIVE tests/gpu/device_check.sh OUTDIR unpacks it
# and runs the full GPU suite (layouts over MPI, offload, step_bench) without configuring or
# compiling there. CUDA itself (cudart, cuBLAS, NCCL) is not packed: the GPU machine's own is
# used, so the build must target a CUDA major version that machine has.
set -euo pipefail
bd=$(cd "${1:?usage: pack_prebuilt.sh BUILD_DIR ARCHIVE}" && pwd)
archive=$(realpath -m "${2:?usage: pack_prebuilt.sh BUILD_DIR ARCHIVE}")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
multiarch=/usr/lib/x86_64-linux-gnu

# the build tree, without objects and static archives; it is unpacked at the same absolute path
# because CTest's files and the executables' RPATHs name it
mkdir -p "$stage/build"
(cd "$bd" && find . -path '*/CMakeFiles' -prune -o -type f ! -name '*.o' ! -name '*.a' -print |
    tar -cf - -T -) | tar -xf - -C "$stage/build"
(cd "$bd" && find . -path '*/CMakeFiles' -prune -o -type l -print | tar -cf - -T -) |
    tar -xf - -C "$stage/build"
echo "$bd" >"$stage/build_path"

# libraries that the GPU image lacks; not the C/C++ runtime (libc, libstdc++, libgomp, ...),
# which the image has in a newer version that must win
mkdir -p "$stage/lib"
copy_lib() { cp -L "$1" "$stage/lib/$(basename "$1")"; }
for l in libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libevent_core-2.1.so.7 \
    libevent_pthreads-2.1.so.7 libhwloc.so.15 libOpenCL.so.1 libcjson.so.1 libdnnl.so.2 libisal.so.2 \
    libgfortran.so.5 libquadmath.so.0 libnuma.so.1 libudev.so.1 libmca_common_sm.so.40 \
    libmca_common_ompio.so.41 libmca_common_monitoring.so.50; do
    copy_lib "$multiarch/$l"
done
copy_lib "$(ldd "$bd/libshardopt.so" | awk '/libopenblas/ {print $3}')"
copy_lib "$multiarch/pmix2/lib/libpmix.so.2"

# Open MPI's and PMIx's plugins, help files and settings, found on the GPU machine through
# OPAL_PKGLIBDIR and friends (device_check.sh): the image may have another Open MPI's plugins at
# the compiled-in paths, built against another PMIx
mkdir -p "$stage/ompi/plugins" "$stage/ompi/share" "$stage/ompi/etc" "$stage/ompi/pmix" "$stage/bin"
cp -a "$multiarch/openmpi/lib/openmpi3/." "$stage/ompi/plugins/"
cp -a /usr/share/openmpi/. "$stage/ompi/share/"
cp -a /etc/openmpi/. "$stage/ompi/etc/"
cp -a "$multiarch/pmix2/lib/pmix/." "$stage/ompi/pmix/"
cp -L /usr/bin/orterun /usr/bin/orted "$stage/bin/"
tar -C "$stage" -cJf "$archive" .
du -h "$archive"
