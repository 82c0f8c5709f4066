#!/usr/bin/env bash
# The logging and fault variables' text reaches stderr escaped, and a SHARDOPT_LOG_FILE path that
# does not fit is refused rather than cut (a cut path names another file, and a cut %r pattern
# sends every rank to one file). Before: the "cannot open" and SHARDOPT_FAULT lines wrote the
# variable's raw bytes (an ESC sequence reached the terminal), and a 1100-byte path was cut to
# 1023 bytes and the log written there. A SHARDOPT_FAULT_RANK that is not a rank is refused (the
# fault not armed), where atoi took "abc" as rank 0 and "-3" as every rank. A site no call names
# is refused naming it (a typo armed a fault that never fired). A FIFO without a
# reader as the log file is refused at once, where opening it waited for a reader for good, and
# one that stops taking lines (/dev/full) is left for stderr, where its lines were lost.
#   log_env_escape.sh PROGRAM DIR   (PROGRAM: a one-process shardopt program, moe_demo)
set -u
exe=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail=0
esc=$'\x1b'

demo() { "$exe" --steps 1 --layers 1 --experts 2 --hidden 8 --ffn 8 --vocab 16 2>&1 >/dev/null; }

check() { # name, stderr text, what it must contain
    if printf '%s' "$2" | grep -q "$esc"; then
        echo "FAIL $1: a raw ESC byte reached stderr"
        fail=1
    fi
    if ! printf '%s' "$2" | grep -qF -- "$3"; then
        echo "FAIL $1: stderr lacks: $3"
        printf '%s\n' "$2" | head -5
        fail=1
    fi
}

out=$(SHARDOPT_LOG_FILE="$dir/missing/${esc}[31mred.log" demo)
check "cannot open" "$out" 'missing/\x1b[31mred.log'"': cannot open (No such file or directory), logging to stderr"

out=$(SHARDOPT_FAULT="${esc}[2J" demo)
check "fault" "$out" "SHARDOPT_FAULT='\\x1b[2J': accepted"

# a FIFO no process reads: refused at once (fopen waited for a reader for good: init hung)
mkfifo "$dir/log.fifo"
out=$(SHARDOPT_LOG_FILE="$dir/log.fifo" timeout 60 "$exe" --steps 1 --layers 1 --experts 2 \
    --hidden 8 --ffn 8 --vocab 16 2>&1 >/dev/null)
check "fifo" "$out" "cannot open (No such device or address: a FIFO no process reads)"
rm -f "$dir/log.fifo"

# a log file that stops taking lines (/dev/full: every write ENOSPC, as a full disk): every line
# was lost without a word, the errors too; the first failed line says so on stderr and the log
# goes on there (the mistyped variable's warning, logged after it, reaches stderr)
if [ -w /dev/full ]; then
    out=$(SHARDOPT_LOG_FILE=/dev/full SHARDOPT_MOMENTUN=0.9 demo)
    check "full log file" "$out" "SHARDOPT_LOG_FILE '/dev/full': writing failed (No space left on device), logging to stderr"
    check "full log file, the line" "$out" "did you mean SHARDOPT_MOMENTUM?"
fi

# SHARDOPT_FAULT_RANK that is not a rank: refused, and the fault not armed on any rank (atoi took
# "abc" as rank 0 and "-3" as every rank). commit.x is no site: only the refusal can show.
for v in abc -3 99999999999 ' 1' "+1" "1${esc}"; do
    out=$(SHARDOPT_FAULT_RANK="$v" SHARDOPT_FAULT=commit.x:1 demo)
    check "fault rank '$v'" "$out" "': accepted a rank, 0 or more in decimal digits; SHARDOPT_FAULT ignored"
done
out=$(SHARDOPT_FAULT_RANK=0 SHARDOPT_FAULT=commit.x:1 demo)
if printf '%s' "$out" | grep -q 'SHARDOPT_FAULT_RANK'; then
    echo "FAIL: SHARDOPT_FAULT_RANK=0 refused"
    fail=1
fi

# SHARDOPT_FAULT that is not <site>:<n>: refused, the whole value shown. A count past long was
# saturated (armed, never firing), " 1" and "+1" taken, an empty site armed, and the refusal of
# "kill@" showed ''. A refused variable and a bad config variable end moe_demo with one line and
# exit 1, without MPI_Abort (each process runs alone).
for v in alloc:99999999999999999999 'alloc: 1' alloc:+1 :1 kill@ 'hang@:2' commit.x:1:; do
    out=$(SHARDOPT_FAULT="$v" demo)
    check "fault '$v'" "$out" "SHARDOPT_FAULT='$v': accepted [kill@|hang@]<site>:<n>[:<errno>], a site"
done
# a site no fault_hit names (a typo): refused naming the site, where it was armed silently and
# never fired, the test around it passing without its fault
for v in ckpt.raed:1 kill@step.exchnge:2 Alloc:3:ENOSPC; do
    out=$(SHARDOPT_FAULT="$v" demo)
    site=${v#kill@}
    check "fault site '$v'" "$out" "SHARDOPT_FAULT='$v': '${site%%:*}' is no fault site (the sites: alloc,"
done
out=$(SHARDOPT_FAULT="ckpt.read${esc}:1" demo)
check "fault site ESC" "$out" "'ckpt.read\\x1b' is no fault site"
for v in SHARDOPT_MOMENTUM=nan SHARDOPT_LOG_LEVEL=DEBUG SHARDOPT_NUM_THREADS=99999999; do
    out=$(env "$v" "$exe" --steps 1 --layers 1 --experts 2 --hidden 8 --ffn 8 --vocab 16 2>&1)
    rc=$?
    if [ "$rc" -ne 1 ] || grep -q MPI_ABORT <<<"$out" || ! grep -q "${v%%=*}" <<<"$out"; then
        echo "FAIL $v: exit $rc, or MPI_Abort, or no line naming it"
        printf '%s\n' "$out" | head -5
        fail=1
    fi
done

# Paths of short components ("./" repeated): a cut one is a file that can be created.
dots() { local n=$1 s=""; while [ "${#s}" -lt "$n" ]; do s="$s./"; done; printf '%s' "${s:0:$n}"; }
# 1024 bytes ending in %r, "log-%" at byte 1022: cut to 1023 it would lose the r
pad=$((1022 - ${#dir} - 1 - 4))
pad=$((pad - pad % 2))
long="$dir/$(dots $pad)log-%r"
while [ "${#long}" -lt 1024 ]; do long="$dir/./${long#$dir/}"; done
out=$(SHARDOPT_LOG_FILE="$long" demo)
check "long pattern" "$out" "longer than 1023 bytes, logging to stderr"
# 1023 bytes ending in 8 %p, which a pid of 3 digits or more expands past 1023
long="$dir/x%p%p%p%p%p%p%p%p"
while [ "${#long}" -lt 1023 ]; do long="$dir/./${long#$dir/}"; done
[ "${#long}" -eq 1024 ] && long="$dir/${long#$dir/./}" && long="$dir/y${long#$dir/}"
out=$(SHARDOPT_LOG_FILE="$long" demo)
check "long expansion (${#long} bytes)" "$out" "the path is longer than 1023 bytes once expanded"
left=$(find "$dir" -type f | wc -l)
[ "$left" -eq 0 ] || { echo "FAIL: $left file(s) created under a cut name"; find "$dir" -type f | cut -c1-120; fail=1; }

rm -rf "$dir"
[ "$fail" -eq 0 ] && echo "log env escape: ok"
exit $fail
