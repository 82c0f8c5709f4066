#!/usr/bin/env bash
# The floors only look down (docs/design.md, Layers): every #include of a source under base/,
# kernels/, sharding/ and offload/ is resolved to the file it names, and that file's folder must
# be one the including folder may use. No floor below runtime/ includes runtime/, MPI or
# shardopt.h (which pulls in mpi.h). Usage: floors.sh ROOT, or floors.sh --self-test ROOT, which
# first checks that a deliberately added upward include in a copy of the tree is caught.
set -euo pipefail

# folder -> the folders (and single headers) its files may include, besides their own
declare -A may=(
    [base]="include/shardopt_status.h"
    [kernels]="base include/shardopt_status.h"
    [sharding]="base"
    [offload]="base kernels"
)

check() {
    local root=$1 bad=0 f dir inc path target floor ok allowed
    cd "$root"
    for floor in "${!may[@]}"; do
        [ -d "$floor" ] || continue
        while IFS= read -r f; do
            dir=$(dirname "$f")
            while IFS= read -r line; do
                if [[ $line =~ ^#include[[:space:]]*\<mpi\.h\> ]]; then
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
    cp -r "$root/base" "$root/kernels" "$root/sharding" "$root/offload" "$root/include" "$tmp/"
    mkdir -p "$tmp/runtime" && cp "$root/runtime/runtime.h" "$tmp/runtime/"
    sed -i '1i #include "runtime/runtime.h"' "$tmp/kernels/rng.c"
    if (check "$tmp" >"$tmp/out" 2>&1); then
        echo "floors: self-test: an upward include (kernels/rng.c -> runtime/runtime.h) was not caught"
        exit 1
    fi
    grep -q 'kernels/rng.c includes runtime/runtime.h' "$tmp/out" || {
        echo "floors: self-test: the upward include was caught, but not named:"
        cat "$tmp/out"
        exit 1
    }
    echo "floors: self-test: an upward include is caught ($(head -1 "$tmp/out"))"
    shift
fi
check "$(realpath "$1")"
echo "floors: every include of base/, kernels/, sharding/ and offload/ looks down"
