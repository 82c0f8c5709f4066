#!/usr/bin/env bash
# One env gateway (docs/config.md, Environment variables that are not config keys): base/env.c is
# the only library file that calls getenv or reads environ; every SHARDOPT_* name the library
# reads by name is declared in its table env_vars; the table and docs/config.md's list the same
# variables. Usage: env_gateway.sh ROOT, or env_gateway.sh --self-test ROOT, which first checks
# that a getenv planted in a copy of the tree is caught.
set -euo pipefail

check() {
    local root=$1 bad=0 f
    cd "$root"
    while IFS= read -r f; do
        [ "$f" = base/env.c ] && continue
        if grep -nE '\b(secure_)?getenv[[:space:]]*\(|\benviron\b' "$f"; then
            echo "env_gateway: $f reads the environment: only base/env.c does (env_get)"
            bad=1
        fi
    done < <(find base kernels sharding offload runtime -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
    local table docs read
    table=$(grep -oE '^[[:space:]]*\{"SHARDOPT_[A-Z0-9_]+"' base/env.c | grep -oE 'SHARDOPT_[A-Z0-9_]+' | sort -u)
    docs=$(sed -n '/^### Environment variables that are not config keys/,/^#/p' docs/config.md |
        grep -oE '^\| `SHARDOPT_[A-Z0-9_]+`' | grep -oE 'SHARDOPT_[A-Z0-9_]+' | sort -u)
    if [ -z "$table" ] || [ "$table" != "$docs" ]; then
        echo "env_gateway: base/env.c's env_vars and docs/config.md's list differ:"
        diff <(echo "$table") <(echo "$docs") || true
        bad=1
    fi
    read=$(grep -rhoE 'env_get\("SHARDOPT_[A-Z0-9_]+"' base kernels sharding offload runtime |
        grep -oE 'SHARDOPT_[A-Z0-9_]+' | sort -u)
    for v in $read; do
        if ! grep -qx "$v" <<<"$table"; then
            echo "env_gateway: $v is read by name but is not in base/env.c's env_vars"
            bad=1
        fi
    done
    return $bad
}

if [ "${1:-}" = "--self-test" ]; then
    root=$(realpath "$2")
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp -r "$root/base" "$root/kernels" "$root/sharding" "$root/offload" "$root/runtime" \
        "$root/docs" "$tmp/"
    sed -i '1i static const char *planted(void) { return getenv("SHARDOPT_PLANTED"); }' \
        "$tmp/kernels/rng.c"
    if (check "$tmp" >"$tmp/out" 2>&1); then
        echo "env_gateway: self-test: a getenv planted in kernels/rng.c was not caught"
        exit 1
    fi
    shift
fi
if check "$(realpath "$1")"; then
    echo "env_gateway: the environment is read in base/env.c only, its table matches docs/config.md"
else
    exit 1
fi
