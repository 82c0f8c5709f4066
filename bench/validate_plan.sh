#!/usr/bin/env bash
# Calibrated shardopt-plan against shardopt-bench on this machine (issue 8's check: within
# +-25 % at 1, 2 and 4 ranks for two presets). A benchmark script, not a CTest test: it times
# real steps. Run from anywhere:
#   bench/validate_plan.sh [BUILD_DIR]      (default: build)
# Prints one row per preset and rank count (measured, predicted, ratio) and exits 1 if any
# prediction is off by more than 25 %.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bd=${1:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mpiexec=$(command -v mpiexec)
cal=$(mktemp /tmp/shardopt_cal_XXXXXX.json)
trap 'rm -f "$cal"' EXIT
"$bd/bench/shardopt-plan" --calibrate "$cal" --threads 1 >&2
presets=("glm45-air --layers 1 --width-div 8 --experts-div 4"
         "qwen3-30b-a3b --layers 1 --width-div 4 --experts-div 4")
fail=0
printf '| preset (scaled) | ranks | measured step | predicted step | predicted / measured |\n'
printf '|---|---|---|---|---|\n'
for p in "${presets[@]}"; do
    for n in 1 2 4; do
        # shellcheck disable=SC2086
        meas=$("$mpiexec" -n "$n" --oversubscribe "$bd/bench/shardopt-bench" --preset $p \
            --threads 1 --warmup 1 --steps 3 --json 2>/dev/null | grep '^{"preset"' |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["step_s"])')
        # shellcheck disable=SC2086
        pred=$("$bd/bench/shardopt-plan" --preset $p --world "$n" --machine "$cal" --json |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["layouts"][0]["step"])')
        python3 - "$p" "$n" "$meas" "$pred" <<'PY' || fail=1
import sys
p, n, m, q = sys.argv[1].split()[0], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = q / m
print(f"| {p} | {n} | {m * 1e3:.1f} ms | {q * 1e3:.1f} ms | {r:.2f}{'' if 0.75 <= r <= 1.25 else ' (outside +-25 %)'} |")
sys.exit(0 if 0.75 <= r <= 1.25 else 1)
PY
    done
done
exit $fail
