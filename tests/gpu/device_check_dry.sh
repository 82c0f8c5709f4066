#!/usr/bin/env bash
# CTest device_check_dry_run: tests/gpu/device_check.sh, which only a GPU machine runs for real,
# keeps parsing (bash -n) and its dry run (SHARDOPT_GPU_DRY_RUN=1, exit 77) still lists every
# step with its time limit, and the files and CTests its steps name still exist, so that the
# script has not rotted when a GPU session comes to run it.
#   tests/gpu/device_check_dry.sh WORKDIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:?usage: device_check_dry.sh WORKDIR}
rm -rf "$work" && mkdir -p "$work" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
bash -n "$here/device_check.sh" || fail "bash -n tests/gpu/device_check.sh"
out=$(SHARDOPT_GPU_DRY_RUN=1 SHARDOPT_GPU_BUILD="$work/build" SHARDOPT_GPU_RETURN= \
    bash "$here/device_check.sh" "$work/out" 2>&1)
rc=$?
[ "$rc" -eq 77 ] || fail "the dry run exited $rc, not 77"
for s in kernels layouts ns_cuda torch_cuda nccl_gpu nccl_teams nccl_teams_bf16 nccl_sharded \
    nccl_experts offload gpu demo step ranks2 ranks4 nccl1 nccl2 ns ns_gram ns_variants memcheck; do
    grep -q "^would run: $s (limit [0-9]* s)" <<<"$out" || fail "the dry run lists no step '$s'"
done
grep -q "share a [0-9]* s budget" <<<"$out" || fail "the dry run names no budget"
# what the steps run from the tree, and the CTests they select by name
for f in tests/gpu/torch_cuda_stream.py tests/mpi/moe_train_backend.sh; do
    [ -f "$root/$f" ] || fail "a step runs $f, which is gone"
done
for t in test_cuda_kernels test_cuda_memory test_ns_driver ns_bench_cuda_smoke \
    test_cuda_layouts_np1 test_cuda_layouts_np2 test_cuda_layouts_np4 test_cuda_offload_np2 \
    test_cuda_offload_cpu_np2; do
    grep -q "$t" "$root/tests/CMakeLists.txt" || fail "a step selects CTest $t, which is gone"
done
[ "$fails" -eq 0 ] || { printf '%s\n' "$out" | head -40; exit 1; }
echo "device_check dry run: ok ($(grep -c '^would run: ' <<<"$out") steps listed)"
