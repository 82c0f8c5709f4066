#!/usr/bin/env bash
# examples/c_trainer as the report's trainer ran it: 4 ranks (dp_shard 2 x cp 2, ep 2, bf16
# momentum, all through SHARDOPT_* variables, which init applies), 10 steps in one go against 5
# steps saved (weights and optimizer state, both by shardopt_save: ckpt_weights) and resumed from
# the library's checkpoint alone for 5 more on 2 ranks (ep 2), on 1 and on 3 (uneven shards): the
# weights must end bit for bit the same, and the loss must fall.
#   c_trainer_resume.sh MPIEXEC C_TRAINER
set -euo pipefail
mpiexec=${1:?usage: c_trainer_resume.sh MPIEXEC C_TRAINER}
bin=${2:?usage: c_trainer_resume.sh MPIEXEC C_TRAINER}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SHARDOPT_MOMENTUM_DTYPE=bf16
sum() { sed -n 's/.*weights checksum \([0-9a-f]*\).*/\1/p' "$1"; }
loss() { awk -v s="$1" '$2 == "step" && $3 == s {print $5}' "$2"; }

SHARDOPT_CP=2 SHARDOPT_EP=2 "$mpiexec" -n 4 --oversubscribe "$bin" --steps 10 >"$work/whole.log"
cat "$work/whole.log"
grep -q "4 ranks (dp_replicate 1, dense 4, ep 2): step 10" "$work/whole.log" ||
    { echo "FAIL: the 4-rank run is not dp_shard 2 x cp 2, ep 2 at step 10"; exit 1; }
awk -v a="$(loss 1 "$work/whole.log")" -v b="$(loss 10 "$work/whole.log")" \
    'BEGIN {exit !(b < 0.8 * a)}' || { echo "FAIL: the loss did not fall by 20% in 10 steps"; exit 1; }

SHARDOPT_CP=2 SHARDOPT_EP=2 "$mpiexec" -n 4 --oversubscribe "$bin" --steps 5 --save-at 5 \
    --dir "$work/ck" >"$work/first.log"
[ "$(ls -A "$work/ck" | grep -v '^\.lock$' | tr '\n' ' ')" = "latest step-00000005 " ] ||
    { echo "FAIL: the checkpoint directory holds more than the library's step 5"; exit 1; }
grep -q '"format_version":4,"weights":true' "$work/ck/step-00000005/index.json" ||
    { echo "FAIL: the step 5 checkpoint holds no weights"; exit 1; }
w=$(sum "$work/whole.log")
for n in 2 1 3; do
    ep=1
    [ "$n" = 2 ] && ep=2
    SHARDOPT_EP=$ep "$mpiexec" -n $n --oversubscribe "$bin" --steps 10 --resume "$work/ck" \
        >"$work/resumed$n.log"
    cat "$work/resumed$n.log"
    grep -q "$n ranks (dp_replicate 1, dense $n, ep $ep): step 10" "$work/resumed$n.log" ||
        { echo "FAIL: the resumed run did not reach step 10 on $n ranks"; exit 1; }
    r=$(sum "$work/resumed$n.log")
    [ -n "$w" ] && [ "$w" = "$r" ] ||
        { echo "FAIL: 10 steps on 4 ranks end at '$w', 5 + 5 resumed on $n ranks at '$r'"; exit 1; }
    [ "$(loss 10 "$work/whole.log")" = "$(loss 10 "$work/resumed$n.log")" ] ||
        { echo "FAIL: the step 10 losses differ ($n ranks)"; exit 1; }
done
echo "c_trainer resume: 4 ranks -> 2, 1 and 3 ranks bit for bit (checksum $w)"
