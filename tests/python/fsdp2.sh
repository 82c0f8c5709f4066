#!/usr/bin/env bash
# test_fsdp2.py under mpiexec with 2 ranks: FSDP2 (gloo, CPU) + shardopt.torch_params against
# one process. Exit 77 (from every rank) where torch is not importable.
#   fsdp2.sh MPIEXEC LIBSHARDOPT
set -euo pipefail
mpiexec=$1 lib=$2
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
# a port of its own for torch.distributed's rendezvous, so parallel ctest runs do not collide
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + $$ % 20000))
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$mpiexec" -n 2 --oversubscribe "$py" "$here/test_fsdp2.py"
