#!/usr/bin/env bash
# Install the Debian packages shardopt builds against, only those that are missing. Safe to run
# any number of times; needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhwloc-dev
          libopenblas-dev libopenblas-openmp-dev libcjson-dev libdnnl-dev libisal-dev)
# --fuzz: also clang and its runtime with libFuzzer (make check-fuzz)
[ "${1:-}" = "--fuzz" ] && packages+=(clang libclang-rt-14-dev)

# --torch: only torch from PyPI, and only when `import torch` fails (CI runs the torch tests
# this way; `make test` runs them whenever torch is importable and never installs it). About
# 3 GB with its nvidia wheels: 6 minutes here.
if [ "${1:-}" = "--torch" ]; then
    python3 -c "import torch" 2>/dev/null && exit 0
    echo "install_deps: pip install torch"
    exec python3 -m pip install --quiet --disable-pip-version-check torch
fi

# Python modules: the interop test reads checkpoints with safetensors; the Python binding's
# tests run under mpirun with numpy and mpi4py (a binary wheel that uses the system's Open MPI)
python_deps() {
    command -v python3 >/dev/null || return 0
    python3 -c "import numpy, safetensors, mpi4py" 2>/dev/null && return 0
    echo "install_deps: pip install numpy safetensors mpi4py"
    python3 -m pip install --quiet --disable-pip-version-check numpy safetensors mpi4py
}

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    python_deps
    exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# a fresh image may have no package lists yet; refresh only when the install cannot proceed
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}" ||
    { $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; }
python_deps
