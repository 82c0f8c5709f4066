#!/usr/bin/env bash
# Sweep rank counts and layouts with shardopt-bench on this node (through single_node.sh) and
# collect the JSON of every run into one Markdown table (and, with --json FILE, one JSON file).
#
#   examples/launch/scaling_test.sh [--build DIR] [--ranks 1,2,4] [--layouts "L1/L2"]
#                                    [--json FILE] [-- BENCH_ARGS...]
#
#   --layouts  '/'-separated shardopt-bench layout flags (default "--ep 1")
#   BENCH_ARGS go to every run (default: --preset tiny --steps 3 --warmup 1)
# Example: examples/launch/scaling_test.sh --ranks 1,2,4 --layouts "--ep 1/--ep 2 --cp 2" \
#            -- --preset glm45-air --layers 1 --width-div 8 --experts-div 4
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/../../build ranks=1,2,4 layouts="--ep 1" json=""
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "scaling_test.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--preset tiny --steps 3 --warmup 1)
out=$(mktemp /tmp/shardopt_scaling_XXXXXX.jsonl)
trap 'rm -f "$out"' EXIT
IFS='/' read -r -a lays <<<"$layouts"
for n in ${ranks//,/ }; do
    for l in "${lays[@]}"; do
        echo "scaling_test: $n rank(s), $l" >&2
        # shellcheck disable=SC2086
        "$here/single_node.sh" --ranks "$n" --threads 1 -- "$build/bench/shardopt-bench" \
            "${args[@]}" $l --threads 1 --json 2>/dev/null | grep '^{"preset"' >>"$out" ||
            echo "scaling_test: $n rank(s), $l: no result (a layout this rank count cannot take?)" >&2
    done
done
python3 - "$out" "$json" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| ranks | layout (replicate x shard x cp, ep) | offload | momentum | step (max over ranks) | "
      "state / rank | dense bytes / step | expert bytes / step |\n|---|---|---|---|---|---|---|---|")
for r in runs:
    shard = r["dp_shard"] if r["dp_shard"] > 0 else r["ranks"] // (r["dp_replicate"] * r["cp"])
    for x in r["results"]:
        print(f"| {r['ranks']} | {r['dp_replicate']} x {shard} x {r['cp']}, ep {r['ep']} | "
              f"{x['offload']} | {x['momentum']} | {x['step_s'] * 1e3:.1f} ms | "
              f"{x['state_bytes_per_rank'] / 2**20:.2f} MiB | {x['dense_bytes_per_step'] / 2**20:.2f} MiB | "
              f"{x['expert_bytes_per_step'] / 2**20:.2f} MiB |")
if sys.argv[2]:
    json.dump(runs, open(sys.argv[2], "w"), indent=1)
PY
