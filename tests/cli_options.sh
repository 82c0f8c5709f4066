#!/usr/bin/env bash
# The command-line contract of one of the MPI programs (tools/cli.h):
#   tests/cli_options.sh PROGRAM NUMERIC_OPTION SOURCE...
# - `--help` exits 0 and lists every option the parser in SOURCE knows (each "--name" string
#   literal there), so the help cannot fall behind the parser;
# - an unknown option, a numeric option given "10x" (atoi would have read 10) or given no value,
#   or --momentum-dtype given fp16 (every one of these programs has it; shardopt-bench used to
#   run nothing, ckpt_bench fp32) exits 2 with one line naming the argument, and no MPI_Abort.
set -uo pipefail
prog=$1 numeric=$2
shift 2
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

help=$("$prog" --help 2>&1)
rc=$?
[ "$rc" -eq 0 ] || bad "--help exited $rc"
grep -q '^usage: ' <<<"$help" || bad "--help does not start with a usage line"
opts=$(grep -ho '"--[a-z0-9-]*"' "$@" | tr -d '"' | sort -u)
[ -n "$opts" ] || bad "no option literals found in $*"
n=0
for o in $opts; do
    n=$((n + 1))
    grep -qE -- "(^|[ ,])$o( |,|$)" <<<"$help" || bad "--help does not list $o"
done

check() { # expected-message-regex args...
    local want=$1 out rc
    shift
    out=$("$prog" "$@" 2>&1)
    rc=$?
    [ "$rc" -eq 2 ] || bad "'$*' exited $rc, not 2"
    grep -qE -- "$want" <<<"$out" || bad "'$*' did not say /$want/: $out"
    grep -q 'MPI_ABORT' <<<"$out" && bad "'$*' ended in MPI_Abort"
}
check "unknown argument '--no-such-option'" --no-such-option
check "$numeric takes an integer.*'10x'" "$numeric" 10x
check "$numeric needs a value" "$numeric"
check "--momentum-dtype.*'?fp16'?" --momentum-dtype fp16
[ "$fails" -eq 0 ] && echo "cli options: ok ($n options listed by --help, 4 refusals)"
exit $((fails > 0))
