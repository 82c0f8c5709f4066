#!/usr/bin/env bash
# test_torch_dropin.py: shardopt.torch.Muon in training code as others write it (nanoGPT,
# modded-nanogpt, HF / Lightning habits), one process. Exit 77 where torch is not importable.
#   torch_dropin.sh LIBSHARDOPT [CASE ...]
set -euo pipefail
lib=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)')
export SHARDOPT_LIBRARY=$lib PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" "$here/test_torch_dropin.py" "$@"
