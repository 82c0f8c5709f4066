#!/usr/bin/env bash
# libFuzzer on each target for SECONDS, starting from the committed corpus (copied: the repo is
# not written). A crash, leak, UBSan report or a target's own abort fails the run and leaves the
# input under OUT (default a temporary directory) to be committed as corpus/<target>/crash-*,
# which test_fuzz_corpus_<target> then runs in every build.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS] [OUT]
set -uo pipefail
bd=${1:?usage: run.sh BUILD_DIR [SECONDS] [OUT]}
secs=${2:-60}
out=${3:-$(mktemp -d /tmp/shardopt_fuzz_XXXXXX)}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
status=0
for t in config config_set safetensors index writer_index; do
    work="$out/corpus-$t"
    mkdir -p "$work"
    log="$out/fuzz_$t.log"
    "$bd/tests/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
        -max_len=65536 -artifact_prefix="$out/$t-" "$work" "$root/tests/fuzz/corpus/$t" \
        >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    units=$(find "$work" -type f | wc -l)
    if [ "$rc" -ne 0 ]; then
        echo "fuzz: $t: FAILED (exit $rc) after ${runs:-?} executions; input and log in $out"
        grep -m5 -E 'ERROR|SUMMARY|runtime error|abort' "$log"
        status=1
    else
        echo "fuzz: $t: ${runs:-?} executions in ${secs} s, 0 crashes, $units new corpus inputs"
    fi
done
exit $status
