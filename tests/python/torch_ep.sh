#!/usr/bin/env bash
# test_torch_ep.py under mpiexec with 2 ranks: expert stacks under ep = 2 through
# shardopt.torch.Muon ('ep' DTensors, EP-local tensors) against one process. Exit 77 without
# torch.   torch_ep.sh MPIEXEC LIBSHARDOPT
set -euo pipefail
mpiexec=$1 lib=$2
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + ($$ + 13) % 20000))
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$mpiexec" -n 2 --oversubscribe "$py" "$here/test_torch_ep.py"
