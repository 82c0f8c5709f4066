#!/usr/bin/env bash
# A rank that stops making progress (SHARDOPT_FAULT=hang@site) must not hang the job: another
# rank's wait passes comm_timeout_s, logs the phase, bucket and the peers it waits on, and calls
# MPI_Abort.
#   hang_driver.sh MPIEXEC EXE N step SITE:K RANK
#   hang_driver.sh MPIEXEC EXE N save SITE RANK DIR   (then: the step-2 checkpoint still loads)
#   hang_driver.sh MPIEXEC EXE N load SITE:K RANK DIR (a checkpoint saved, then loaded with the hang)
#   hang_driver.sh MPIEXEC EXE N init - RANK          (RANK never calls init)
#   hang_driver.sh MPIEXEC EXE N init SITE:K RANK     (RANK stops in init: hang@init.split)
#   hang_driver.sh MPIEXEC EXE N groups SITE:K RANK   (in init_from_groups: hang@init.dup)
#   hang_driver.sh MPIEXEC EXE N nccl SITE:K RANK     (in init's NCCL communicators: hang@nccl.id;
#                                                      EXE is hang_run_nccl)
# SHARDOPT_TEST_LAYOUT and SHARDOPT_TEST_TIMEOUT come from the environment.
set -u
mpiexec=$1 exe=$2 n=$3 mode=$4 site=$5 rank=$6 dir=${7:-}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

expect() { # pattern: must be in the run's output
    if ! grep -qE -- "$1" "$out"; then
        echo "hang_driver: expected /$1/ in the output"
        fail=1
    fi
}

fail=0
if [ "$mode" = step ]; then
    SHARDOPT_FAULT="hang@$site" SHARDOPT_FAULT_RANK=$rank \
        "$mpiexec" -n "$n" --oversubscribe "$exe" step 6 >"$out" 2>&1
    rc=$?
elif [ "$mode" = groups ] || [ "$mode" = nccl ] || { [ "$mode" = init ] && [ "$site" != - ]; }; then
    SHARDOPT_FAULT="hang@$site" SHARDOPT_FAULT_RANK=$rank \
        "$mpiexec" -n "$n" --oversubscribe "$exe" "$mode" - >"$out" 2>&1
    rc=$?
elif [ "$mode" = load ]; then
    rm -rf "$dir"
    "$mpiexec" -n "$n" --oversubscribe "$exe" save "$dir" >"$out" 2>&1 ||
        { cat "$out"; echo "hang_driver: the save before the load failed"; exit 1; }
    SHARDOPT_FAULT="hang@$site" SHARDOPT_FAULT_RANK=$rank \
        "$mpiexec" -n "$n" --oversubscribe "$exe" load "$dir" >"$out" 2>&1
    rc=$?
    rm -rf "$dir"
elif [ "$mode" = init ]; then
    SHARDOPT_TEST_HANG_RANK=$rank "$mpiexec" -n "$n" --oversubscribe "$exe" init - >"$out" 2>&1
    rc=$?
else
    rm -rf "$dir"
    SHARDOPT_TEST_HANG_SITE=$site SHARDOPT_TEST_HANG_RANK=$rank \
        "$mpiexec" -n "$n" --oversubscribe "$exe" save "$dir" >"$out" 2>&1
    rc=$?
fi
cat "$out"
echo "hang_driver: mpiexec exited with $rc"
# MPI_Abort's code; Open MPI's own help text about it is not always printed (it can lose the race
# with the kill), so the exit status is what is checked
[ "$rc" -eq 124 ] || { echo "hang_driver: expected exit status 124 (MPI_Abort), got $rc"; fail=1; }
if grep -q "hang_run: finished" "$out"; then
    echo "hang_driver: the run finished although rank $rank hung"
    fail=1
fi
if [ "$mode" = init ] && [ "$site" = - ]; then
    expect "hang_run: rank $rank stays out of init"
else
    expect "SHARDOPT_FAULT: rank $rank hangs at ${site%%:*}"
fi
expect "no progress for [0-9]+ s \\(comm_timeout_s = [0-9.]+\\) in "
expect "waiting on rank\\(s\\) [0-9, .]*$rank"
expect "calling MPI_Abort"
if [ "$mode" = step ] && [ "${site%%:*}" = step.exchange ]; then
    expect "in step: exchange #[12] [^,]*, bucket [0-9]+, sends and receives over the (dense|expert shard) group"
elif [ "$mode" = step ]; then
    expect "in step: gradient pre-pass, sums of squares all-reduce over the dense group"
elif [ "$mode" = load ]; then
    expect "in load, status agreement over the (dense|replicate) group"
elif [ "$mode" = init ] && [ "$site" = - ]; then
    expect "in init, status agreement over the communicator init was given"
elif [ "$mode" = init ]; then
    expect "in init: splitting the communicator into the groups, barrier before MPI_Comm_split making the [a-z -]+ group over the communicator init was given"
elif [ "$mode" = groups ]; then
    expect "in init_from_groups: duplicating the groups, MPI_Comm_idup making the dense group over the dense group"
elif [ "$mode" = nccl ]; then
    expect "in init: NCCL communicators, NCCL dense group: broadcast of its unique id over the dense group"
else
    expect "in save, status agreement"
    # the job died mid-save: the step-2 checkpoint is what latest names, and it loads
    "$mpiexec" -n "$n" --oversubscribe "$exe" load "$dir" >"$out" 2>&1
    cat "$out"
    expect "hang_run: loaded \\(success\\), checkpoint step 2"
    rm -rf "$dir"
fi
exit $fail
