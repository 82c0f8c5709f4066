#!/usr/bin/env bash
# test_torch_dropin_np2.py under mpiexec with 2 ranks: shardopt.torch.Muon's refusal of a
# parameter unfrozen on one rank, and a momentum warmup on 2 ranks against one process. Exit 77
# without torch.   torch_dropin_np2.sh MPIEXEC LIBSHARDOPT
set -euo pipefail
mpiexec=$1 lib=$2
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$mpiexec" -n 2 --oversubscribe "$py" "$here/test_torch_dropin_np2.py"
