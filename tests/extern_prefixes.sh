#!/usr/bin/env bash
# Every extern function or object of the library starts with its file's prefix (issue 19): the
# file's name and "_" (plan.c: plan_*), the name itself (state_check.c: state_check), shardopt_
# (the public API), or a short form the table below declares with its reason. A name with
# another prefix (shard_load in ns_sharded.c, tl_lap in timeline.c) hides where it lives.
# Usage: extern_prefixes.sh OBJECT_LIST: a file naming the library's objects, one a line
# (tests/CMakeLists.txt writes it from the object libraries: no stale object of a renamed file).
set -euo pipefail

# file (relative to the source root) -> further prefixes its externs may have
declare -A short=(
    [base/status.c]="log_fail"               # the error idiom every layer calls (base/status.h)
    [kernels/cpu/cpu_features.c]="cpu_"
    [kernels/cpu/elementwise_ref.c]="ref_"   # the variants' kernels: ref_, avx2_, avx512_
    [kernels/cpu/elementwise_avx2.c]="avx2_"
    [kernels/cpu/elementwise_avx512.c]="avx512_"
    [kernels/cpu/misc_ref.c]="cpu_"          # the CPU backend's ops (kernels/cpu/tables.c)
    [kernels/cpu/tables.c]="cpu_ kernel_ops_cpu_ device_ops_cpu"
    [kernels/cpu/ns_common.c]="ns_"
    [kernels/cpu/ns_gram.c]="ns_"
    [kernels/cpu/ns_variant_table.c]="ns_"
    [kernels/cpu/ns_sharded_kernels.c]="ns_shard_"
    [kernels/cpu/ns_bf16_run.c]="ns_bf16_" # bf16 NS's step half: ns_bf16.h declares both files' functions
    [kernels/cuda/elementwise.cu]="cuda_ k_" # k_: device kernels (__global__)
    [kernels/cuda/ns_cuda.cu]="cuda_ k_"
    [kernels/cuda/ns_shard_cuda.cu]="cuda_ k_"
    [kernels/cuda/ops_cuda.cu]="cuda_ kernel_ops_cuda device_ops_cuda"
    [kernels/cuda_none.c]="kernel_ops_cuda device_ops_cuda" # the CUDA tables where the build has none
    [sharding/plan_owners.c]="plan_" # the planner's owner half: plan_owners_assign
    [sharding/plan_teams.c]="plan_"  # its teams: plan_ns_team_cost, plan_team_size, plan_charge, ...
    [sharding/plan_owners_pick.c]="plan_" # plan_owners_pick: an expert group's teams only where they pay
    [runtime/context.c]="rt_"                # the runtime object's own functions (runtime.h)
    [runtime/commit_check.c]="commit_"
    [runtime/commit_buffers.c]="commit_" # commit's second half: commit_release, commit_*_alloc
    [runtime/commit_teams.c]="commit_teams_"
    [runtime/comm/comm_wait.c]="comm_"
    [runtime/comm/comm_nccl.c]="nccl_"
    [runtime/comm/comm_nccl_none.c]="nccl_"
    [runtime/config/config_agree.c]="config_"
    [runtime/config/config_json.c]="config_"
    [runtime/config/config_keys.c]="config_"
    [runtime/step/elem_batch.c]="ew_"        # the elementwise batch
    [runtime/step/muon_exec.c]="muon_"
    [runtime/step/ns_sharded_iter.c]="ns_sharded_" # sharded NS's parts (ns_sharded_sum.h)
    [runtime/step/ns_sharded_sum.c]="ns_sharded_"
    [runtime/step/offload_exec.c]="offload_"
)
# checkpoint_*.c: ckpt_; safetensors_*.c: st_
family() {
    case $1 in
    runtime/checkpoint/checkpoint_*) echo ckpt_ ;;
    runtime/checkpoint/safetensors_*) echo st_ ;;
    esac
}

list=$1
bad=0 n=0
while IFS= read -r obj; do
    src=${obj#*/CMakeFiles/shardopt_*.dir/}
    src=${src%.o}
    stem=$(basename "$src")
    stem=${stem%.*}
    allowed="shardopt_ ${stem}_ ${short[$src]:-} $(family "$src")"
    while IFS= read -r sym; do
        [ -n "$sym" ] || continue
        n=$((n + 1))
        ok=0
        [ "$sym" = "$stem" ] && ok=1
        for p in $allowed; do
            [[ $sym == "$p"* ]] && ok=1
        done
        if [ $ok -eq 0 ]; then
            echo "extern_prefixes: $src defines $sym: expected a prefix of $allowed"
            bad=$((bad + 1))
        fi
    done < <(nm -gC --defined-only "$obj" | awk '$2 ~ /^[TDBRV]$/ {print $3}' | sed 's/(.*//' |
        grep -v '__device_stub__\|anonymous namespace\|^__\|\.')
done < <(grep -v '^$' "$list" | sort)
if [ $n -eq 0 ]; then
    echo "extern_prefixes: no extern found in the objects of $list"
    exit 1
fi
if [ $bad -gt 0 ]; then
    echo "extern_prefixes: $bad of $n externs lack their file's prefix"
    exit 1
fi
echo "extern_prefixes: all $n externs carry their file's prefix"
