#!/usr/bin/env bash
# The launchers' commands without running them (examples/launch, --dry-run / DRY_RUN=1): the
# hostfile's node count times ranks per node, node-by-node mapping and binding, SHARDOPT_*
# passed through, srun with PMIx; wrong use refused with a usage line.
set -uo pipefail
L=$(cd "$(dirname "$0")/../examples/launch" && pwd)
fail=0
expect() { # expect DESCRIPTION OUTPUT PATTERN...
    local what=$1 out=$2; shift 2
    for p in "$@"; do
        grep -qF -- "$p" <<<"$out" || { echo "FAIL: $what: no '$p' in: $out"; fail=1; }
    done
}
h=$(mktemp); trap 'rm -f "$h"' EXIT
printf 'node01 slots=8\nnode02 slots=8\n# spare\n\nnode03 slots=8\n' >"$h"
out=$(SHARDOPT_LOG_LEVEL=info "$L/multi_node.sh" --hostfile "$h" --dry-run -- prog --ep 8)
expect multi_node "$out" "--hostfile $h" "-n 24" "ppr:8:node:PE=1" "--bind-to core" "-x SHARDOPT_LOG_LEVEL" "prog --ep 8"
out=$(SHARDOPT_LOG_LEVEL=info "$L/multi_node.sh" --hostfile "$h" --ranks-per-node 4 --threads 2 --dry-run prog)
expect "multi_node 4 per node" "$out" "-n 12" "ppr:4:node:PE=2" "OMP_NUM_THREADS=2"
out=$(SHARDOPT_LOG_LEVEL=warn "$L/single_node.sh" --ranks 64 --dry-run -- prog)
expect "single_node oversubscribed" "$out" "-n 64" "--oversubscribe" "-x SHARDOPT_LOG_LEVEL" "prog"
out=$(SHARDOPT_NS_STEPS=5 DRY_RUN=1 bash "$L/slurm.sbatch" prog --preset tiny)
expect slurm "$out" "srun --mpi=pmix --cpu-bind=cores" "prog --preset tiny"
"$L/multi_node.sh" --dry-run prog >/dev/null 2>&1 && { echo "FAIL: multi_node without --hostfile ran"; fail=1; }
"$L/single_node.sh" --bogus prog >/dev/null 2>&1 && { echo "FAIL: single_node accepted --bogus"; fail=1; }
# the cores, whatever OMP_NUM_THREADS says: GNU nproc reports it instead when set, so an MPI job's
# usual OMP_NUM_THREADS=1 made single_node.sh launch 1 rank (and scaling_test.sh size its
# largest layout from 1 core); no launcher asks bare nproc
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
out=$(OMP_NUM_THREADS=1 OMP_THREAD_LIMIT=1 "$L/single_node.sh" --dry-run prog)
expect "single_node with OMP_NUM_THREADS=1" "$out" "-n $cores " "OMP_NUM_THREADS=1"
if grep -nE '(^|[^-])\<nproc\>($|[^-])' "$L"/*.sh "$L"/*.sbatch |
    grep -vE ':[0-9]+:[[:space:]]*#|env -u OMP_NUM_THREADS'; then
    echo "FAIL: a launcher asks nproc with OMP_NUM_THREADS set (lines above)"; fail=1
fi
# ranks x threads over the cores: refused with what to change (Open MPI failed in its mapper)
over=$(( cores + 1 ))
out=$(OMP_NUM_THREADS=1 "$L/single_node.sh" --ranks 1 --threads "$over" --dry-run prog 2>&1) &&
    { echo "FAIL: single_node accepted 1 x $over threads on $cores cores"; fail=1; }
expect "single_node too many threads" "$out" "1 ranks x $over threads = $over cores, but this node has $cores" "use --threads"
[ $fail -eq 0 ] && echo "launch_dry_run: ok"
exit $fail
