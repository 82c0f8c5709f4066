#!/usr/bin/env bash
# Save a 2-rank checkpoint with bf16 momentum and the weights (ckpt_weights), then check its files
# with Python's safetensors, and reassemble every parameter from index.json.
#   interop.sh MPIEXEC TEST_CKPT DIR
set -eu
mpiexec=$1 exe=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir/report"
env SHARDOPT_TEST_DIR="$dir/ckpt" SHARDOPT_TEST_DTYPE=bf16 SHARDOPT_TEST_WEIGHTS=1 \
    SHARDOPT_TEST_LAYOUT=1,2,1,1,0 SHARDOPT_TEST_MODE=save SHARDOPT_TEST_REPORT="$dir/report" \
    "$mpiexec" -n 2 --oversubscribe "$exe"
python3 "$(dirname "$0")/check_safetensors.py" "$dir/ckpt/$(cat "$dir/ckpt/latest")" "$dir/report"
rm -rf "$dir"
