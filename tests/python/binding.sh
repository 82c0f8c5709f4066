#!/usr/bin/env bash
# The Python binding against the C API: a model's data (tiny preset, 3 steps of gradients),
# the C reference run (bench/compare_driver run, one process), then test_binding.py under
# mpiexec with N ranks.   binding.sh MPIEXEC COMPARE_DRIVER LIBSHARDOPT N
set -euo pipefail
mpiexec=$1 driver=$2 lib=$3 n=$4
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d /tmp/shardopt_binding_XXXXXX)
trap 'rm -rf "$d"' EXIT
"$driver" manifest --preset tiny --width-div 1 --experts-div 1 "$d/manifest.json"
python3 - "$d" <<'PY'
import json, os, sys
import numpy as np
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
m.update(steps=3, lr=0.02, weight_decay=0.01)
json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
rng = np.random.default_rng(7)
shapes = [t["shape"] for t in m["tensors"]]
np.concatenate([(0.05 * rng.standard_normal(s)).astype(np.float32).ravel() for s in shapes]).tofile(os.path.join(d, "params.bin"))
for k in range(3):
    np.concatenate([rng.standard_normal(s).astype(np.float32).ravel() for s in shapes]).tofile(os.path.join(d, f"grads_{k}.bin"))
PY
"$driver" run "$d" >/dev/null
# the interpreter that has numpy and mpi4py, by path (mpiexec may resolve python3 elsewhere)
py=$(python3 -c 'import sys; print(sys.executable)')
SHARDOPT_LIBRARY=$lib "$mpiexec" -n "$n" --oversubscribe "$py" "$here/test_binding.py" "$d"
