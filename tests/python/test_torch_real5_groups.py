"""shardopt.torch.Muon in training scripts as others write them, the seventh round (with
test_torch_real5.py), param groups and schedules: BEiT's layer-wise lr decay groups with their
own keys, AdamW groups with their own lr beside adamw_lr, an empty group, a split group's
initial_lr under a scheduler made with last_epoch, and torch's schedulers resumed mid-run. Each
script is what its author would run, the import swapped, compared with the optimizer it was
written for. One process.

    test_torch_real5_groups.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch

from test_torch_real import FP32, Fp32TorchMuon, mlp, torch_pair, worst
from test_torch_real4 import mats, saved, train
from test_torch_real5 import x_of

from shardopt.torch import Muon

torch.set_num_threads(1)


# ---- layer-wise lr decay, group keys of the script's own -----------------------------------

def llrd_groups(model, lr, decay):
    """BEiT / ELECTRA fine-tuning's layer-wise lr decay: a group per layer and kind, with the
    script's own keys (its name, layer_id, lr_scale), which its schedule reads back."""
    layers = [model[0], model[2]]
    groups = []
    for i, layer in enumerate(layers):
        scale = decay ** (len(layers) - 1 - i)
        for kind, ps in (("w", [layer.weight]), ("b", [layer.bias])):
            groups.append({"params": ps, "name": f"layer{i}.{kind}", "layer_id": i,
                           "lr_scale": scale, "lr": lr * scale,
                           "weight_decay": 0.0 if kind == "b" else 0.1})
    return groups


def case_layerwise_lr_decay_groups_keep_their_keys():
    """BEiT's fine-tuning loop sets each group's lr from its own lr_scale at every step
    (`g["lr"] = lr * g["lr_scale"]`) and its logger prints g["name"]. The groups hold one
    algorithm each, so they are kept as given, every key of the script's with them, through
    torch.save / torch.load(weights_only=True) and load_state_dict into a new optimizer; the
    run is torch.optim.Muon's + AdamW's with the same groups (fp32 Newton-Schulz) within 1e-6,
    and the resumed one continues with the same bits."""
    def sched(opt, k):
        for g in opt.param_groups:
            g["lr"] = 0.02 * (1 - k / 10) * g["lr_scale"]

    a, b, c = mlp(), mlp(), mlp()
    with Fp32TorchMuon():
        ga = llrd_groups(a, 0.02, 0.5)
        so = Muon(ga, lr=0.02, adamw_betas=(0.9, 0.999), config=FP32, model=a)
        assert [g["name"] for g in so.param_groups] == [g["name"] for g in ga]
        gb = llrd_groups(b, 0.02, 0.5)
        tm = torch.optim.Muon([g for g in gb if g["name"].endswith(".w")], lr=0.02)
        ta = torch.optim.AdamW([g for g in gb if g["name"].endswith(".b")], lr=0.02,
                               weight_decay=0.0)
        for k in range(4):
            for net, opts in ((a, [so]), (b, [tm, ta])):
                for o in opts:
                    sched(o, k)
                    o.zero_grad()
                net(x_of(k)).square().mean().backward()
                for o in opts:
                    o.step()
        w = worst(a, b)
        assert w < 1e-6, w
        sd = saved(so.state_dict())
        assert [(g["name"], g["layer_id"], g["lr_scale"]) for g in sd["param_groups"]] == \
            [(g["name"], g["layer_id"], g["lr_scale"]) for g in ga]
        c.load_state_dict(a.state_dict())
        again = Muon(llrd_groups(c, 1.0, 1.0), lr=0.02, adamw_betas=(0.9, 0.999),
                     config=FP32, model=c)
        again.load_state_dict(sd)
        assert [g["lr_scale"] for g in again.param_groups] == [g["lr_scale"] for g in ga]
        for k in range(4, 6):
            for net, o in ((a, so), (c, again)):
                sched(o, k)
                o.zero_grad()
                net(x_of(k)).square().mean().backward()
                o.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    print(f"  layer-wise lr decay: {w:.1e} from torch.optim.Muon + AdamW after 4 steps")
    for o in (so, again):
        o.close()


# ---- a group's own lr ---------------------------------------------------------------------------

def case_adamw_group_lr_beats_adamw_lr_keyword():
    """modded-nanogpt's groups written for this class: the hidden matrices to Muon, the
    embedding and the head each an AdamW group with its own lr, the scalars an AdamW group
    without one, and adamw_lr= the default for that last group, as a group's key beats the
    constructor's in torch.optim. Before, every AdamW group stepped at adamw_lr (the
    embedding's 0.3 as 3e-4), silently; now each group's own lr, and the run is
    torch.optim.Muon's + torch.optim.AdamW's with the same groups (fp32 Newton-Schulz) within
    1e-5 (1.8e-6 measured: an lr of 0.3 on the AdamW side)."""
    def groups(m, for_torch=False):
        hidden, emb, head, scal = [m[0].weight], [m[2].weight], [m[0].bias], [m[2].bias]
        muon = [{"params": hidden, "algo": "muon"}]
        adam = [{"params": emb, "algo": "adamw", "lr": 0.3},
                {"params": head, "algo": "adamw", "lr": 0.008},
                {"params": scal, "algo": "adamw"}]
        if for_torch:
            return [{k: v for k, v in g.items() if k != "algo"} for g in muon + adam]
        return muon + adam

    a, b = mlp(), mlp()
    with Fp32TorchMuon():
        so = Muon(groups(a), lr=0.05, adamw_lr=3e-4, adamw_weight_decay=0.0, config=FP32)
        assert [g["lr"] for g in so.param_groups] == [0.05, 0.3, 0.008, 3e-4]
        tg = groups(b, True)
        tm = torch.optim.Muon(tg[:1], lr=0.05)
        ta = torch.optim.AdamW(tg[1:], lr=3e-4, weight_decay=0.0)
        for k in range(3):
            for net, opts in ((a, [so]), (b, [tm, ta])):
                for o in opts:
                    o.zero_grad()
                net(x_of(k)).square().mean().backward()
                for o in opts:
                    o.step()
    w = worst(a, b)
    print(f"  AdamW groups' own lr: {w:.1e} from torch.optim.Muon + AdamW after 3 steps")
    assert w < 1e-5, w
    so.close()


def case_empty_group_kept_as_torch_keeps_it():
    """HF's create_optimizer over a model without biases or norms (a matrices-only MLP): its
    no-decay group is empty, and torch.optim keeps it, so the script's list per group
    (LambdaLR(opt, [decay_f, no_decay_f])) has one entry per param_groups entry. Before, the
    empty group was dropped: LambdaLR raised 'Expected 1 lr_lambdas, but got 2', and a
    zip(opt.param_groups, per_group) paired silently with the wrong entries. Now it is kept
    (a group of no tensor, the defaults' algorithm), the run is torch.optim.Muon's with the
    same groups and schedule (fp32 Newton-Schulz) within 1e-6, the group list reversed in
    place goes on, and the state dict round-trips, as does one saved when the empty group was
    dropped (loaded with the empty group's own keys)."""
    a, b = mats(), mats()
    fs = [lambda k: 0.9 ** k, lambda k: 1.0]
    with Fp32TorchMuon():
        so = Muon([{"params": list(a.named_parameters()), "weight_decay": 0.1},
                   {"params": [], "weight_decay": 0.0}], lr=0.02, config=FP32)
        assert len(so.param_groups) == 2 and so.param_groups[1]["params"] == []
        tm = torch.optim.Muon([{"params": list(b.parameters()), "weight_decay": 0.1},
                               {"params": [], "weight_decay": 0.0}], lr=0.02)
        scheds = [torch.optim.lr_scheduler.LambdaLR(o, fs) for o in (so, tm)]
        for k in range(3):
            if k == 2:  # a script reorders the groups in place: each keeps its runtime
                so.param_groups.reverse()
                tm.param_groups.reverse()
            for net, o, s in ((a, so, scheds[0]), (b, tm, scheds[1])):
                o.zero_grad()
                net(x_of(k)).square().mean().backward()
                o.step()
                s.step()
    w = worst(a, b)
    assert w < 1e-6, w
    sd = saved(so.state_dict())
    assert [len(g["params"]) for g in sd["param_groups"]] == [0, 2]
    c = mats()
    c.load_state_dict(a.state_dict())
    again = Muon([{"params": [], "weight_decay": 0.0},
                  {"params": list(c.named_parameters()), "weight_decay": 0.1}], lr=0.02,
                 config=FP32)
    again.load_state_dict(sd)
    # a state dict saved before empty groups were kept (the empty one dropped) loads too
    d = mats()
    d.load_state_dict(a.state_dict())
    old = Muon([{"params": list(d.named_parameters()), "weight_decay": 0.1},
                {"params": [], "weight_decay": 0.0}], lr=0.02, config=FP32)
    old.load_state_dict(dict(sd, param_groups=sd["param_groups"][1:]))
    assert [g["weight_decay"] for g in old.param_groups] == [0.1, 0.0]
    train(a, so, 1, 3)
    train(c, again, 1, 3)
    train(d, old, 1, 3)
    assert all(torch.equal(p, q) and torch.equal(p, r)
               for p, q, r in zip(a.parameters(), c.parameters(), d.parameters()))
    for o in (so, again, old):
        o.close()


def case_initial_lr_of_a_split_group():
    """A resumed run builds its scheduler with last_epoch=N, which reads each group's
    initial_lr (torch raises KeyError without it), so the script puts "initial_lr" in the group
    it gives, as torch's forum answer says: {"params": model.named_parameters(), "lr": 0.02,
    "initial_lr": 0.02} with adamw_lr=1e-3. The group is split; its AdamW part's lr is 1e-3,
    but it kept initial_lr 0.02, so LambdaLR(opt, f, last_epoch=5) set the AdamW tensors' lr to
    0.02 f(5), 20 times the schedule's, silently. Now the AdamW part's initial_lr is its lr at
    the same point of the schedule (initial_lr times its lr over the group's): the lrs are those
    of torch.optim.Muon + AdamW given their own initial_lr, at every step."""
    a, b = mlp(), mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the group is split: said so
        so = Muon([{"params": list(a.named_parameters()), "lr": 0.02, "initial_lr": 0.04}],
                  lr=0.02, adamw_lr=1e-3)
    tm = torch.optim.Muon([{"params": [p for p in b.parameters() if p.ndim == 2],
                            "initial_lr": 0.04}], lr=0.02)
    ta = torch.optim.AdamW([{"params": [p for p in b.parameters() if p.ndim < 2],
                             "initial_lr": 2e-3}], lr=1e-3)
    assert [g["initial_lr"] for g in so.param_groups] == [0.04, 2e-3]
    f = lambda k: 0.95 ** k  # noqa: E731
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, f, last_epoch=5) for o in (so, tm, ta)]
    for k in range(3):
        want = [tm.param_groups[0]["lr"], ta.param_groups[0]["lr"]]
        got = [g["lr"] for g in so.param_groups]
        assert all(abs(x - y) <= 1e-15 for x, y in zip(got, want)), (k, got, want)
        for net, opts in ((a, [so]), (b, [tm, ta])):
            for o in opts:
                o.zero_grad()
            net(x_of(k)).square().mean().backward()
            for o in opts:
                o.step()
        for s in scheds:
            s.step()
    so.close()


# ---- schedulers resumed mid-run ------------------------------------------------------------------

SCHEDULERS = {
    "CosineAnnealingWarmRestarts": lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        o, T_0=3, T_mult=2, eta_min=1e-4),
    "PolynomialLR": lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=8, power=2.0),
    "MultiStepLR": lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 5], gamma=0.3),
    "SequentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=3),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5)], milestones=[3]),
    "ChainedScheduler": lambda o: torch.optim.lr_scheduler.ChainedScheduler([
        torch.optim.lr_scheduler.ConstantLR(o, factor=0.5, total_iters=2),
        torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)]),
    "LambdaLR per group": lambda o: torch.optim.lr_scheduler.LambdaLR(
        o, [lambda k: 0.9 ** k, lambda k: 1.0 / (k + 1)]),
}


def case_schedulers_resumed_mid_run():
    """torch's schedulers over the Muon group and the AdamW group (as torch.optim.Muon and
    AdamW would hold them: one group each), the run checkpointed after 4 steps (optimizer and
    scheduler state dicts through torch.save / torch.load) and resumed in new objects: each
    group's lr at every step is the one torch's schedule gives torch.optim.Muon + AdamW, and
    the resumed run has the same weights, bit for bit, as the uninterrupted one."""
    for name, make in SCHEDULERS.items():
        a, b, c = mlp(), mlp(), mlp()
        so = Muon(a.named_parameters(), lr=0.02, adamw_lr=1e-3)
        assert [g["algo"] for g in so.param_groups] == ["muon", "adamw"]
        ts = torch_pair(b)
        sa, st = make(so), [make(t) for t in ts] if name != "LambdaLR per group" else None
        if st is None:  # one lambda per torch optimizer's single group
            st = [torch.optim.lr_scheduler.LambdaLR(ts[0], lambda k: 0.9 ** k),
                  torch.optim.lr_scheduler.LambdaLR(ts[1], lambda k: 1.0 / (k + 1))]
        for k in range(8):
            if k == 4:
                osd, ssd = saved(so.state_dict()), saved(sa.state_dict())
                c.load_state_dict(a.state_dict())
                so2 = Muon(c.named_parameters(), lr=0.02, adamw_lr=1e-3)
                sa2 = make(so2)
                so2.load_state_dict(osd)
                sa2.load_state_dict(ssd)
            want = [t.param_groups[0]["lr"] for t in ts]
            got = [g["lr"] for g in so.param_groups]
            assert all(abs(x - y) <= 1e-12 * max(abs(y), 1e-30) for x, y in zip(got, want)), \
                (name, k, got, want)
            runs = [(a, [so], [sa]), (b, ts, st)] + ([(c, [so2], [sa2])] if k >= 4 else [])
            for net, opts, scheds in runs:
                for o in opts:
                    o.zero_grad()
                net(x_of(k)).square().mean().backward()
                for o in opts:
                    o.step()
                for s in scheds:
                    s.step()
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters())), name
        assert [g["lr"] for g in so.param_groups] == [g["lr"] for g in so2.param_groups], name
        for o in (so, so2):
            o.close()



if __name__ == "__main__":
    cases.run("test_torch_real5_groups", dict(globals()))
