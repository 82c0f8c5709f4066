#!/usr/bin/env bash
# Run an MPI program of shardopt on several nodes with Open MPI: one rank per GPU (or per
# --ranks-per-node), ranks mapped node by node so that consecutive ranks (a dense shard group,
# docs/api.md) share a node, each bound to its cores, SHARDOPT_* and the library path passed on
# (shardopt_init applies SHARDOPT_* variables: docs/config.md, the environment rule).
#
#   examples/launch/multi_node.sh --hostfile FILE [--ranks-per-node G] [--threads T] [--dry-run]
#                                 [--] PROGRAM [ARGS...]
#
#   --hostfile FILE      Open MPI hostfile ("node01 slots=8" per line)
#   --ranks-per-node G   default 8 (one per GPU of an HGX node)
#   --threads T          OpenMP/BLAS threads per rank (default 1)
#   --dry-run            print the command instead of running it (used by the tests)
# The rank count is G times the hosts in FILE. Example:
#   examples/launch/multi_node.sh --hostfile hosts -- build/bench/shardopt-bench --preset glm45-air --ep 8
set -euo pipefail
hostfile="" per=8 threads=1 dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    --hostfile) hostfile=$2; shift 2 ;;
    --ranks-per-node) per=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -*) echo "multi_node.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ -n "$hostfile" ] && [ $# -ge 1 ] || { echo "usage: multi_node.sh --hostfile FILE [--ranks-per-node G] [--threads T] [--dry-run] [--] PROGRAM [ARGS...]" >&2; exit 2; }
[ -r "$hostfile" ] || { echo "multi_node.sh: cannot read hostfile $hostfile" >&2; exit 2; }
nodes=$(grep -cv '^[[:space:]]*\(#\|$\)' "$hostfile")
cmd=(mpiexec --hostfile "$hostfile" -n $(( nodes * per )) --map-by "ppr:$per:node:PE=$threads"
     --bind-to core --report-bindings)
[ "$(id -u)" -eq 0 ] && cmd+=(--allow-run-as-root)
cmd+=(-x "OMP_NUM_THREADS=$threads" -x "OPENBLAS_NUM_THREADS=$threads" -x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && cmd+=(-x LD_LIBRARY_PATH)
for v in $(compgen -e | grep '^SHARDOPT_' || true); do cmd+=(-x "$v"); done
cmd+=("$@")
if [ "$dry" -eq 1 ]; then
    printf '%q ' "${cmd[@]}"; echo
else
    exec "${cmd[@]}"
fi
