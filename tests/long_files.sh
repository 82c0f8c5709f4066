#!/usr/bin/env bash
# A source file over 600 lines says at its top why it must be one file (docs/design.md, Layers):
# a reader meeting a long file learns first whether to look for a split or for the reason there
# is none. Checks every tracked C, CUDA, Python and shell file for the words "one file" in its
# first 30 lines. Usage: long_files.sh ROOT, or long_files.sh --self-test ROOT, which first checks
# that a long file without the comment is caught.
set -euo pipefail
limit=600

check() {
    local root=$1 bad=0 f n
    cd "$root"
    while IFS= read -r f; do
        [ -f "$f" ] || continue
        n=$(wc -l <"$f")
        [ "$n" -gt "$limit" ] || continue
        if ! head -30 "$f" | grep -qi 'one file'; then
            echo "long_files: $f has $n lines and no comment at its top saying why it is one file"
            bad=1
        fi
    done < <(git ls-files '*.c' '*.h' '*.cu' '*.py' '*.sh' 2>/dev/null || find . -name '*.[ch]')
    return $bad
}

if [ "${1:-}" = "--self-test" ]; then
    root=$(realpath "$2")
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    git -C "$tmp" init -q
    seq 1 $((limit + 1)) | sed 's#^#// line #' >"$tmp/long.c"
    git -C "$tmp" add long.c
    if (check "$tmp" >"$tmp/out" 2>&1); then
        echo "long_files: self-test: a $((limit + 1))-line file without the comment was not caught"
        exit 1
    fi
    echo "long_files: self-test: a long file without the comment is caught ($(cat "$tmp/out"))"
    shift
fi
check "$(realpath "$1")"
echo "long_files: every source file over $limit lines says why it is one file"
