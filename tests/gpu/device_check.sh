#!/usr/bin/env bash
# One run of everything that needs a GPU, for a machine that has one:
#   tests/gpu/device_check.sh OUTDIR [tests]
# configures and builds the CUDA backend (the full project when MPI, hwloc, OpenBLAS, oneDNN and
# cJSON are installed; otherwise the kernels layer alone, SHARDOPT_GPU_KERNELS_ONLY), or with
# SHARDOPT_GPU_PREBUILT=ARCHIVE (made by tests/gpu/pack_prebuilt.sh on a machine that has the
# libraries) unpacks that build and compiles nothing. Then, in this order (what has never run on
# a GPU first: the first matter most when time runs short), each under its own `timeout`, every
# step run whatever the steps before it gave:
#   kernels  test_cuda_kernels (incl. the Gram and AOL kernels), test_cuda_memory, test_ns_driver
#            (the Gram result guard through the driver's host stand-ins), ns_bench_cuda_smoke
#                                                                         -> ctest.log
#   layouts  test_cuda_layouts_np1/np2/np4: the runtime on 1, 2 and 4 ranks sharing the GPU
#            (comm_backend = mpi): device teams in fp32 and bf16 (cuBLAS bf16 team kernels),
#            sharded Newton-Schulz, Gram and AOL, against the CPU's bits -> ctest.log
#   ns_cuda  ns_bench_cuda itself: standard, Gram and AOL side by side    -> ns_cuda.json
#   torch_cuda  tests/gpu/torch_cuda_stream.py: shardopt.torch on CUDA tensors, the step on
#            torch's current stream and on a side stream, against the CPU backend -> torch_cuda.log
#   nccl_gpu any gpu-labelled CTest whose name says nccl (none yet; expert teams over NCCL, the
#            expnccl work, may add one): run where present, a note where none -> ctest.log
#   nccl_teams, nccl_sharded, nccl_experts  with 2 GPUs or more (NCCL refuses two ranks on one
#            GPU, see nccl2): shardopt-bench --comm-backend nccl on one rank per GPU with teams
#            (fp32, then bf16: ncclFloat32 / ncclBfloat16 Gram all-reduces), ns_strategy =
#            sharded (incl. the ncclFloat64 norm) and expert shard groups with teams; on one
#            GPU each is a row with exit status -4 (needs 2 GPUs)   -> nccl_multi.log
#   offload  test_cuda_offload_np2, test_cuda_offload_cpu_np2           -> ctest.log
#   gpu      every other gpu-labelled test                              -> ctest.log
#   demo     examples/moe_train --backend cuda beside --backend cpu, 2 ranks -> demo.log
#   step     shardopt-bench --backend cuda --offload both --momentum-dtype both, GLM-4.5-Air at
#            full width, experts / 8, SHARDOPT_GPU_BENCH_LAYERS layers (4)   -> step_bench.md
#   ranks2, ranks4  shardopt-bench --backend cuda on 2 and 4 MPI ranks on the one GPU
#                                                                         -> step_np2.md, step_np4.md
#   nccl1    comm_backend = nccl with one rank                              -> nccl_np1.log
#   nccl2    two ranks on one GPU over NCCL: both must return an error within the limit (NCCL
#            refuses two ranks on one device), not hang                     -> nccl_probe.log
#   ns       ns_bench --backend cuda on issue 7's shapes, then plain against symmetric over more
#            shapes                                                 -> ns_bench.json, ns_variants.json
#   ns_gram  Gram Newton-Schulz and AOL beside the standard algorithm (issue 23: --algorithm all
#            --precondition all) on GLM-4.5-Air's Newton-Schulz shapes  -> ns_gram.json
#   memcheck compute-sanitizer on test_cuda_kernels (informational)         -> ctest.log
# Everything after the build shares a budget of SHARDOPT_GPU_BUDGET_S seconds (390) from the
# script's start: a step gets its own limit or what is left, whichever is less, and is skipped
# (rc -2 in steps.tsv) when under 10 s are left, so the whole run stays within 7 minutes of
# device time when the build is prebuilt. OUTDIR receives nvidia-smi.txt, build.log, steps.tsv
# (step, limit, seconds, exit status) and summary.json besides the logs above.
# SHARDOPT_GPU_EXISTING=1: SHARDOPT_GPU_BUILD used as it is, no configure or build (a rerun).
# SHARDOPT_GPU_RETURN=DIR (a device tool's $OUT, which brings back at most 8 files): the whole
# OUTDIR packed into DIR/device_check.tar.gz, with summary.json and steps.tsv beside it;
# steps.tsv is copied there after every step too, so a run killed at its limit still says how
# far it got.
# Without a visible GPU it says so, writes summary.json with mode "no-gpu" and exits 77;
# SHARDOPT_GPU_DRY_RUN=1 then also lists the steps it would run, with their time limits (CTest
# device_check_dry_run runs that here, so the script keeps parsing and listing every step).
# "tests" as the second argument: the gpu tests and ns_bench only (a short rerun after a fix).
set -uo pipefail
out=${1:?usage: tests/gpu/device_check.sh OUTDIR [tests]}
only_tests=${2:-} # "tests": the gpu tests and ns_bench only (a short rerun after a fix)
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
budget=${SHARDOPT_GPU_BUDGET_S:-390}
layers=${SHARDOPT_GPU_BENCH_LAYERS:-4}
dry=${SHARDOPT_GPU_DRY_RUN:-0}
bd=${SHARDOPT_GPU_BUILD:-$root/build-gpu}
arch=${SHARDOPT_CUDA_ARCH:-90}
jobs=$(nproc)
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >>"$out/nvidia-smi.txt"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
: >"$out/steps.tsv"

# step NAME LIMIT_S LOG COMMAND...: the command under timeout min(LIMIT_S, budget left), its
# output appended to LOG, a line in steps.tsv; sets step_rc (-2: skipped, no time left)
step() {
    local name=$1 limit=$2 log=$3 left t s
    shift 3
    left=$((budget - $(elapsed)))
    t=$((limit < left ? limit : left))
    if [ "$dry" = 1 ]; then
        echo "would run: $name (limit ${limit} s) > $(basename "$log"): $*"
        step_rc=-3
        return
    fi
    if [ "$t" -lt 10 ]; then
        printf '%s\t%s\t0\t-2\n' "$name" "$limit" >>"$out/steps.tsv"
        echo "--- $name: skipped, ${left} s of the ${budget} s budget left ---" >>"$log"
        step_rc=-2
        return
    fi
    # a JSON output keeps only the program's stdout; its stderr and these lines go beside it
    local err=$log
    case $log in *.json) err=${log%.json}.log ;; esac
    echo "--- $name: $* (limit ${t} s) ---" >>"$err"
    s=$(date +%s)
    timeout -k 5 "$t" "$@" >>"$log" 2>>"$err"
    step_rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$t" $(($(date +%s) - s)) "$step_rc" >>"$out/steps.tsv"
    echo "--- $name: exit status $step_rc after $(($(date +%s) - s)) s ---" >>"$err"
    returned
}

# steps.tsv so far into SHARDOPT_GPU_RETURN: a run killed at its limit still brings it back
returned() {
    [ -n "${SHARDOPT_GPU_RETURN:-}" ] || return 0
    mkdir -p "$SHARDOPT_GPU_RETURN" && cp "$out/steps.tsv" "$SHARDOPT_GPU_RETURN/"
}

# multi NAME LIMIT_S LOG COMMAND...: step, where 2 GPUs or more are visible; else a row with exit
# status -4 (NCCL refuses two ranks on one GPU: the step cannot run on this machine)
multi() {
    if [ "$dry" = 1 ] || [ "$gpus" -ge 2 ]; then
        step "$@"
        return
    fi
    printf '%s\t%s\t0\t-4\n' "$1" "$2" >>"$out/steps.tsv"
    echo "--- $1: not run, needs 2 GPUs ($gpus visible) ---" >>"$3"
    step_rc=-4
    returned
}

if [ "$gpus" -eq 0 ]; then
    echo "device_check: no GPU visible (nvidia-smi -L lists none): nothing to check"
    if [ "$dry" = 1 ]; then # the steps a GPU machine would run, with placeholder paths
        bd=${bd:-$root/build-gpu}
        mode=dry-run
    else
        printf '{"mode": "no-gpu", "seconds": %s}\n' "$(elapsed)" >"$out/summary.json"
        cat "$out/summary.json"
        [ -z "${SHARDOPT_GPU_RETURN:-}" ] ||
            { mkdir -p "$SHARDOPT_GPU_RETURN" && cp "$out/summary.json" "$SHARDOPT_GPU_RETURN/"; }
        exit 77
    fi
fi
# images that install CUDA without putting nvcc on the PATH
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
{ command -v nvcc && nvcc --version | tail -1 && cmake --version | head -1; } >>"$out/nvidia-smi.txt" 2>&1

# a prebuilt tree: the build at its original absolute path, the packed libraries first on the
# loader's path, the packed Open MPI's plugins, help files and settings named by environment
# (an Open MPI in the image may have other plugins at the compiled-in paths)
unpack_prebuilt() {
    local pb f dirs=""
    echo "image: $(ls -d /usr/lib/x86_64-linux-gnu/openmpi /usr/bin/*mpi* 2>&1 | tr '\n' ' ')"
    pb=$(mktemp -d) && tar -xJf "$1" -C "$pb" || return 1
    bd=$(cat "$pb/build_path")
    mkdir -p "$(dirname "$bd")" && rm -rf "$bd" && mv "$pb/build" "$bd" || return 1
    export OPAL_PKGLIBDIR="$pb/ompi/plugins" OPAL_PKGDATADIR="$pb/ompi/share" \
        OPAL_SYSCONFDIR="$pb/ompi/etc" OMPI_MCA_mca_base_component_path="$pb/ompi/plugins" \
        PMIX_MCA_mca_base_component_path="$pb/ompi/pmix" PMIX_MCA_pcompress_base_silence_warning=1
    # CTest names /usr/bin/mpiexec: it must be the packed Open MPI's launcher
    [ -e /usr/bin/mpiexec ] || [ -L /usr/bin/mpiexec ] && mv /usr/bin/mpiexec /usr/bin/mpiexec.image
    ln -s "$pb/bin/orterun" /usr/bin/mpiexec || return 1
    for f in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
        f=$(find /usr/local/cuda/ /usr/local/lib /usr/lib /opt -name "$f" -print -quit 2>/dev/null)
        [ -n "$f" ] && dirs="$dirs:$(dirname "$f")"
    done
    export LD_LIBRARY_PATH="$pb/lib$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "prebuilt build at $bd; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd "$bd/libshardopt.so" "$bd/tests/test_device_sim" | grep -i 'not found' && return 1
    return 0
}

: >"$out/build.log"
[ "$dry" = 1 ] || mode=none
configure_rc=0
if [ "$dry" = 1 ]; then
    mode=dry-run
elif [ "${SHARDOPT_GPU_EXISTING:-0}" = 1 ]; then # SHARDOPT_GPU_BUILD as it is: a rerun
    mode=existing
elif [ -n "${SHARDOPT_GPU_PREBUILT:-}" ]; then
    if unpack_prebuilt "$SHARDOPT_GPU_PREBUILT" >>"$out/build.log" 2>&1; then
        mode=prebuilt
        configure_rc=0
    else # a prebuilt tree that does not load here: build here instead
        echo "--- prebuilt tree unusable; building here ---" >>"$out/build.log"
        bd=${SHARDOPT_GPU_BUILD:-$root/build-gpu}
    fi
fi
if [ "$mode" = prebuilt ] || [ "$mode" = dry-run ] || [ "$mode" = existing ]; then
    :
elif timeout 120 cmake -S "$root" -B "$bd" -DCMAKE_BUILD_TYPE=Release -DSHARDOPT_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >>"$out/build.log" 2>&1; then
    mode=full
    configure_rc=0
else
    mode=kernels-only
    rm -rf "$bd"
    echo "--- full configure failed; kernels-only build ---" >>"$out/build.log"
    timeout 120 cmake -S "$root" -B "$bd" -DCMAKE_BUILD_TYPE=Release -DSHARDOPT_GPU_KERNELS_ONLY=ON \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" >>"$out/build.log" 2>&1
    configure_rc=$?
fi

build_rc=1
if [ "$mode" = prebuilt ] || [ "$mode" = dry-run ] || [ "$mode" = existing ]; then
    build_rc=$configure_rc
elif [ "$configure_rc" -eq 0 ]; then
    if [ "$mode" = full ]; then # the layout tests on the GPU need the MPI test too
        timeout 300 cmake --build "$bd" -j "$jobs" >>"$out/build.log" 2>&1
    else
        timeout 300 cmake --build "$bd" -j "$jobs" --target test_cuda_memory test_cuda_kernels \
            test_ns_driver ns_bench_cuda >>"$out/build.log" 2>&1
    fi
    build_rc=$?
fi

test_rc=1
bench_rc=1
demo_rc=-1 # -1: not run (kernels-only build, or "tests")
step_rc_main=-1
np2_rc=-1
np4_rc=-1
nccl1_rc=-1
nccl_rc=-1
ns_gram_rc=-1
if [ "$build_rc" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    mpiexec=/usr/bin/mpiexec
    full=0
    [ "$mode" != kernels-only ] && [ "$only_tests" != tests ] && full=1
    : >"$out/ctest.log"
    ct=(ctest --test-dir "$bd" --output-on-failure -V) # `timeout` runs programs, not functions
    step kernels 90 "$out/ctest.log" "${ct[@]}" \
        -R '^(test_cuda_kernels|test_cuda_memory|test_ns_driver|ns_bench_cuda_smoke)$'
    kernels_rc=$step_rc
    layouts_rc=-1
    if [ "$mode" != kernels-only ]; then
        step layouts 120 "$out/ctest.log" "${ct[@]}" -R '^test_cuda_layouts_np[124]$'
        layouts_rc=$step_rc
    fi
    nscuda=$(find "$bd" -name ns_bench_cuda -type f -perm -u+x -print -quit 2>/dev/null)
    [ "$dry" = 1 ] && nscuda=${nscuda:-$bd/bench/ns_bench_cuda}
    ns_cuda_rc=-1
    if [ -n "$nscuda" ]; then
        step ns_cuda 30 "$out/ns_cuda.json" "$nscuda" --json --reps 3 --algorithm all \
            --precondition all --shape 2x128x192 --shape 1x1408x4096 --shape 16x512x2048
        ns_cuda_rc=$step_rc
    fi
    torch_rc=-1
    if [ "$full" = 1 ]; then
        # python3 is the one with torch on the device machine; 77: no torch or no CUDA there
        step torch_cuda 45 "$out/torch_cuda.log" env SHARDOPT_LIBRARY="$bd/libshardopt.so" \
            PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
            python3 "$root/tests/gpu/torch_cuda_stream.py"
        torch_rc=$step_rc
    fi
    # NCCL on the GPU in a CTest (expert teams over NCCL may bring one): whichever exists
    step nccl_gpu 30 "$out/ctest.log" "${ct[@]}" -L gpu -R nccl --no-tests=ignore
    nccl_gpu_rc=$step_rc
    nccl_multi_rc=-1
    if [ "$full" = 1 ]; then
        # one rank per GPU (at most 4), the smallest model; ns_team_frac 0.01 makes every Muon
        # matrix heavy enough for a team
        n=$((gpus < 4 ? gpus : 4))
        [ "$n" -ge 2 ] || n=2
        nb=("$mpiexec" -n "$n" "$bd/bench/shardopt-bench" --backend cuda --comm-backend nccl
            --dp-shard "$n" --layers 1 --warmup 1 --steps 2 --momentum-dtype fp32 --offload none)
        multi nccl_teams 40 "$out/nccl_multi.log" "${nb[@]}" --set ns_team_cap=2 \
            --set ns_team_frac=0.01 --set ns_compute=fp32
        nccl_multi_rc=$step_rc
        multi nccl_teams_bf16 40 "$out/nccl_multi.log" "${nb[@]}" --set ns_team_cap=2 \
            --set ns_team_frac=0.01 --set ns_compute=bf16
        [ "$step_rc" -gt "$nccl_multi_rc" ] && nccl_multi_rc=$step_rc
        multi nccl_sharded 40 "$out/nccl_multi.log" "${nb[@]}" --set ns_strategy=sharded
        [ "$step_rc" -gt "$nccl_multi_rc" ] && nccl_multi_rc=$step_rc
        # expert shard groups of 2 (experts chunked along a matrix dim) with teams over NCCL
        multi nccl_experts 40 "$out/nccl_multi.log" "${nb[@]}" --expert-shard-dim 1 \
            --set ns_team_cap=2 --set ns_team_frac=0.01
        [ "$step_rc" -gt "$nccl_multi_rc" ] && nccl_multi_rc=$step_rc
    fi
    offload_rc=-1
    if [ "$mode" != kernels-only ]; then
        step offload 60 "$out/ctest.log" "${ct[@]}" -R '^test_cuda_offload(_cpu)?_np2$'
        offload_rc=$step_rc
    fi
    step gpu 45 "$out/ctest.log" "${ct[@]}" -L gpu -E \
        '^(test_cuda_kernels|test_cuda_memory|ns_bench_cuda_smoke|test_cuda_layouts_np[124]|test_cuda_offload(_cpu)?_np2)$|nccl' \
        --no-tests=ignore
    gpu_rc=$step_rc
    test_rc=$((kernels_rc != 0 || layouts_rc > 0 || gpu_rc != 0 || offload_rc > 0))
    if [ "$full" = 1 ]; then
        # the demo's GPU path (Newton-Schulz on the device, offload = cpu) beside its CPU run
        step demo 60 "$out/demo.log" "$root/tests/mpi/moe_train_backend.sh" "$mpiexec" \
            "$bd/examples/moe_train"
        demo_rc=$step_rc
        bench_args=(--backend cuda --width-div 1 --experts-div 8 --warmup 2 --steps 5)
        step step 75 "$out/step_bench.md" "$mpiexec" -n 1 "$bd/bench/shardopt-bench" \
            "${bench_args[@]}" --layers "$layers" --momentum-dtype both --offload both
        step_rc_main=$step_rc
        # ranks sharing the one GPU (comm_backend = mpi through the pinned host mirrors)
        step ranks2 40 "$out/step_np2.md" "$mpiexec" -n 2 --oversubscribe \
            "$bd/bench/shardopt-bench" "${bench_args[@]}" --layers 1 --dp-shard 2 \
            --momentum-dtype fp32 --offload none
        np2_rc=$step_rc
        step ranks4 45 "$out/step_np4.md" "$mpiexec" -n 4 --oversubscribe \
            "$bd/bench/shardopt-bench" "${bench_args[@]}" --layers 1 --dp-shard 2 --ep 2 \
            --momentum-dtype fp32 --offload none
        np4_rc=$step_rc
        step nccl1 40 "$out/nccl_np1.log" "$mpiexec" -n 1 "$bd/bench/shardopt-bench" \
            "${bench_args[@]}" --layers 1 --comm-backend nccl --momentum-dtype fp32 \
            --offload none
        nccl1_rc=$step_rc
        # NCCL refuses two ranks on one GPU: what is checked is that both ranks return an error
        # (SHARDOPT_ERR_NCCL, named) within the time limit instead of hanging
        step nccl2 30 "$out/nccl_probe.log" "$mpiexec" -n 2 --oversubscribe \
            "$bd/bench/shardopt-bench" --backend cuda --comm-backend nccl --dp-shard 2 \
            --layers 1 --warmup 1 --steps 2
        nccl_rc=$step_rc
    fi
    bench="$bd/bench/ns_bench"
    ns_args=(--backend cuda)
    if [ "$mode" = kernels-only ]; then
        bench=$(find "$bd" -name ns_bench_cuda -type f -perm -u+x -print -quit)
        ns_args=()
    fi
    step ns 60 "$out/ns_bench.json" "$bench" "${ns_args[@]}" --reps 10 --json
    bench_rc=$step_rc
    # issue 23 on the device: Gram and AOL against standard, on GLM-4.5-Air's shapes (an expert
    # alone and as one rank's batch of 16, k/v, q/o, the router) and a square one, where Gram
    # does more work than standard; their correctness is in the gpu step's test_cuda_kernels
    step ns_gram 45 "$out/ns_gram.json" "$bench" "${ns_args[@]}" --reps 5 --json \
        --algorithm all --precondition all --shape 1x1408x4096 --shape 16x1408x4096 \
        --shape 1x1024x4096 --shape 1x4096x12288 --shape 1x128x4096 --shape 1x2048x2048
    ns_gram_rc=$step_rc
    # where the symmetric variant pays on this device (the CUDA variant table is made from
    # these): square and 1:4 shapes from m = 512 to 4096, alone and batched
    step ns_variants 60 "$out/ns_variants.json" "$bench" "${ns_args[@]}" --reps 7 --json \
        --shape 1x512x512 --shape 1x512x2048 --shape 64x512x2048 --shape 1x1024x1024 \
        --shape 1x1024x4096 --shape 16x1024x4096 --shape 1x2048x2048 --shape 1x2048x8192 \
        --shape 8x1408x4096 --shape 1x4096x16384
    # out-of-bounds and misaligned accesses in the kernels (informational: not in test_rc)
    if [ "$dry" = 1 ] || command -v compute-sanitizer >/dev/null; then
        step memcheck 60 "$out/ctest.log" compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$bd/tests/test_cuda_kernels"
    fi
fi

if [ "$dry" = 1 ]; then
    echo "device_check: dry run: the steps above share a ${budget} s budget"
    exit 77
fi
# a GPU test that skipped on a GPU machine is a finding too (device not visible, say)
skipped=$(grep -c '\*\*\*Skipped' "$out/ctest.log" 2>/dev/null || true)
cat >"$out/summary.json" <<JSON
{"mode": "$mode", "configure_rc": $configure_rc, "build_rc": $build_rc, "test_rc": $test_rc,
 "tests_skipped": ${skipped:-0}, "ns_bench_rc": $bench_rc, "ns_gram_rc": $ns_gram_rc,
 "demo_rc": $demo_rc,
 "step_bench_rc": $step_rc_main, "step_np2_rc": $np2_rc, "step_np4_rc": $np4_rc,
 "nccl_np1_rc": $nccl1_rc, "nccl_probe_rc": $nccl_rc, "budget_s": $budget,
 "kernels_rc": ${kernels_rc:--1}, "layouts_rc": ${layouts_rc:--1}, "ns_cuda_rc": ${ns_cuda_rc:--1},
 "torch_cuda_rc": ${torch_rc:--1}, "nccl_gpu_rc": ${nccl_gpu_rc:--1},
 "nccl_multi_rc": ${nccl_multi_rc:--1}, "offload_rc": ${offload_rc:--1}, "gpus": $gpus,
 "seconds": $(elapsed)}
JSON
cat "$out/summary.json"
cat "$out/steps.tsv"
# the device tool brings back at most 8 files: everything packed in one, with the two short ones
if [ -n "${SHARDOPT_GPU_RETURN:-}" ]; then
    mkdir -p "$SHARDOPT_GPU_RETURN"
    tar -czf "$SHARDOPT_GPU_RETURN/device_check.tar.gz" -C "$out" .
    cp "$out/summary.json" "$out/steps.tsv" "$SHARDOPT_GPU_RETURN/"
fi
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$step_rc_main" -le 0 ] && [ "$demo_rc" -le 0 ]
