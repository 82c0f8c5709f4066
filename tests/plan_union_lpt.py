#!/usr/bin/env python3
"""shardopt-plan --json's LPT over the union (bench/plan_union.c) against the joint plan.

The joint plan (each expert shard group first, then the dense group on top of each rank's expert
load) is NOT always at least as good as LPT over the union of both groups' matrices
(docs/scaling.md, joint planning: measured worse on most layouts past 16 GPUs). What holds, and is
checked here on a handful of layouts:
  mean    the union's mean load equals the tool's perfect balance (t_perfect): it places the
          planner's matrices at the planner's costs, no more, no fewer;
  xs = 1  with ep = the dense group (one member per expert shard group) the joint plan's busiest
          rank equals the union's: every expert matrix has one eligible rank, every rank the same
          expert load, so both place the dense matrices by the same LPT (a load multiset does not
          depend on which of equal-load ranks takes a matrix);
  Graham  experts along rows (no member holds an expert matrix whole, so no owner is pinned), the
          joint plan's busiest rank is within (2 - 1/D) of the union's: each of its LPTs puts a
          matrix on a least-loaded eligible rank, so the busiest ends at most at mean + (1 - 1/D)
          x the largest matrix, and the union's busiest is at least each of those.
Usage: plan_union_lpt.py SHARDOPT_PLAN
"""
import json
import subprocess
import sys

plan = sys.argv[1]
fails = 0


def bad(msg):
    global fails
    print('FAIL: ' + msg)
    fails += 1


def layouts(args):
    out = subprocess.run([plan] + args + ['--json'], capture_output=True, text=True)
    if out.returncode != 0:
        bad('%s exited %d: %s' % (' '.join(args), out.returncode, out.stderr.strip()))
        return []
    return json.loads(out.stdout)['layouts']


SMALL = ['--layers', '2', '--width-div', '8']
CASES = [  # (args, ep is the dense group, experts along rows)
    (['--preset', 'glm45-air', '--world', '8', '--ep', '8'] + SMALL, True, False),
    (['--preset', 'glm45-air', '--world', '16', '--ep', '16', '--expert-shard-dim', '1'] + SMALL,
     True, True),
    (['--preset', 'qwen3-30b-a3b', '--world', '32', '--ep', '32'] + SMALL, True, False),
    (['--preset', 'tiny-experts', '--world', '2', '--ep', '2'], True, False),
    (['--preset', 'glm45-air', '--sweep', '1,4,16', '--ep', '8', '--expert-shard-dim', '1'] + SMALL,
     False, True),
    (['--preset', 'qwen3-30b-a3b', '--sweep', '2,8,32', '--ep', '4', '--expert-shard-dim', '1'] +
     SMALL, False, True),
    (['--preset', 'tiny-experts', '--sweep', '1,4', '--ep', '1', '--expert-shard-dim', '1'], False,
     True),
    (['--preset', 'glm45-air', '--sweep', '1,4,16', '--ep', '8'] + SMALL, False, False),
]
checked = worse = 0
for args, xs1, rows in CASES:
    for l in layouts(args):
        name = '%s, %d ranks' % (' '.join(args), l['world'])
        dense = l['dp_shard'] * l['cp']
        # --ns-compute device, gather, no teams: ns_flops_* count every product whole, the
        # planner's costs x the steps, as the union's fields do
        if abs(l['union_lpt_ns_mean'] / l['ns_flops_mean'] - 1) > 1e-12:
            bad('%s: the union\'s mean %.17g FLOP is not the plan\'s %.17g' %
                (name, l['union_lpt_ns_mean'], l['ns_flops_mean']))
        joint, union = l['ns_flops_max'], l['union_lpt_ns_max']
        if xs1 and abs(joint / union - 1) > 1e-12:
            bad('%s: ep = the dense group, joint busiest %.17g FLOP, union\'s %.17g' %
                (name, joint, union))
        if rows and joint > (2 - 1 / dense) * union * (1 + 1e-12):
            bad('%s: experts along rows, joint busiest %.17g FLOP over (2 - 1/%d) x the union\'s '
                '%.17g' % (name, joint, dense, union))
        worse += joint > union * (1 + 1e-12)
        checked += 1
if checked < 14:
    bad('only %d layouts planned' % checked)
if fails == 0:
    print('plan union lpt: ok (%d layouts, joint busier than the union on %d)' % (checked, worse))
sys.exit(1 if fails else 0)
