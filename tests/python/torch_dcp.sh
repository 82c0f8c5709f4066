#!/usr/bin/env bash
# test_torch_dcp.py: shardopt.torch.Muon under FSDP2 on 2 ranks, dcp.save, then dcp.load on 1
# (no mpiexec, no mpi4py) and on 4 (FSDP2, uneven shards), and 2 more steps against the 2-rank
# run. Exit 77 without torch.
#   torch_dcp.sh MPIEXEC LIBSHARDOPT
set -euo pipefail
mpiexec=$1 lib=$2
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
d=$(mktemp -d /tmp/shardopt_dcp_XXXXXX)
trap 'rm -rf "$d"' EXIT
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + ($$ + 7) % 20000))
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
"$mpiexec" -n 2 --oversubscribe "$py" "$here/test_torch_dcp.py" save "$d" || exit $?
"$py" "$here/test_torch_dcp.py" load "$d" || exit $?
export MASTER_PORT=$((20000 + ($$ + 11) % 20000))
exec "$mpiexec" -n 4 --oversubscribe "$py" "$here/test_torch_dcp.py" load4 "$d"
