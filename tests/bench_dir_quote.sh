#!/usr/bin/env bash
# ckpt_bench --dir holding quotes: the directory is made and removed without a shell. Before, the
# path went into system("rm -rf '<dir>/repN' && mkdir -p ...") between single quotes, so
# --dir "B/x' 'B/victim' 'y" removed B/victim, a directory the command line never named as its
# own.
#   bench_dir_quote.sh CKPT_BENCH DIR
set -u
exe=$1 base=$2
rm -rf "$base" && mkdir -p "$base/victim" && touch "$base/victim/keep"
fail=0
"$exe" --preset tiny --layers 1 --reps 1 --dir "$base/x' '$base/victim' 'y" >"$base.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: ckpt_bench exited $rc"; tail -5 "$base.out"; fail=1; }
[ -e "$base/victim/keep" ] || { echo "FAIL: $base/victim was removed"; fail=1; }
# the run's own directory, under its odd name, is where the checkpoints went (and were removed)
[ -d "$base/x' '$base/victim' 'y" ] || { echo "FAIL: the --dir named was not made"; fail=1; }
rm -rf "$base" "$base.out"
[ "$fail" -eq 0 ] && echo "bench dir quote: ok"
exit $fail
