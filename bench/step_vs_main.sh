#!/bin/bash
# Whole-step time of this build against another build (today's main), side by side: the
# binaries alternate run by run, N rounds per preset; prints one line per run
# (preset round variant seconds). Medians of those lines are what docs/performance.md reports.
#   bench/step_vs_main.sh MAIN_BUILD_DIR NEW_BUILD_DIR     (env: N=5 STEPS=5 PRESETS="...")
set -u
MAIN=$1/bench/shardopt-bench
NEW=$2/bench/shardopt-bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for preset in ${PRESETS:-glm45-air qwen3-30b-a3b}; do
  for r in $(seq "${N:-5}"); do
    for v in main std gram aol; do
      case $v in
        main) cmd="$MAIN" ;;
        std) cmd="$NEW" ;;
        gram) cmd="$NEW --set ns_algorithm=auto" ;;
        aol) cmd="$NEW --set ns_algorithm=auto --set ns_precondition=aol --set ns_coeffs=aol --set ns_steps=4" ;;
      esac
      t=$(mpiexec --oversubscribe -n 2 $cmd --preset "$preset" --threads 1 --momentum-dtype fp32 \
            --steps "${STEPS:-5}" 2>&1 | grep -m1 '^| none | fp32 |' | awk -F'|' '{print $4}' | tr -d ' s')
      echo "$preset $r $v $t"
    done
  done
done
