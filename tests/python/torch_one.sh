#!/usr/bin/env bash
# One of the one-process torch tests (test_torch_optim.py, test_torch_dropin.py,
# test_torch_scripts.py, test_torch_betas.py, test_torch_ports.py: shardopt.torch.Muon as a
# torch.optim optimizer, no mpiexec, since it must work without one) against the library just
# built. Exit 77 where torch is not importable.
#   torch_one.sh SCRIPT LIBSHARDOPT [CASE ...]
set -euo pipefail
script=$1
lib=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" "$here/$script" "$@"
