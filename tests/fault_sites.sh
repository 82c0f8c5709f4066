#!/usr/bin/env bash
# SHARDOPT_FAULT refuses a site it does not know (base/fault.c's list): the list must name every
# site the sources pass to fault_hit, directly or through ckpt_write_all, or a test arming a real
# site would find its fault refused. Usage: fault_sites.sh ROOT
set -euo pipefail
cd "$1"
list=$(sed -n '/^static const char \*const fault_sites\[\]/,/};/p' base/fault.c |
    grep -o '"[a-z.]*"' | tr -d '"' | sort -u)
used=$( {
    grep -rhoE 'fault_hit\("[a-z.]+"\)' --include='*.c' --include='*.h' --include='*.cu' \
        base kernels sharding offload runtime | sed -E 's/.*\("([a-z.]+)"\)/\1/'
    grep -rhoE 'ckpt_write_all\([^;]*"[a-z.]+"\)' --include='*.c' runtime |
        sed -E 's/.*"([a-z.]+)"\)$/\1/'
} | sort -u)
[ -n "$list" ] || { echo "FAIL: no fault_sites list in base/fault.c"; exit 1; }
missing=$(comm -13 <(printf '%s\n' "$list") <(printf '%s\n' "$used"))
if [ -n "$missing" ]; then
    echo "FAIL: sites the sources use but base/fault.c's fault_sites does not list: $missing"
    exit 1
fi
echo "fault sites: $(printf '%s\n' "$used" | wc -l) used, all listed"
