#!/usr/bin/env bash
# shardopt-plan takes each option once: a repeated one (a value option, or a flag) exits 2 with
# one line naming it, before anything is planned (a later value replaced an earlier one without a
# word: --world 8 ... --world 16 planned 16 ranks). The same options once still plan.
#   tests/plan_options_once.sh SHARDOPT_PLAN
set -uo pipefail
plan=$1
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

refused() { # option args...
    local opt=$1 out rc
    shift
    out=$("$plan" "$@" 2>&1)
    rc=$?
    [ "$rc" -eq 2 ] || bad "'$*' exited $rc, not 2"
    grep -qF -- "shardopt-plan: $opt is given twice: each option is taken once" <<<"$out" ||
        bad "'$*' did not name $opt as given twice: $out"
}
refused --world --preset tiny --world 8 --world 16
refused --preset --preset tiny --world 4 --preset tiny
refused --json --preset tiny --world 4 --json --json
refused --ep --preset tiny --world 4 --ep 2 --cp 1 --ep 2
out=$("$plan" --preset tiny --world 4 --ep 2 --json 2>&1) || bad "the options once did not plan: $out"
[ "$fails" -eq 0 ] && echo "plan options once: ok"
exit $((fails > 0))
