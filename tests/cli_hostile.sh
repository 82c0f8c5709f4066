#!/usr/bin/env bash
# Hostile command lines for every tool a user runs directly (tools/cli_num.h):
#   tests/cli_hostile.sh WORKDIR NAME=EXECUTABLE...
# Each probe gives one option a value it does not take (negative, zero, 2^63, 1e308, NaN, inf,
# "12abc", "", " 5", a missing value at the end, an unknown option, a product of sizes no int or
# memory holds) or a file argument that is missing, a directory, a FIFO or a hostile JSON file,
# and expects: exit status 2 (1 where the library refuses a checkpoint), within 60 s (no hang),
# under a 16 GiB address-space limit (no huge allocation attempt reaches malloc), no signal, no
# MPI_Abort banner, and one line that names the option or file and what is accepted.
set -uo pipefail
work=$1
shift
declare -A exe
for kv in "$@"; do [ -n "$kv" ] && exe[${kv%%=*}]=${kv#*=}; done
rm -rf "$work" && mkdir -p "$work/adir" "$work/ckdir" && mkfifo "$work/fifo" || exit 1
fails=0 n=0
# The sanitizer build (its test environment sets ASAN_OPTIONS) cannot run under an address-space
# limit: AddressSanitizer reserves terabytes of shadow at start. There the same 16 GiB bound is
# ASan's largest allocation, past which it aborts with a report (a failed probe below).
limit_kib=16777216
if [ -n "${ASAN_OPTIONS+x}" ]; then
    limit_kib=unlimited
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}max_allocation_size_mb=16384:allocator_may_return_null=0"
fi

# probe CODE PROG REGEX ARGS...
probe() {
    local code=$1 prog=$2 want=$3 out rc
    shift 3
    [ -n "${exe[$prog]:-}" ] || return 0 # not built here (ns_bench_cuda without CUDA)
    n=$((n + 1))
    out=$(ulimit -v "$limit_kib"; timeout 60 "${exe[$prog]}" "$@" 2>&1 </dev/null)
    rc=$?
    local what="$prog $(printf "'%s' " "$@")"
    if [ "$rc" -eq 124 ]; then
        echo "FAIL: $what: no answer in 60 s"
    elif [ "$rc" -ne "$code" ]; then
        echo "FAIL: $what: exit $rc, not $code"
    elif ! grep -qE -- "$want" <<<"$out"; then
        echo "FAIL: $what: no line says /$want/"
    elif grep -qE 'MPI_ABORT|Segmentation|core dumped|Sanitizer|out of memory' <<<"$out"; then
        echo "FAIL: $what: a crash, an abort or an allocation"
    elif grep -q $'[\x1b\r]' <<<"$out"; then
        echo "FAIL: $what: a raw escape or carriage return in the output (it rewrites the line)"
    else
        return 0
    fi
    printf '%s\n' "$out" | head -5 | sed 's/^/    /'
    fails=$((fails + 1))
}

# files a tool may be handed: JSON that is not what it expects
printf '{"dims": {"h": 1e308, "dense_layers": 1, "moe_layers": 0}, "global": [{"name": "w", "shape": ["h", "h"]}]}' >"$work/huge_dim.json"
printf '{"dims": {"h": 4294967296, "dense_layers": 1, "moe_layers": 0}, "global": [{"name": "w", "shape": ["h*h*h", 1]}]}' >"$work/wrap.json"
printf '{"dims": {"h": -8, "dense_layers": 1, "moe_layers": 0}, "global": [{"name": "w", "shape": ["h", 4]}]}' >"$work/negative.json"
printf '{"dims": {"h": 8, "dense_layers": 1, "moe_layers": 2147483647}, "global": [{"name": "w", "shape": ["h", 4]}]}' >"$work/layers.json"
printf 'not json' >"$work/garbage.json"
sed 's/"gpus_per_node": *[0-9]*/"gpus_per_node": 0.5/' "$(dirname "$0")/../bench/machines/h200.json" >"$work/half_gpu.json"
sed 's/"gpus_per_node": *[0-9]*/"gpus_per_node": 1e308/' "$(dirname "$0")/../bench/machines/h200.json" >"$work/many_gpu.json"
sed 's/"hbm_gbps": *[0-9.e]*/"hbm_gbps": -1/' "$(dirname "$0")/../bench/machines/h200.json" >"$work/neg_rate.json"
# before, each was planned with exit 0: a rate of 1e-300 (every time inf), a fraction of 2, a
# key twice (the first won), a misspelt key (ignored), a name with an escape (printed raw) or a
# quote (--json's output was not JSON)
H200="$(dirname "$0")/../bench/machines/h200.json"
sed 's/"inter_node_gbps": *[0-9.e]*/"inter_node_gbps": 1e-300/' "$H200" >"$work/tiny_rate.json"
sed 's/"ns_gemm_fraction": *[0-9.e]*/"ns_gemm_fraction": 2/' "$H200" >"$work/frac2.json"
sed 's/"gpus_per_node": *\([0-9]*\)/"gpus_per_node": \1, "gpus_per_node": 4/' "$H200" >"$work/twice.json"
sed 's/"gpus_per_node"/"slot": 2, "gpus_per_node"/' "$H200" >"$work/typo.json"
sed 's/"name": *"h200"/"name": "h\\u001b[2J"/' "$H200" >"$work/esc_name.json"
sed 's/"name": *"h200"/"name": "h\\"200"/' "$H200" >"$work/quote_name.json" # broke --json

# shardopt-plan (no MPI)
P="--preset tiny"
probe 2 plan "--world takes an integer in 1\.\.1048576, not '-1'" $P --world -1
probe 2 plan "--world takes an integer .*'0'" $P --world 0
probe 2 plan "--world takes an integer .*'9223372036854775808'" $P --world 9223372036854775808
probe 2 plan "--world takes an integer .*'12abc'" $P --world 12abc
probe 2 plan "--world takes an integer .*''" $P --world ''
probe 2 plan "--world takes an integer .*' 5'" $P --world ' 5'
probe 2 plan "--world takes an integer .*'1e3'" $P --world 1e3
probe 2 plan "--world takes an integer .*'x'" $P --world 4 --world x
probe 2 plan "a value is missing after '--world'" $P --world
probe 2 plan "unknown argument '--no-such-option'" $P --world 4 --no-such-option 1
probe 2 plan "unknown argument 'stray'" $P --world 4 stray
probe 2 plan "--gpus-per-node takes an integer in 1\.\.1024, not '0'" $P --world 4 --gpus-per-node 0
probe 2 plan "--nodes 65536 x 1024 GPUs per node passes 2\^20" $P --nodes 65536 --gpus-per-node 1024
probe 2 plan "--sweep takes 1 to 256 node counts .*'1,,2'" $P --sweep 1,,2
probe 2 plan "--sweep takes .*'99999999999'" $P --sweep 99999999999
probe 2 plan "--sweep takes .*'4abc'" $P --sweep 4abc
probe 2 plan "--sweep takes .*'2,-1'" $P --sweep 2,-1
# a layout refused part-way through a --json sweep (ep 32 fits 32 GPUs, not 16): the tool left
# the document's head and the layouts before it on stdout with exit 2; stdout must be empty there
probe 2 plan "16 ranks: ep 32 must divide" --preset glm45-air --sweep 4,2 --ep 32 --json
probe 2 plan "16 ranks: ep 32 must divide" --preset glm45-air --sweep 2,4 --ep 32 --json
if [ -n "${exe[plan]:-}" ]; then
    for sw in 4,2 2,4; do
        n=$((n + 1))
        partial=$(timeout 60 "${exe[plan]}" --preset glm45-air --sweep "$sw" --ep 32 --json 2>/dev/null)
        if [ -n "$partial" ]; then
            echo "FAIL: plan --sweep $sw --ep 32 --json: exit 2 with $(printf %s "$partial" | wc -c) bytes on stdout (not empty)"
            fails=$((fails + 1))
        fi
    done
fi
probe 2 plan "--cost-rates takes GFLOPS,GBPS .*'inf,1'" $P --world 4 --cost-rates inf,1
probe 2 plan "--cost-rates takes .*'nan,1'" $P --world 4 --cost-rates nan,1
probe 2 plan "--cost-rates takes .*'1,1,1'" $P --world 4 --cost-rates 1,1,1
probe 2 plan "--cost-rates takes .*'1e308,1'" $P --world 4 --cost-rates 1e308,1
# the range is config_keys.c's for cost_gemm_gflops and cost_net_gbps, (0, 1e9]: the tool plans
# as commit does, so it takes every rate commit takes (it refused those under 1e-6)
probe 2 plan "--cost-rates takes GFLOPS,GBPS \(both in \(0, 1e9\]\).*'0,1'" $P --world 4 --cost-rates 0,1
probe 2 plan "--cost-rates takes .*'1,-0'" $P --world 4 --cost-rates 1,-0
probe 0 plan "preset tiny" $P --world 4 --cost-rates 1e-9,1e9
probe 2 plan "--team-frac takes a number in \(0, 1\], not 'nan'" $P --world 4 --team-frac nan
probe 2 plan "--team-frac takes .*'0'" $P --world 4 --team-frac 0
probe 2 plan "--teams takes node or a power of two, not '3'" $P --world 4 --teams 3
probe 2 plan "--offload takes none, optimizer or cpu, not 'gpu'" $P --world 4 --offload gpu
probe 2 plan "--layers takes an integer .*'99999999999'" $P --world 4 --layers 99999999999
probe 2 plan "machine file $work/nonexistent: cannot read" $P --world 4 --machine "$work/nonexistent"
probe 2 plan "machine file $work/adir: cannot read" $P --world 4 --machine "$work/adir"
probe 2 plan "machine file $work/fifo: cannot read" $P --world 4 --machine "$work/fifo"
probe 2 plan "machine file .*garbage.json: not JSON" $P --world 4 --machine "$work/garbage.json"
probe 2 plan "\"gpus_per_node\" must be a whole number in 1\.\.1024" $P --world 4 --machine "$work/half_gpu.json"
probe 2 plan "\"gpus_per_node\" must be a whole number in 1\.\.1024" $P --sweep 1 --machine "$work/many_gpu.json"
probe 2 plan "\"hbm_gbps\" must be a number in \[1e-06, 1e\+12\]" $P --world 4 --machine "$work/neg_rate.json"
probe 2 plan "\"inter_node_gbps\" must be a number in \[1e-06, 1e\+12\]" $P --world 4 --machine "$work/tiny_rate.json"
probe 2 plan "\"ns_gemm_fraction\" must be a number in \[1e-06, 1\]" $P --world 4 --machine "$work/frac2.json"
probe 2 plan "machine file .*twice.json: not JSON \(key 'gpus_per_node' appears twice" $P --world 4 --machine "$work/twice.json"
probe 2 plan "machine file .*typo.json: unknown key 'slot'" $P --world 4 --machine "$work/typo.json"
probe 2 plan "machine file .*esc_name.json: \"name\" must be text" $P --world 4 --machine "$work/esc_name.json"
probe 2 plan "machine file .*quote_name.json: \"name\" must be text" $P --world 4 --json --machine "$work/quote_name.json"
probe 2 plan "1048576 ranks: planning 735 tensors over a group of up to 1048576 needs about .* GiB, more than the .* GiB this process may have" --preset glm45-air --world 1048576
probe 2 plan "preset $work/nonexistent.json: cannot read" --preset "$work/nonexistent.json" --world 4
probe 2 plan "preset $work/fifo: cannot read" --preset "$work/fifo" --world 4
probe 2 plan "preset .*huge_dim.json: dims must be .*whole numbers in 0\.\.2\^40 \(\"h\"" --preset "$work/huge_dim.json" --world 4
probe 2 plan "preset .*negative.json: dims must be .*\(\"h\"" --preset "$work/negative.json" --world 4
probe 2 plan "preset .*wrap.json: tensor 'w': shape entry 0 is not a whole number" --preset "$work/wrap.json" --world 4
probe 2 plan "preset .*layers.json: dense_layers \+ moe_layers past 65536" --preset "$work/layers.json" --world 4
probe 2 plan "preset .*garbage.json: not JSON" --preset "$work/garbage.json" --world 4

# ns_bench (no MPI)
probe 2 ns "--threads takes an integer in 1\.\.1024, not '0'" --threads 0
probe 2 ns "--reps takes an integer in 1\.\.1000, not '-1'" --reps -1
probe 2 ns "--reps takes .*'99999999999'" --reps 99999999999
probe 2 ns "--shape takes MxN or BxMxN .*'0x5'" --shape 0x5
probe 2 ns "--shape takes .*'99999999999x2'" --shape 99999999999x2
probe 2 ns "--shape takes .*'4x4x4x4'" --shape 4x4x4x4
probe 2 ns "--shape takes .*within memory, not '65536x65536'" --shape 65536x65536
probe 2 ns "--shape takes .*' 12x12'" --shape ' 12x12'
probe 2 ns "--shape takes .*'12x12abc'" --shape 12x12abc
probe 2 ns "--compute needs a value" --compute
probe 2 ns "unknown argument '--bogus'" --bogus

# plan-world-sim (no MPI)
probe 2 pws "--ep needs a value" --worlds 8 --ep
probe 2 pws "--ep takes an integer in 1\.\.1048576, not '0'" --worlds 8 --ep 0
probe 2 pws "--worlds takes 1 to 64 integers in 1\.\.1048576 .*'99999999999'" --worlds 99999999999
probe 2 pws "--worlds takes .*'8,,16'" --worlds 8,,16
probe 2 pws "--ranks takes .*'-1'" --worlds 8 --ranks -1
probe 2 pws "--bucket-bytes takes an integer in 0\.\.2\^40, not '-1'" --worlds 8 --bucket-bytes -1
probe 2 pws "--max-growth takes a number in 0\.\.1e6, not 'nan'" --worlds 8 --max-growth nan
probe 2 pws "unknown argument '--bogus'" --bogus 1

# compare_driver (one process)
mkdir -p "$work/m_nokeys" "$work/m_4d" "$work/m_steps" "$work/m_dir/manifest.json" "$work/m_fifo"
echo '{"tensors": []}' >"$work/m_nokeys/manifest.json"
echo '{"tensors": [{"name": "w", "shape": [2, 2, 2, 2]}], "steps": 1, "lr": 0.1, "weight_decay": 0}' >"$work/m_4d/manifest.json"
echo '{"tensors": [], "steps": 1e308, "lr": 0.1, "weight_decay": 0}' >"$work/m_steps/manifest.json"
mkdir -p "$work/m_twice" # the first "steps" was taken, the second dropped without a word
echo '{"tensors": [], "steps": 1, "lr": 0.1, "weight_decay": 0, "steps": 5}' >"$work/m_twice/manifest.json"
mkfifo "$work/m_fifo/manifest.json"
probe 2 cmp "the first argument is manifest or run, not 'bogus'" bogus
probe 2 cmp "--layers: takes an integer in 0\.\.65536, not 'abc'" manifest --preset tiny --layers abc "$work/out.json"
probe 2 cmp "--layers: needs a value" manifest --preset tiny --layers
probe 2 cmp "--threads: takes an integer in 0\.\.1024, not '-3'" run "$work/m_nokeys" --threads -3
probe 2 cmp "m_nokeys/manifest.json: \"steps\" must be a number" run "$work/m_nokeys"
probe 2 cmp "m_4d/manifest.json: tensor 0 needs a \"name\" and a \"shape\" of 1 to 3" run "$work/m_4d"
probe 2 cmp "m_steps/manifest.json: \"steps\" must be a number in 0\.\.1e\+06" run "$work/m_steps"
probe 2 cmp "m_twice/manifest.json: not JSON \(key 'steps' appears twice" run "$work/m_twice"
probe 2 cmp "reading: .*m_dir/manifest.json" run "$work/m_dir"
probe 2 cmp "reading: .*m_fifo/manifest.json" run "$work/m_fifo"
probe 2 cmp "compare_driver: $work/fifo: No such device or address" manifest --preset tiny "$work/fifo"

# moe_train (MPI, a singleton here: every rank parses the same argv)
probe 2 moe_train "--steps takes an integer in 1\.\.10000000, not '2147483647'" --steps 2147483647
probe 2 moe_train "--steps takes .*'9223372036854775808'" --steps 9223372036854775808
probe 2 moe_train "--steps takes .*'0'" --steps 0
probe 2 moe_train "--steps takes .*'1e308'" --steps 1e308
probe 2 moe_train "--lr takes a number in 0\.\.1e\+06, not 'nan'" --lr nan
probe 2 moe_train "--adamw-lr takes .*'inf'" --adamw-lr inf
probe 2 moe_train "--lr takes .*'-1'" --lr -1
probe 2 moe_train "--window takes .*'-1'" --window -1
probe 2 moe_train "--topk 17 is more than --experts 16" --topk 17
probe 2 moe_train "a tensor of 1099511627776 elements" --vocab 16777216 --hidden 65536
probe 2 moe_train "the model and batch .* needs about .* GiB per rank, more than the .* GiB this process may have" --tokens-per-rank 16777216 --experts 16 --topk 16 --ffn 65536
probe 2 moe_train "--resume '$work/nonexistent': No such file" --resume "$work/nonexistent"
probe 2 moe_train "1 ranks are not --dp-replicate 1048576 x dp_shard x --cp 1048576" --dp-replicate 1048576 --cp 1048576
probe 2 moe_train "--save '/dev/null': not a directory" --save /dev/null
probe 2 moe_train "--save takes a directory, not ''" --save ''
probe 2 moe_train "cannot resume from $work/adir/model.bin" --resume "$work/adir" --steps 1 --cp 1 --ep 1
mkdir -p "$work/fifo_resume" && mkfifo "$work/fifo_resume/model.bin"
# a model.bin of this model but no optimizer state beside it (removed, or never copied); and a
# save whose optimizer/ is a file: the library refuses on every rank, the job ends without MPI_Abort
small=(--steps 1 --cp 1 --ep 1 --hidden 16 --ffn 16 --experts 2 --vocab 32 --out 8 --tokens-per-rank 8 --quiet)
if [ -n "${exe[moe_train]:-}" ] && "${exe[moe_train]}" "${small[@]}" --save "$work/saved" >/dev/null 2>&1; then
    rm -rf "$work/saved/optimizer"
    probe 1 moe_train "--resume: load: .*$work/saved/optimizer" "${small[@]}" --resume "$work/saved"
    rm -rf "$work/saved/optimizer" && touch "$work/saved/optimizer"
    probe 1 moe_train "cannot make $work/saved/optimizer|--save: save: .*$work/saved/optimizer" "${small[@]}" --save "$work/saved"
elif [ -n "${exe[moe_train]:-}" ]; then
    echo "FAIL: moe_train ${small[*]} --save $work/saved did not save" && fails=$((fails + 1))
fi
mkdir -p "$work/fifo_save" && mkfifo "$work/fifo_save/model.bin"
probe 1 moe_train "--save: writing $work/fifo_save/model.bin failed: No such device or address" --save "$work/fifo_save" --steps 1 --cp 1 --ep 1 --quiet
probe 1 plan "--calibrate $work/fifo: cannot write it: No such device or address" --calibrate "$work/fifo" --threads 1
probe 2 moe_train "cannot resume from $work/fifo_resume/model.bin" --resume "$work/fifo_resume" --steps 1 --cp 1 --ep 1

# shardopt-bench (MPI)
probe 2 step_bench "--steps takes an integer in 1\.\.1000000, not '2147483647'" --steps 2147483647
probe 2 step_bench "--warmup takes .*'-1'" --warmup -1
probe 2 step_bench "--threads takes an integer in 0\.\.1024, not '-1'" --threads -1
probe 2 step_bench "--expert-shard-dim takes an integer in 0\.\.2, not '3'" --expert-shard-dim 3
probe 2 step_bench "--bucket-mib takes a number in .*'1e308'" --bucket-mib 1e308
probe 2 step_bench "--bucket-mib takes .*'nan'" --bucket-mib nan
probe 2 step_bench "the preset as scaled .* needs about .* GiB per rank" --layers 60000 --width-div 1 --experts-div 1
probe 2 step_bench "preset $work/nonexistent.json: cannot read" --preset "$work/nonexistent.json"
probe 2 step_bench "preset $work/adir/x.json: cannot read" --preset "$work/adir/x.json"
probe 2 step_bench "preset .*wrap.json: tensor 'w'" --preset "$work/wrap.json"
probe 2 step_bench "--set takes KEY=VALUE, not 'nokey'" --set nokey
probe 2 step_bench "--steps needs a value" --steps

probe 1 step_bench "shardopt-bench: init: .*1 ranks cannot be split as dp_replicate 1048576 x cp 1048576" --dp-replicate 1048576 --cp 1048576
probe 2 step_bench "--set bucket_bytes=-1: config bucket_bytes .*accepted an integer" --set bucket_bytes=-1

# ckpt_bench (MPI)
probe 2 ckpt_bench "--dir '/dev/null': cannot make it: Not a directory" --dir /dev/null
probe 2 ckpt_bench "--dir '$work/fifo': cannot make it: Not a directory" --dir "$work/fifo"
probe 2 ckpt_bench "--dir '': cannot make it" --dir ''
probe 1 ckpt_bench "ckpt_bench: init: layout: ep 3 must divide" --ep 3 --dir "$work/ckdir"
probe 2 ckpt_bench "--reps takes an integer in 1\.\.100000, not '0'" --reps 0
probe 2 ckpt_bench "--reps takes .*'1000000'" --reps 1000000
probe 2 ckpt_bench "--ep takes an integer in 1\.\.65536, not '-1'" --ep -1
probe 2 ckpt_bench "--layers takes .*'99999999999'" --layers 99999999999
probe 2 ckpt_bench "the preset as scaled .* needs about" --layers 60000 --width-div 1 --experts-div 1
probe 2 ckpt_bench "preset $work/fifo: cannot read" --preset "$work/fifo"

# moe_demo (MPI, one process)
probe 2 moe_demo "--steps takes an integer in 1\.\.1000000, not '2147483647'" --steps 2147483647
probe 2 moe_demo "--layers takes an integer in 1\.\.65536, not '2147483647'" --layers 2147483647
probe 2 moe_demo "--hidden takes .*'-5'" --hidden -5
probe 2 moe_demo "--config: .*nonexistent" --config "$work/nonexistent.json"
probe 2 moe_demo "--config: .*is a directory" --config "$work/adir"
probe 2 moe_demo "--config: .*is a FIFO" --config "$work/fifo"
probe 2 moe_demo "--offload: .*'gpu'" --offload gpu

# c_trainer (MPI, a singleton; the public API only)
probe 2 c_trainer "--steps takes an integer in 1\.\.1000000, not '12abc'" --steps 12abc
probe 2 c_trainer "--steps takes .*'-5'" --steps -5
probe 2 c_trainer "--steps takes .*'2147483648'" --steps 2147483648
probe 2 c_trainer "--save-at takes an integer in 0\.\.1000000, not 'x'" --save-at x
probe 2 c_trainer "--dir needs a value" --dir
probe 2 c_trainer "unknown argument '--bogus'" --bogus
probe 2 c_trainer "--save-at needs --dir" --save-at 1
probe 1 c_trainer "--resume '$work/nonexistent': " --resume "$work/nonexistent"
probe 1 c_trainer "--resume '$work/fifo': " --resume "$work/fifo"
probe 1 c_trainer "--dir '/dev/null': save: .*Not a directory" --steps 1 --save-at 1 --dir /dev/null

# the helpers shardopt-plan --calibrate runs, and the other benchmarks
probe 2 pingpong "--mib takes an integer in 1\.\.4096, not '16x'" --mib 16x
probe 2 pingpong "--reps takes an integer in 1\.\.1000, not ''" --reps
probe 2 pingpong "unknown argument '--bogus'" --bogus 1
probe 2 ew "--mib takes an integer in 1\.\.1048576 whose buffers fit in memory, not '1048576'" --mib 1048576
probe 2 ew "--reps takes .*'0'" --reps 0
probe 2 ew "unknown argument '--bogus'" --bogus
probe 2 cib "--ep takes an integer in 1\.\.1048576, not '0'" --ep 0
probe 2 cib "world '1024x': takes an integer in 1\.\.16777216" --worlds 1024x
probe 2 nscuda "--shape takes BxMxN .*'9999999999999999999x4x4'" --shape 9999999999999999999x4x4
probe 2 nscuda "--shape takes BxMxN .*'4x4'" --shape 4x4
probe 2 nscuda "--reps takes an integer in 1\.\.1000, not '10x'" --reps 10x
probe 2 nscuda "unknown argument '--bogus'" --bogus

# an argument holding a control byte (an escape sequence, a newline, a CR): refused before any
# is parsed, the byte shown escaped, never printed raw (ESC [2J cleared the terminal over the
# message that named it; a newline split it in two)
esc=$'\e[2J'
for t in plan ns pws cmp ew cib nscuda pingpong moe_train moe_demo step_bench ckpt_bench; do
    probe 2 "$t" "argument 2 holds the control byte \\\\x1b at byte 1, refused: 'x\\\\x1b\[2J'" \
        --preset "x$esc"
done
probe 2 plan "argument 1 holds the control byte \\\\x0a at byte 7" $'--world\n4'
probe 2 c_trainer "argument 2 holds a control byte, refused" --dir "x$esc"
probe 2 moe_train "argument 3 holds the control byte \\\\x0d at byte 0" --steps 1 $'\rx'

# standard output that cannot take the output: /dev/full (every write ENOSPC, as a full disk) and
# a closed stdout (EBADF). Each tool exited 0 with its plan, --json document or usage lost; now
# exit 1 and a line naming the error (tools/cli_num.h, cli_stdout_at_exit)
# full_probe WHY PROG ARGS...: stdout to /dev/full (WHY "full") or closed (WHY "closed")
full_probe() {
    local why=$1 prog=$2 out rc want
    shift 2
    [ -n "${exe[$prog]:-}" ] || return 0
    n=$((n + 1))
    if [ "$why" = full ]; then
        out=$(timeout 60 "${exe[$prog]}" "$@" 2>&1 >/dev/full </dev/null)
        rc=$?
        want="[a-z_-]+: writing standard output failed \((No space left on device|an earlier write to it failed)\)"
    else
        out=$(timeout 60 "${exe[$prog]}" "$@" 2>&1 >&- </dev/null)
        rc=$?
        want="writing standard output failed \((Bad file descriptor|an earlier write to it failed)\)"
    fi
    if [ "$rc" -ne 1 ] || ! grep -qE -- "$want" <<<"$out"; then
        echo "FAIL: $prog $(printf "'%s' " "$@")with stdout $why: exit $rc, not 1 with /$want/"
        printf '%s\n' "$out" | head -3 | sed 's/^/    /'
        fails=$((fails + 1))
    fi
}
if [ -w /dev/full ]; then
    full_probe full plan --preset tiny --world 4
    full_probe full plan --preset tiny --world 4 --json
    full_probe full cib --help
    full_probe full moe_demo
    full_probe full moe_train --help
    full_probe full step_bench --help
    full_probe full ckpt_bench --help
    full_probe full c_trainer --steps 1
fi
full_probe closed plan --preset tiny --world 4

rm -rf "$work"
[ "$fails" -eq 0 ] && echo "cli hostile: ok ($n probes)"
exit $((fails > 0))
