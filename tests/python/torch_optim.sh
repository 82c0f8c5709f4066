#!/usr/bin/env bash
# test_torch_optim.py: shardopt.torch.Muon as a torch.optim optimizer, one process (no mpiexec:
# it must work without one). Exit 77 where torch is not importable.
#   torch_optim.sh LIBSHARDOPT [CASE ...]
set -euo pipefail
lib=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" "$here/test_torch_optim.py" "$@"
