#!/usr/bin/env python3
"""shardopt-plan --json's LPT over the union (bench/plan_union.c) against the joint plan.

The joint plan (each expert shard group first, then the dense group on top of each rank's expert
load) is NOT always at least as good as LPT over the union of both groups' matrices
(docs/scaling.md, joint planning: measured worse on most layouts past 16 GPUs). What holds of the
prediction (the joint plan, or the union plan where it is kept), checked on a handful of layouts:
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
And what the union plan makes provable (bench/plan_model_union.c, runtime/commit_union.c): commit
keeps LPT over the union (U) wherever its model finish, max over ranks of max(work, element cost x
exchange elements), is earlier than the joint plan's, so on every layout
  kept    the kept plan's finish is at most U's (to rounding), and U is kept exactly when it is
          earlier by more than 1e-12 relative;
  step    the kept plan's predicted step is at most the joint plan's (joint_step; equal to it
          where J is kept): the rule's exchange is the step's t_comm, the busiest dense sender's
          elements plus the busiest expert sender's, at the element cost of the machine's rates
          (with each rank's own sum of both, U was kept on 10 documented Qwen3-30B-A3B layouts
          along rows with a step up to 4.5 % later);
  U       where U is kept, the prediction is U's: nothing moved, and without teams its busiest
          rank's NS FLOPs are the union baseline's (bench/plan_union.c, computed apart from the
          prediction); with teams (GLM-4.5-Air along rows, --teams node, 1,024 and 4,096 GPUs) U
          keeps the joint plan's teams (commit_union.c) and must be kept at 4,096 with them.
These run on the documented layouts (docs/scaling.md: GLM-4.5-Air, Qwen3-30B-A3B, tiny-experts,
ep 1 to 32, experts whole and along rows) from 16 to 4,096 GPUs (--all: to 16,384, the 140 the
docs count, about a minute), with the count of layouts where U is kept and where t_ns is the
union's (t_ns_over_union_lpt <= 1.000001).
Usage: plan_union_lpt.py SHARDOPT_PLAN [--all]
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
DOC = []  # the documented layouts, one sweep per preset, ep and expert shard dim
for preset in ['glm45-air', 'qwen3-30b-a3b', 'tiny-experts']:
    for ep in [1, 2, 4, 8, 32] if preset != 'tiny-experts' else [1, 2]:  # its 2 experts
        for xd in ['0', '1']:
            nodes = [n for n in [2, 8, 32, 128, 512] + [2048] * ('--all' in sys.argv)
                     if n * 8 >= 2 * ep]  # ep 32 needs a dense group of 64
            DOC.append(['--preset', preset, '--ep', str(ep), '--expert-shard-dim', xd, '--sweep',
                        ','.join(map(str, nodes))])
kept = at_union = ndoc = union_teams = 0
TEAMS = ['--preset', 'glm45-air', '--ep', '8', '--expert-shard-dim', '1', '--teams', 'node',
         '--sweep', '128,512']
for args in [c[0] for c in CASES] + DOC + [TEAMS]:
    for l in layouts(args):
        name = '%s, %d ranks' % (' '.join(args), l['world'])
        j, u, k = l['joint_finish'], l['union_finish'], l['union_plan']
        if k != (u < j * (1 - 1e-12)):
            bad('%s: union_plan %d with joint finish %.17g, union finish %.17g' % (name, k, j, u))
        if (u if k else j) > u * (1 + 1e-12):
            bad('%s: the kept plan finishes at %.17g, after the union\'s %.17g' %
                (name, u if k else j, u))
        # both steps printed alike (%.6e, rounding is monotone): no tolerance needed
        if l['step'] > l['joint_step'] or (not k and l['step'] != l['joint_step']):
            bad('%s: union_plan %d, step %.6e s against the joint plan\'s %.6e s' %
                (name, k, l['step'], l['joint_step']))
        # U's work is part of its finish: its busiest rank at least the baseline's (cost units;
        # without teams: with them U keeps the joint plan's, the baseline has none)
        if l['ns_teams'] == 0 and l['union_lpt_ns_max'] / 5 > u * (1 + 1e-12):
            bad('%s: union finish %.17g below its busiest rank %.17g' %
                (name, u, l['union_lpt_ns_max'] / 5))
        union_teams += k and l['ns_teams'] > 0
        if k and ((l['ns_teams'] == 0 and
                   abs(l['ns_flops_max'] / l['union_lpt_ns_max'] - 1) > 1e-12) or
                  l['experts_moved']):
            bad('%s: U kept but the prediction is not U\'s (busiest %.17g FLOP, union %.17g, '
                '%d teams, %d moved)' % (name, l['ns_flops_max'], l['union_lpt_ns_max'],
                                         l['ns_teams'], l['experts_moved']))
        if args in DOC:
            ndoc += 1
            kept += k
            at_union += l['t_ns_over_union_lpt'] <= 1.000001
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
if union_teams == 0:
    bad('no layout kept the union plan with teams (%s)' % ' '.join(TEAMS))
if ndoc < (140 if '--all' in sys.argv else 110):
    bad('only %d documented layouts planned' % ndoc)
if fails == 0:
    print('plan union lpt: ok (%d layouts, joint busier than the union on %d; documented: %d, '
          'union plan kept on %d, t_ns at the union\'s on %d)' % (checked, worse, ndoc, kept,
                                                                  at_union))
sys.exit(1 if fails else 0)
