#!/usr/bin/env bash
# shardopt-plan predicts, without MPI, what the runtime does: for each layout, its optimizer
# state bytes per rank, the bytes each group moves per step (max over ranks) and the
# Newton-Schulz FLOPs per rank per step (max and mean over ranks, as the runtime counts the
# arithmetic its kernels perform: docs/design.md, "Counting Newton-Schulz FLOPs") must equal what
# step_bench measures in a real 4-rank run of the same preset (FLOPs within 1e-9 relative).
# And the bytes the busiest rank's Newton-Schulz team all-reduces send (team_bytes, ring model)
# must equal what the runtime counts at them (stats.bytes_ns_allreduce_last).
#   plan_vs_runtime.sh MPIEXEC STEP_BENCH SHARDOPT_PLAN
set -euo pipefail
mpiexec=$1 step_bench=$2 plan=$3
scale=(--preset tiny --width-div 1 --experts-div 1)
# a layout, then after '|' what only step_bench takes, after a second '|' what only the plan takes,
# after a third what the plan must plan: "teams" (a dense or expert Newton-Schulz team), "xteams"
# (an expert one), "union" (LPT over the union kept: commit's union plan, runtime/commit_union.c),
# "joint" (the joint plan kept). Every plan runs at the runtime's default cost rates (--cost-rates
# 100,25, added where a layout gives none): commit keeps the union plan or the joint one by the
# cost model at cost_gemm_gflops / cost_net_gbps, and at the machine file's rates the tool could
# keep the other one.
# Idle expert members: --ep 1 --experts-div 4 (dense owners planned around the expert work), and
# tiny-experts (2 experts outweigh the dense layers) with expert_moves at the runtime's default
# cost rates, which moves some of them; without expert_moves (ep 2) the union plan is kept, the
# whole experts sent off their holders to idle members. Newton-Schulz teams (ns_team_cap, forced
# small by ns_team_frac 0.01): each dense matrix gathered as row blocks of its long side to a team
# of 2 or 4, the plan costing their all-reduces at the runtime's default cost rates, as commit
# does; with expert_moves too, the experts planned around the dense load with its all-reduces;
# and tiny-experts' one MoE layer with its experts whole, where the union plan is kept around the
# teams (commit_union.c: the teams stay, the other matrices placed around their blocks). The
# team all-reduces carry ns_compute's dtype (bf16: half the bytes); GLM-4.5-Air at width / 8 in
# teams of 4, explicitly in bf16 and in fp32. Expert teams: tiny-experts' one MoE layer, its
# experts sharded along columns or rows (no member holds one whole) over an expert shard group of
# 4 (ep 1, columns, in fp32 and in bf16) or 2 (ep 2, rows), with expert_moves too (the teams stay,
# whole-matrix moves go around them), teams of up to 2 or 4 (the group's plan picks 2); such a
# layout must plan expert teams (expert_ns_teams). (Along rows at ep 1 the group's choice, which
# counts the exchange, keeps one owner per matrix: teams there would send more.)
# The tiny shapes run the plain variant; GLM-4.5-Air at
# width / 8 (512-wide dense matrices, 176 x 512 experts) has symmetric products in both ns_compute
# tables, and Gram and AOL change the count, so it runs under each option the count depends on;
# ns_strategy sharded and auto keep matrices out of the owners' plan (each holder counts its
# columns).
xt=(--preset tiny-experts --layers 1) # 6 expert matrices over 4 (or 2) members: teams of 2 pay
glm=(--preset glm45-air --layers 1 --width-div 8 --experts-div 8 --momentum-dtype fp32)
aol="--set ns_precondition=aol --set ns_coeffs=aol --set ns_steps=4|--ns-precondition aol"
layouts=("--ep 2" "--ep 2 --cp 2 --expert-shard-dim 1" "--dp-replicate 2 --ep 2 --expert-shard-dim 2"
         "--ep 4 --expert-shard-dim 0" "--ep 2 --momentum-dtype bf16"
         "--ep 1 --experts-div 4"
         "--preset tiny-experts --ep 1|--set expert_moves=1|--moves --cost-rates 100,25|joint"
         "--preset tiny-experts --ep 2|||union"
         "--ep 2|--set ns_team_cap=2 --set ns_team_frac=0.01|--teams 2 --team-frac 0.01 --cost-rates 100,25|teams"
         "--ep 1 --cp 2|--set ns_team_cap=4 --set ns_team_frac=0.01|--teams 4 --team-frac 0.01 --cost-rates 100,25|teams"
         "--ep 1|--set expert_moves=1 --set ns_team_cap=2 --set ns_team_frac=0.01|--moves --teams 2 --team-frac 0.01 --cost-rates 100,25|teams"
         "${xt[*]} --ep 1 --expert-shard-dim 0|--set ns_team_cap=2 --set ns_team_frac=0.01|--teams 2 --team-frac 0.01 --cost-rates 100,25|union teams"
         "${xt[*]} --ep 1 --expert-shard-dim 2|--ns-compute fp32 --set ns_team_cap=2 --set ns_team_frac=0.01|--teams 2 --team-frac 0.01 --cost-rates 100,25|xteams"
         "${xt[*]} --ep 1 --expert-shard-dim 2|--ns-compute bf16 --set ns_team_cap=2 --set ns_team_frac=0.01|--teams 2 --team-frac 0.01 --cost-rates 100,25|xteams"
         "${xt[*]} --ep 2 --expert-shard-dim 1|--set expert_moves=1 --set ns_team_cap=4 --set ns_team_frac=0.01|--moves --teams 4 --team-frac 0.01 --cost-rates 100,25|xteams"
         "${xt[*]} --ep 1 --expert-shard-dim 2|--set expert_moves=1 --set ns_team_cap=4 --set ns_team_frac=0.01|--moves --teams 4 --team-frac 0.01 --cost-rates 100,25|xteams"
         "${glm[*]} --ep 1|--ns-compute bf16 --set ns_team_cap=4 --set ns_team_frac=0.01|--teams 4 --team-frac 0.01 --cost-rates 100,25|teams"
         "${glm[*]} --ep 1|--ns-compute fp32 --set ns_team_cap=4 --set ns_team_frac=0.01|--teams 4 --team-frac 0.01 --cost-rates 100,25|teams"
         "${glm[*]} --ep 2|--ns-compute fp32|"
         "${glm[*]} --ep 2|--ns-compute bf16|"
         "${glm[*]} --ep 2 --expert-shard-dim 1|--ns-compute bf16 --set ns_algorithm=gram|--ns-algorithm gram"
         "${glm[*]} --ep 4 --expert-shard-dim 2|--ns-compute fp32 --set ns_algorithm=auto|--ns-algorithm auto"
         "${glm[*]} --ep 1|--ns-compute bf16 --set ns_algorithm=auto $aol --ns-algorithm auto"
         "${glm[*]} --ep 2|--ns-compute fp32 $aol"
         "--ep 2|--set ns_strategy=sharded|--ns-strategy sharded"
         "${glm[*]} --ep 2|--ns-compute fp32 --set ns_strategy=sharded|--ns-strategy sharded"
         "${glm[*]} --ep 1 --expert-shard-dim 2|--ns-compute bf16 --set ns_strategy=sharded --set ns_algorithm=auto|--ns-strategy sharded --ns-algorithm auto"
         "${glm[*]} --ep 2 --expert-shard-dim 2|--ns-compute bf16 --set ns_strategy=auto|--ns-strategy auto")
# shardopt-plan takes each option once: scale's options the layout gives again are left out
plan_scale() {
    local i
    for ((i = 0; i < ${#scale[@]}; i += 2)); do
        [[ " $1 " == *" ${scale[i]} "* ]] || printf '%s\n%s\n' "${scale[i]}" "${scale[i + 1]}"
    done
}
fail=0
for entry in "${layouts[@]}"; do
    IFS='|' read -r l bench_only plan_only expect <<<"$entry"
    [[ $plan_only == *--cost-rates* ]] || plan_only+=" --cost-rates 100,25"
    mapfile -t pscale < <(plan_scale "$l")
    # shellcheck disable=SC2086
    run=$("$mpiexec" -n 4 --oversubscribe "$step_bench" "${scale[@]}" --layers 0 --steps 1 \
        --warmup 0 --threads 1 $l $bench_only --json 2>/dev/null | grep '^{"preset"')
    # the kernels the run used (ns_compute auto: bf16 where this CPU multiplies bf16 natively)
    compute=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ns_compute"])' "$run")
    # shellcheck disable=SC2086
    pred=$("$plan" "${pscale[@]}" --world 4 $l --ns-compute "$compute" $plan_only --json)
    python3 - "$l $bench_only" "$run" "$pred" "$expect" <<'PY' || fail=1
import json, sys
layout, run, pred = sys.argv[1], json.loads(sys.argv[2])["results"][0], json.loads(sys.argv[3])["layouts"][0]
expect = sys.argv[4].split()
for what, ok in [("teams", pred["ns_teams"] > 0), ("xteams", pred["expert_ns_teams"] > 0),
                 ("union", pred["union_plan"] == 1), ("joint", pred["union_plan"] == 0)]:
    if what in expect and not ok:  # what the layout is there to run
        print(f"{layout}: planned without {what} (union_plan {pred['union_plan']}, "
              f"{pred['ns_teams']} teams, {pred['expert_ns_teams']} expert teams)   MISMATCH")
        sys.exit(1)
pairs = [("state bytes/rank", run["state_bytes_per_rank"], pred["state_bytes"]),
         ("momentum bytes", run["momentum_bytes"], pred["momentum_bytes"]),
         ("adam bytes", run["adam_bytes"], pred["adam_bytes"]),
         ("dense bytes/step", run["dense_bytes_per_step"], 2 * pred["dense_bytes"]),
         ("expert bytes/step", run["expert_bytes_per_step"], 2 * pred["expert_bytes"]),
         ("team bytes/step", run["ns_allreduce_bytes_per_step"], pred["team_bytes"])]
flops = [("NS FLOPs max", run["ns_flops_max"], pred["ns_flops_max"]),
         ("NS FLOPs mean", run["ns_flops_mean"], pred["ns_flops_mean"])]
ok = all(abs(a - b) < 0.5 for _, a, b in pairs) and \
    all(abs(a - b) <= 1e-9 * max(abs(a), abs(b)) for _, a, b in flops) and run["ns_flops_max"] > 0
print(f"{layout}\n    " + ", ".join(f"{n}: run {a:.0f} plan {b:.0f}" for n, a, b in pairs)
      + "\n    " + ", ".join(f"{n}: run {a:.10e} plan {b:.10e}" for n, a, b in flops)
      + ("" if ok else "   MISMATCH"))
sys.exit(0 if ok else 1)
PY
done
exit $fail
