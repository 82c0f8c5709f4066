#!/usr/bin/env bash
# SHARDOPT_LOG_FILE with %r: one file per rank, each holding that rank's lines only.
# (The file used to be opened before init knew the rank: every rank wrote to "log--1.txt".)
#   log_file_rank.sh MPIEXEC MOE_TRAIN DIR
set -u
mpiexec=$1 exe=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
SHARDOPT_LOG_LEVEL=info SHARDOPT_LOG_FILE="$dir/log-%r.txt" \
    "$mpiexec" -n 2 --oversubscribe "$exe" --steps 1 --cp 1 --ep 2 --hidden 32 --ffn 32 \
    --experts 4 --vocab 64 --out 8 --tokens-per-rank 8 --quiet
rc=$?
fail=0
[ "$rc" -eq 0 ] || { echo "moe_train exited $rc"; fail=1; }
ls -l "$dir"
for r in 0 1; do
    f="$dir/log-$r.txt"
    if [ ! -s "$f" ]; then
        echo "FAIL: $f missing or empty"
        fail=1
        continue
    fi
    other=$(grep -c "^\[shardopt [^]]* r$((1 - r))\]" "$f")
    mine=$(grep -c "^\[shardopt [^]]* r$r\]" "$f")
    echo "$f: $mine lines of rank $r, $other of rank $((1 - r))"
    [ "$mine" -gt 0 ] && [ "$other" -eq 0 ] || fail=1
done
[ -e "$dir/log--1.txt" ] && { echo "FAIL: log--1.txt exists"; fail=1; }
rm -rf "$dir"
[ "$fail" -eq 0 ] && echo "log file rank: ok"
exit $fail
