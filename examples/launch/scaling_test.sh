#!/usr/bin/env bash
# The largest layout this machine can host, run with shardopt-bench, beside shardopt-plan's
# prediction for the same preset and layout: one table of predicted and measured Newton-Schulz
# balance (FLOPs max/mean over the ranks), bytes per rank (the state, and what the dense and the
# expert group move per step) and step time. The bytes and the Newton-Schulz FLOPs (as the runtime
# counts them, for the kernels the run used: shardopt-plan --ns-compute) are the planner's exact
# prediction (tests/mpi/plan_vs_runtime.sh): the script exits 1 when a bytes or FLOPs row differs
# (FLOPs: by more than 1e-9 relative), 0 otherwise; times and their ratio are reported, never
# judged.
#
#   examples/launch/scaling_test.sh [--build DIR] [--ranks N] [--layout "FLAGS"] [--machine FILE]
#                                   [--steps N] [--quick] [--json FILE] [--dry-run]
#                                   [-- PRESET_ARGS...]
#
#   --ranks N       ranks (default: the largest this machine hosts: its cores, at least 8, which
#                   then run oversubscribed, fewer if the memory it has available would not hold
#                   them; a multiple of 2)
#   --layout FLAGS  layout flags both tools take (default "--ep 2"): --dp-replicate, --cp, --ep,
#                   --expert-shard-dim, --momentum-dtype
#   --machine FILE  shardopt-plan's machine file for the prediction (default: calibrated now on
#                   this machine, about 30 s: shardopt-plan --calibrate)
#   --steps N       timed steps, after 1 warm-up (default 3)
#   --quick         the tiny preset on 4 ranks, 1 step, no warm-up, and bench/machines/h200.json
#                   unless --machine is given (bytes exact, the step time ratio then meaningless)
#   --json FILE     also write both tools' JSON and the rows to FILE
#   --dry-run       print the two commands instead of running them
#   PRESET_ARGS     the model, given to both tools alike: --preset NAME, --layers L (0 or absent:
#                   all), --width-div D, --experts-div D (absent: 1) (default: --preset glm45-air
#                   --layers 1 --width-div 8 --experts-div 4, as bench/validate_plan.sh)
# As root, mpiexec gets --allow-run-as-root (single_node.sh). Example:
#   examples/launch/scaling_test.sh --ranks 8 --layout "--ep 4" -- --preset qwen3-30b-a3b \
#       --layers 1 --width-div 4 --experts-div 4
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
usage() { # the usage lines to stderr, exit 2; with --help the whole header to stdout, exit 0
    if [ "${1:-}" = help ]; then
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
    fi
    sed -n '9,11p' "$0" | sed 's/^# *//' >&2
    echo "(scaling_test.sh --help says what each option does)" >&2
    exit 2
}
build=$root/build ranks="" layout="--ep 2" machine="" steps=3 warmup=1 quick=0 json="" dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --layout) layout=${2:?}; shift 2 ;;
    --machine) machine=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --quick) quick=1; shift ;;
    --json) json=${2:?}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) usage help ;;
    --) shift; break ;;
    *) echo "scaling_test.sh: unknown option $1" >&2; usage ;;
    esac
done
preset=("$@")
if [ "$quick" -eq 1 ]; then
    [ ${#preset[@]} -gt 0 ] || preset=(--preset tiny --width-div 1 --experts-div 1 --layers 0)
    [ -n "$ranks" ] || ranks=4
    [ -n "$machine" ] || machine=$root/bench/machines/h200.json
    steps=1 warmup=0
fi
[ ${#preset[@]} -gt 0 ] || preset=(--preset glm45-air --layers 1 --width-div 8 --experts-div 4)
# The same model for both tools, every scale explicit: their defaults differ (shardopt-bench
# keeps 2 layers at width / 8, experts / 4; shardopt-plan the whole model), and shardopt-plan
# says "all layers" by leaving --layers out where shardopt-bench takes --layers 0.
name=glm45-air layers=0 wdiv=1 ediv=1
set -- "${preset[@]}"
while [ $# -gt 0 ]; do
    case "$1" in
    --preset) name=${2:?}; shift 2 ;;
    --layers) layers=${2:?}; shift 2 ;;
    --width-div) wdiv=${2:?}; shift 2 ;;
    --experts-div) ediv=${2:?}; shift 2 ;;
    *) echo "scaling_test.sh: $1: PRESET_ARGS take --preset, --layers, --width-div, --experts-div" >&2
       exit 2 ;;
    esac
done
model=(--preset "$name" --width-div "$wdiv" --experts-div "$ediv")
bench_model=("${model[@]}" --layers "$layers") plan_model=("${model[@]}")
[ "$layers" = 0 ] || plan_model+=(--layers "$layers")
bench=$build/bench/shardopt-bench plan=$build/bench/shardopt-plan
for b in "$bench" "$plan"; do
    [ -x "$b" ] || { echo "scaling_test.sh: $b not found: build first, or give --build DIR" >&2; exit 2; }
done
[[ "$ranks" =~ ^[0-9]*$ && "$steps" =~ ^[1-9][0-9]*$ ]] ||
    { echo "scaling_test.sh: --ranks and --steps take a positive integer" >&2; exit 2; }
# shellcheck disable=SC2206
lay=($layout)

# The largest layout: every core, at least 8 ranks (oversubscribed below that), halved while the
# ranks would not fit in the memory available (each: the program and preset, ~256 MiB, and three
# times the state the planner predicts for it)
# (the cores this process may run on: GNU nproc reports OMP_NUM_THREADS or OMP_THREAD_LIMIT
# instead when set, as MPI jobs commonly export OMP_NUM_THREADS=1)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
if [ -z "$ranks" ]; then
    ranks=$cores
    [ "$ranks" -ge 8 ] || ranks=8
    ranks=$((ranks / 2 * 2))
    avail=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo 2>/dev/null || echo 0)
    while [ "$ranks" -gt 2 ] && [ "$avail" -gt 0 ]; do
        state=$("$plan" "${plan_model[@]}" --world "$ranks" "${lay[@]}" --json 2>/dev/null |
            python3 -c 'import json,sys; print(int(json.load(sys.stdin)["layouts"][0]["state_bytes"] / 2**20))' ||
            echo 0)
        [ $((ranks * (256 + 3 * state))) -gt "$avail" ] || break
        ranks=$((ranks / 2))
    done
fi
[ "$ranks" -ge 1 ] || { echo "scaling_test.sh: --ranks must be at least 1" >&2; exit 2; }

tmp=$(mktemp -d /tmp/shardopt_scaling_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# one momentum row (fp32, the planner's default), unless the layout flags say otherwise
bench_cmd=("$here/single_node.sh" --ranks "$ranks" --threads 1 -- "$bench" "${bench_model[@]}"
           --momentum-dtype fp32 "${lay[@]}" --threads 1 --warmup "$warmup" --steps "$steps" --json)
mfile=${machine:-$tmp/machine.json}
# owners chosen at the run's cost rates (config cost_gemm_gflops / cost_net_gbps, left at 0: a CPU
# run's 100 and 25): commit keeps the union plan or the joint one by them, and so does the planner here; the
# times still follow the machine file
plan_cmd=("$plan" "${plan_model[@]}" --world "$ranks" "${lay[@]}" --machine "$mfile"
          --cost-rates 100,25 --json)
if [ "$dry" -eq 1 ]; then
    [ -n "$machine" ] || { printf '%q ' "$plan" --calibrate "$mfile" --threads 1; echo; }
    printf '%q ' "${bench_cmd[@]}"; echo
    printf '%q ' "${plan_cmd[@]}"; echo "--ns-compute <the ns_compute shardopt-bench reports>"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then # the calibration's own mpiexec (ping-pong)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_mpi_yield_when_idle=1
if [ -z "$machine" ]; then
    echo "scaling_test: calibrating this machine for the prediction (shardopt-plan --calibrate)" >&2
    "$plan" --calibrate "$mfile" --threads 1 >&2
fi
echo "scaling_test: measuring: ${bench_model[*]} ${lay[*]} on $ranks ranks ($cores cores)" >&2
"${bench_cmd[@]}" 2>"$tmp/bench.err" | grep '^{"preset"' >"$tmp/bench.json" || {
    echo "scaling_test.sh: shardopt-bench failed; its last words:" >&2
    tail -5 "$tmp/bench.err" >&2
    exit 1
}
# the planner counts the FLOPs of the kernels the run used (ns_compute auto: bf16 where this CPU
# multiplies bf16 natively)
compute=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ns_compute"])' "$tmp/bench.json")
"${plan_cmd[@]}" --ns-compute "$compute" >"$tmp/plan.json"
python3 - "$tmp/bench.json" "$tmp/plan.json" "$mfile" "$ranks" "${plan_model[*]} ${lay[*]}" "$json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
machine, ranks, what, out = sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
m, p = run["results"][0], plan["layouts"][0]
ns_meas = m["ns_flops_max"] / m["ns_flops_mean"] if m["ns_flops_mean"] > 0 else 0.0
# (name, predicted, measured, checked: "bytes" to the byte, "flops" to 1e-9 relative, or None);
# the plan counts one direction of each exchange, the runtime what it sends and receives
# (tests/mpi/plan_vs_runtime.sh)
rows = [("NS FLOPs max/mean over ranks", p["ns_flops_max_over_mean"], ns_meas, None),
        ("NS FLOPs per step, busiest rank", p["ns_flops_max"], m["ns_flops_max"], "flops"),
        ("NS FLOPs per step, mean over ranks", p["ns_flops_mean"], m["ns_flops_mean"], "flops"),
        ("NS time max/mean over ranks", None, m["ns_time_max_over_mean"], None),
        ("state bytes per rank", p["state_bytes"], m["state_bytes_per_rank"], "bytes"),
        ("dense bytes per rank per step", 2 * p["dense_bytes"], m["dense_bytes_per_step"], "bytes"),
        ("expert bytes per rank per step", 2 * p["expert_bytes"], m["expert_bytes_per_step"], "bytes"),
        ("step time (s)", p["step"], m["step_s"], None)]
def num(v, b):
    if v is None:
        return "—"
    return f"{v:,.0f}" if b == "bytes" else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:.4e}")
print(f"\nscaling_test: {what}, {ranks} ranks; predicted with {machine}")
print("| | predicted (shardopt-plan) | measured (shardopt-bench) | measured / predicted |")
print("|---|---:|---:|---:|")
bad = []
for name, pv, mv, b in rows:
    ratio = f"{mv / pv:.3f}" if pv else "—"
    print(f"| {name} | {num(pv, b)} | {num(mv, b)} | {ratio} |")
    if (b == "bytes" and abs(pv - mv) > 0.5) or \
            (b == "flops" and abs(pv - mv) > 1e-9 * max(abs(pv), abs(mv))):
        bad.append(name)
if out:
    json.dump({"ranks": ranks, "layout": what, "machine": machine, "measured": run,
               "predicted": plan, "rows": [{"name": n, "predicted": pv, "measured": mv}
                                           for n, pv, mv, _ in rows]}, open(out, "w"), indent=1)
if bad:
    print("scaling_test: MISMATCH: " + ", ".join(bad))
    sys.exit(1)
print("scaling_test: bytes and NS FLOPs match")
PY
