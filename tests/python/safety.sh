#!/usr/bin/env bash
# test_safety.py: the binding refuses every buffer it cannot vouch for, never crashing.
# N = 1: each single-process case in a child process of its own (a segfault is that case's
# failure); N = 2: the collective cases (test_safety_ranks.py) under mpiexec.
# safety.sh MPIEXEC LIBSHARDOPT N
set -euo pipefail
mpiexec=$1 lib=$2 n=$3
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
export SHARDOPT_LIBRARY=$lib
if [ "$n" = 1 ]; then
    exec "$py" "$here/test_safety.py" cases
fi
exec "$mpiexec" -n "$n" --oversubscribe "$py" "$here/test_safety_ranks.py"
