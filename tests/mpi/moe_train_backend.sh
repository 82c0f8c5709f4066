#!/usr/bin/env bash
# examples/moe_train --backend cuda (Newton-Schulz on the GPU, offload = cpu: the example's
# parameters are host memory) on 2 ranks. Where no GPU is visible (or the build has no CUDA),
# init refuses on every rank and the program exits 1 with the library's message: no MPI_Abort,
# no signal. Where one is, the run trains: exit 0, the loss falls at least 5x in 40 steps, and
# its last loss is printed beside the CPU run's (bf16 Newton-Schulz on the device against fp32
# on the CPU: close, not equal). A backend other than cpu or cuda, or SHARDOPT_OFFLOAD other
# than cpu with cuda, exits 2.
#   moe_train_backend.sh MPIEXEC MOE_TRAIN
set -uo pipefail
mpiexec=${1:?usage: moe_train_backend.sh MPIEXEC MOE_TRAIN}
bin=${2:?usage: moe_train_backend.sh MPIEXEC MOE_TRAIN}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
small=(--hidden 32 --ffn 48 --experts 8 --vocab 256 --out 16 --cp 1 --ep 2 --steps 40
    --tokens-per-rank 64)
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$mpiexec" -n 2 --oversubscribe "$bin" "${small[@]}" --backend cuda >"$work/cuda.log" 2>&1
rc=$?
case $rc in
1)
    grep -qE "moe_train: init: .*(no CUDA device is visible|has no CUDA backend)" "$work/cuda.log" ||
        bad "--backend cuda exited 1 without init's message: $(cat "$work/cuda.log")"
    grep -q MPI_ABORT "$work/cuda.log" && bad "--backend cuda without a GPU ended in MPI_Abort"
    echo "moe_train --backend cuda: no GPU here, refused cleanly (exit 1)"
    ;;
0)
    ratio=$(sed -n 's/.*(\([0-9.]*\)x lower).*/\1/p' "$work/cuda.log")
    awk -v r="$ratio" 'BEGIN {exit !(r >= 5)}' ||
        bad "--backend cuda: loss fell ${ratio}x in 40 steps (want >= 5x)"
    "$mpiexec" -n 2 --oversubscribe "$bin" "${small[@]}" --backend cpu >"$work/cpu.log" 2>&1 ||
        bad "--backend cpu failed"
    last() { awk '$1 == "step" && $2 == 40 {print $4}' "$1"; }
    echo "moe_train step 40 loss: cuda $(last "$work/cuda.log"), cpu $(last "$work/cpu.log")"
    ;;
*) bad "--backend cuda exited $rc: $(tail -20 "$work/cuda.log")" ;;
esac

out=$("$bin" --backend gpu 2>&1)
[ $? -eq 2 ] && grep -q "backend takes cpu or cuda, not 'gpu'" <<<"$out" ||
    bad "--backend gpu: $out"
out=$(SHARDOPT_OFFLOAD=none "$mpiexec" -n 1 --oversubscribe "$bin" --backend cuda --cp 1 --ep 1 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "offload = cpu only" <<<"$out" ||
    bad "--backend cuda with SHARDOPT_OFFLOAD=none exited $rc: $out"
[ "$fails" -eq 0 ] && echo "moe_train backend: ok"
exit $((fails > 0))
