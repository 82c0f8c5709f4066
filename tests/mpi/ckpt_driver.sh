#!/usr/bin/env bash
# Resume and crash checks across fresh processes (one mpiexec per phase):
#   ckpt_driver.sh MPIEXEC EXE DIR DTYPE SAVE_N SAVE_LAYOUT LOAD_N LOAD_LAYOUT [CRASH_SITE]
# 1. SAVE_N ranks on SAVE_LAYOUT run 5 steps and save to DIR;
# 2. with CRASH_SITE: the same ranks run 8 steps and save again, killed at CRASH_SITE;
# 3. LOAD_N ranks on LOAD_LAYOUT load DIR (the step-5 checkpoint), run steps 6-10 and compare
#    bitwise with 10 uninterrupted steps on one rank.
set -u
mpiexec=$1 exe=$2 dir=$3 dtype=$4 save_n=$5 save_layout=$6 load_n=$7 load_layout=$8
site=${9:-}

phase() { # ranks layout mode [extra env...]
    local n=$1 layout=$2 mode=$3
    shift 3
    env SHARDOPT_TEST_DIR="$dir" SHARDOPT_TEST_DTYPE="$dtype" SHARDOPT_TEST_LAYOUT="$layout" \
        SHARDOPT_TEST_MODE="$mode" "$@" "$mpiexec" -n "$n" --oversubscribe "$exe"
}

rm -rf "$dir"
phase "$save_n" "$save_layout" save || { echo "ckpt_driver: the save run failed"; exit 1; }
if [ -n "$site" ]; then
    phase "$save_n" "$save_layout" crash SHARDOPT_FAULT="kill@$site:1" >/dev/null 2>&1
    rc=$?
    left=$(ls -A "$dir" | tr '\n' ' ')
    echo "ckpt_driver: killed at $site (mpiexec exit $rc); left behind: $left"
    # a SIGKILL (128 + 9), not some other failure: the resume below must start from what a crash
    # leaves, a save cut short at that site
    [ "$rc" -eq 137 ] || { echo "ckpt_driver: expected exit 137 (SIGKILL at $site)"; exit 1; }
    if [ "$site" = ckpt.latest ]; then
        want='step-00000008' # published, but latest not moved to it
    else
        want='\.tmp-step-00000008-'
    fi
    grep -qE "(^| )$want" <<<"$left" || { echo "ckpt_driver: expected /$want/ left behind"; exit 1; }
    grep -q "$(cat "$dir/latest")" <<<"step-00000005" ||
        { echo "ckpt_driver: latest does not name step 5 after the crash"; exit 1; }
fi
# after a crash, the resumed run also saves at step 8, over what the crashed save left
save_at=0
[ -n "$site" ] && save_at=8
phase "$load_n" "$load_layout" resume SHARDOPT_TEST_SAVE_AT=$save_at ||
    { echo "ckpt_driver: resume failed"; exit 1; }
rm -rf "$dir"
