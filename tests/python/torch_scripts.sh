#!/usr/bin/env bash
# test_torch_scripts.py: shardopt.torch.Muon under more training-script habits (GradScaler's
# skipped steps, gradient accumulation, checkpoints resumed into new objects, param_groups
# edited by hand, torch.optim's own state dicts), one process. Exit 77 where torch is not
# importable.
#   torch_scripts.sh LIBSHARDOPT [CASE ...]
set -euo pipefail
lib=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" "$here/test_torch_scripts.py" "$@"
