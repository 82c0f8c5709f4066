#!/usr/bin/env bash
# The floors only look down (docs/design.md, Layers): every #include of a source under base/,
# kernels/, sharding/ and offload/ is resolved to the file it names, and that file's folder must
# be one the including folder may use. No floor below runtime/ includes runtime/, MPI or
# shardopt.h (which pulls in mpi.h); runtime/'s wings include only the wings below them. Usage: floors.sh ROOT, or floors.sh --self-test ROOT, which
# first checks that a deliberately added upward include in a copy of the tree is caught.
set -euo pipefail

# folder -> the folders (and single headers) its files may include, besides their own
declare -A may=(
    [base]="include/shardopt_status.h"
    [kernels]="base include/shardopt_status.h include/shardopt_types.h"
    [sharding]="base"
    # offload/ moves state through the device table (kernels/device.h) alone: never the compute
    # table (kernels/ops.h), which these headers do not include either
    [offload]="base include/shardopt_status.h kernels/device.h kernels/ctx.h kernels/timeline.h kernels/clock.h"
    # runtime/'s wings: comm/ at their bottom, config/ agrees keys over it; step/ and checkpoint/
    # work on the runtime object (runtime/runtime.h) and never on each other; the files at
    # runtime/'s top (lifecycle) compose them all and are not listed. step/ walks the process's
    # live runtimes (runtime/live_list.h: the list and its lock; alias_check.c's check against
    # another runtime's memory), never the lifecycle's adding, removing and claiming (live.h)
    [runtime/comm]="base kernels sharding include/shardopt.h include/shardopt_status.h"
    [runtime/config]="base kernels runtime/comm include/shardopt.h include/shardopt_status.h"
    [runtime/step]="base kernels sharding offload runtime/comm runtime/config runtime/runtime.h runtime/topology.h runtime/live_list.h include/shardopt.h include/shardopt_status.h"
    [runtime/checkpoint]="base kernels sharding offload runtime/comm runtime/config runtime/runtime.h runtime/topology.h include/shardopt.h include/shardopt_status.h"
)

check() {
    local root=$1 bad=0 f dir inc path target floor ok allowed
    cd "$root"
    for floor in "${!may[@]}"; do
        [ -d "$floor" ] || continue
        while IFS= read -r f; do
            dir=$(dirname "$f")
            while IFS= read -r line; do
                if [[ $floor != runtime/* && $line =~ ^#include[[:space:]]*\<mpi\.h\> ]]; then
                    echo "floors: $f includes <mpi.h>: no floor below runtime/ sees MPI"
                    bad=1
                    continue
                fi
                [[ $line =~ ^#include[[:space:]]*\"([^\"]+)\" ]] || continue
                inc=${BASH_REMATCH[1]}
                target=""
                for path in "$dir/$inc" "$inc" "include/$inc"; do
                    if [ -f "$path" ]; then
                        target=$(realpath --relative-to=. "$path")
                        break
                    fi
                done
                if [ -z "$target" ]; then
                    echo "floors: $f includes \"$inc\", which is no file of the tree"
                    bad=1
                    continue
                fi
                ok=0
                [[ $target == "$floor"/* ]] && ok=1
                for allowed in ${may[$floor]}; do
                    [[ $target == "$allowed" || $target == "$allowed"/* ]] && ok=1
                done
                if [ $ok -eq 0 ]; then
                    echo "floors: $f includes $target: $floor/ may include only $floor/ ${may[$floor]}"
                    bad=1
                fi
            done < <(grep -E '^[[:space:]]*#[[:space:]]*include' "$f" | sed -E 's/^[[:space:]]*#[[:space:]]*include/#include/')
        done < <(find "$floor" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
    done
    return $bad
}

if [ "${1:-}" = "--self-test" ]; then
    root=$(realpath "$2")
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp -r "$root/base" "$root/kernels" "$root/sharding" "$root/offload" "$root/include" \
        "$root/runtime" "$tmp/"
    # one planted include per kind of rule: a floor reaching up, a wing reaching sideways,
    # offload/ reaching past the device table into the compute one, step/ reaching the
    # lifecycle's live.h beside the live list it may walk
    for plant in "kernels/rng.c runtime/runtime.h" "runtime/comm/groups.c runtime/step/muon_exec.h" \
        "offload/staging.c kernels/ops.h" "runtime/step/alias_check.c runtime/live.h"; do
        set -- $plant
        cp -r "$root/kernels" "$root/runtime" "$root/offload" "$tmp/"
        sed -i "1i #include \"$2\"" "$tmp/$1"
        if (check "$tmp" >"$tmp/out" 2>&1); then
            echo "floors: self-test: a wrong include ($1 -> $2) was not caught"
            exit 1
        fi
        grep -q "$1 includes $2" "$tmp/out" || {
            echo "floors: self-test: the wrong include was caught, but not named:"
            cat "$tmp/out"
            exit 1
        }
        echo "floors: self-test: a wrong include is caught ($(head -1 "$tmp/out"))"
    done
    cp -r "$root/kernels" "$root/runtime" "$root/offload" "$tmp/"
    set -- --self-test "$root"
    shift
fi
check "$(realpath "$1")"
echo "floors: every include of base/, kernels/, sharding/, offload/ and runtime/'s wings looks down"
