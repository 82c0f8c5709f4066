#!/usr/bin/env bash
# Run an MPI program of shardopt on this node, one rank per core (or fewer ranks than cores,
# each bound to its share), with every SHARDOPT_* variable of this shell passed to the ranks
# (shardopt_init applies them: docs/config.md, the environment rule).
#
#   examples/launch/single_node.sh [--ranks N] [--threads T] [--dry-run] [--] PROGRAM [ARGS...]
#
#   --ranks N    ranks (default: the number of cores)
#   --threads T  OpenMP/BLAS threads per rank (default: cores / ranks, at least 1)
#   --dry-run    print the command instead of running it
# More ranks than cores run oversubscribed (Open MPI yields when idle, so they share fairly).
# As root, Open MPI's --allow-run-as-root is added. Example:
#   examples/launch/single_node.sh --ranks 4 -- build/bench/shardopt-bench --preset tiny --ep 2
set -euo pipefail
# the cores this process may run on: GNU nproc reports OMP_NUM_THREADS (or OMP_THREAD_LIMIT)
# instead when set, and MPI jobs commonly export OMP_NUM_THREADS=1 (one rank was launched then)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
ranks=$cores threads="" dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -*) echo "single_node.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || { echo "usage: single_node.sh [--ranks N] [--threads T] [--dry-run] [--] PROGRAM [ARGS...]" >&2; exit 2; }
[ -n "$threads" ] || threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
# Binding gives each rank its threads' cores: asked for more cores than there are, Open MPI
# fails deep in its mapper ("not enough slots"); say what to change instead.
if [ "$ranks" -le "$cores" ] && [ $(( ranks * threads )) -gt "$cores" ]; then
    echo "single_node.sh: $ranks ranks x $threads threads = $(( ranks * threads )) cores, but this" \
         "node has $cores: use --threads $(( cores / ranks > 0 ? cores / ranks : 1 )) (or leave" \
         "it out), or fewer ranks" >&2
    exit 2
fi
cmd=(mpiexec -n "$ranks")
if [ "$ranks" -gt "$cores" ]; then
    cmd+=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
else
    cmd+=(--map-by "slot:PE=$threads" --bind-to core)
fi
[ "$(id -u)" -eq 0 ] && cmd+=(--allow-run-as-root)
cmd+=(-x "OMP_NUM_THREADS=$threads" -x "OPENBLAS_NUM_THREADS=$threads")
for v in $(compgen -e | grep '^SHARDOPT_' || true); do cmd+=(-x "$v"); done
cmd+=("$@")
if [ "$dry" -eq 1 ]; then
    printf '%q ' "${cmd[@]}"; echo
else
    exec "${cmd[@]}"
fi
