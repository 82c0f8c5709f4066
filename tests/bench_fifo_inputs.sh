#!/usr/bin/env bash
# shardopt-plan given a FIFO as its --preset or --machine file: refused at once ("cannot read").
# Before, fopen waited for a writer for good (and ftell's -1 would have sized the buffer).
#   bench_fifo_inputs.sh SHARDOPT_PLAN DIR
set -u
exe=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" && mkfifo "$dir/in.fifo"
fail=0
for args in "--preset $dir/in.fifo --world 4" "--preset tiny --world 4 --machine $dir/in.fifo"; do
    # shellcheck disable=SC2086
    out=$(timeout 60 "$exe" $args 2>&1)
    rc=$?
    if [ "$rc" -eq 124 ] || ! grep -q "in.fifo: cannot read" <<<"$out"; then
        echo "FAIL: shardopt-plan $args: exit $rc"
        printf '%s\n' "$out" | tail -3
        fail=1
    fi
done
rm -rf "$dir"
[ "$fail" -eq 0 ] && echo "bench fifo inputs: ok"
exit $fail
