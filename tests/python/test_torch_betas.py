"""shardopt.torch.Muon's AdamW groups under schedulers that cycle momentum, and betas / eps
edited mid-run: each step reads an AdamW group's betas and eps (step args version 4), and its
momentum key is its beta1, as torch's Adam-family optimizers take the momentum OneCycleLR and
CyclicLR cycle. Compared with torch.optim.AdamW stepped on the same gradients. One process.

    test_torch_betas.py [CASE ...]     every case when none is named

Exit 77 (skip) only where torch is not importable."""

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import batch, model, quiet, refused, relative

import shardopt
from shardopt.torch import Muon

L = torch.optim.lr_scheduler


def _pair(make_sched, steps, edit=None):
    """A Muon + AdamW optimizer on the test model and torch.optim.AdamW over copies of its AdamW
    tensors (torch's defaults, which are Muon's AdamW side's), each with the scheduler
    make_sched(opt) makes (None: none), stepped on the same gradients. edit(k, group) changes
    both AdamW groups before step k. After each step: the AdamW tensors within fp32 rounding of
    torch's, and the betas and lr the step took equal to torch's group's. Returns the betas
    seen."""
    m = model()
    opt = Muon(m.named_parameters(), lr=0.02, model=m)
    (adamw,) = [g for g in opt.param_groups if g["algo"] == "adamw"]
    ours = adamw["params"]
    copies = [nn.Parameter(p.detach().clone()) for p in ours]
    ref = torch.optim.AdamW(copies, lr=0.02, betas=adamw["betas"], eps=adamw["eps"],
                            weight_decay=adamw["weight_decay"])
    scheds = [make_sched(o) for o in (opt, ref)] if make_sched else []
    seen = []
    for k in range(steps):
        if edit is not None:
            edit(k, adamw)
            edit(k, ref.param_groups[0])
        opt.zero_grad()
        m(*batch(k)).backward()
        for p, c in zip(ours, copies):
            c.grad = p.grad.detach().clone()
        opt.step()
        ref.step()
        want = ref.param_groups[0]
        assert tuple(adamw["betas"]) == tuple(want["betas"]), (k, adamw["betas"], want["betas"])
        assert adamw["momentum"] == want["betas"][0] and adamw["lr"] == want["lr"], k
        seen.append(tuple(want["betas"]))
        for p, c in zip(ours, copies):
            err = relative(p.detach(), c.detach())
            assert err < 2e-6, (k, tuple(p.shape), err)
        for s in scheds:
            s.step()
    opt.close()
    return seen


def case_one_cycle_lr_cycles_adamw_beta1_as_for_torch_adamw():
    """OneCycleLR with its default cycle_momentum=True over Muon + AdamW groups: it writes the
    AdamW group's momentum (the defaults have no betas), which is its beta1, and the AdamW
    tensors follow torch.optim.AdamW under the same OneCycleLR (betas cycled, bias correction
    with the current beta1). Before: ValueError at the second step, momentum changed."""
    seen = _pair(lambda o: L.OneCycleLR(o, max_lr=0.02, total_steps=10), 8)
    assert len({b[0] for b in seen}) >= 6 and {b[1] for b in seen} == {0.999}, seen


def case_cyclic_lr_cycles_adamw_beta1_as_for_torch_adamw():
    """CyclicLR, cycle_momentum=True by default, likewise (base_momentum 0.8 .. 0.9)."""
    seen = _pair(lambda o: L.CyclicLR(o, 1e-3, 1e-2, step_size_up=2), 6)
    assert {round(b[0], 12) for b in seen} == {0.9, 0.85, 0.8}, seen


def case_betas_and_eps_edited_mid_run_take_effect():
    """group["betas"] and group["eps"] written by hand between steps are this step's, as in
    torch.optim.AdamW (before: refused, fixed at construction); the group's momentum follows
    betas[0]."""
    def edit(k, g):
        if k == 2:
            g["betas"] = (0.5, 0.9)
            g["eps"] = 1e-3
        if k == 4:
            g["betas"] = [0.95, 0.99]  # a list, as JSON or a script writes it
        if k == 5:
            g["eps"] = 1e-8
    seen = _pair(None, 7, edit)
    assert seen[2] == (0.5, 0.9) and seen[4] == (0.95, 0.99), seen


def case_momentum_written_by_hand_is_beta1():
    """An AdamW group's momentum written between steps (a warmup loop over every group) is its
    beta1 at that step, betas[0] written to match."""
    def edit(k, g):
        if "algo" in g and k in (1, 3):
            g["momentum"] = 0.8 if k == 1 else 0.93
        elif k in (1, 3):  # torch.optim.AdamW: the same beta1, where it reads it
            g["betas"] = (0.8 if k == 1 else 0.93, g["betas"][1])
    seen = _pair(None, 5, edit)
    assert [b[0] for b in seen] == [0.9, 0.8, 0.8, 0.93, 0.93], seen


def case_refusals_name_the_group_and_key_with_nothing_stepped():
    """Only what cannot be taken is refused, before any group steps (the Muon group ahead of
    the AdamW one is not written either): momentum and betas[0] both changed since the last
    step to different values (which beta1 is meant cannot be told); a beta out of [0, 1)
    (through betas or momentum); eps not in (0, 1] or below fp32's smallest normal; betas not a pair of numbers. Each
    ValueError names the group, the key and the value; fixing it, the next step goes on."""
    m = model()
    opt = Muon(m.named_parameters(), lr=0.02, model=m)
    adamw = opt.param_groups[1]
    assert adamw["algo"] == "adamw" and adamw["momentum"] == adamw["betas"][0] == 0.9
    m(*batch(0)).backward()
    opt.step()
    bad = [({"momentum": 0.8, "betas": (0.7, 0.999)},
            ["param group 1 (adamw): momentum changed from 0.9 to 0.8 and betas[0] to 0.7"]),
           ({"momentum": 1.0}, ["param group 1 (adamw): beta1", "= 1.0: accepted [0, 1)"]),
           ({"betas": (0.9, 1.5)}, ["beta2 (betas[1]) = 1.5: accepted [0, 1)"]),
           ({"betas": (-0.1, 0.999)}, ["beta1", "= -0.1: accepted [0, 1)"]),
           ({"betas": (float("nan"), 0.999)}, ["= nan: accepted [0, 1)"]),
           ({"eps": 0.0}, ["param group 1 (adamw): eps = 0.0: accepted (0, 1]"]),
           ({"eps": float("inf")}, ["eps = inf"]),
           # 0 in the kernels' fp32: a zero gradient stepped every weight to NaN, OK returned
           ({"eps": 1e-300}, ["eps = 1e-300: accepted (0, 1], at least 1.1754943508222875e-38"]),
           ({"betas": (0.9,)}, ["betas = (0.9,)", "a pair of numbers"])]
    for change, words in bad:
        keep = {k: adamw[k] for k in ("momentum", "betas", "eps")}
        adamw.update(change)
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        refused(opt.step, ValueError, *words, "nothing was stepped")
        assert all(torch.equal(p, before[n]) for n, p in m.named_parameters()), change
        adamw.update(keep)
    # both changed to the same value: that beta1
    adamw["momentum"], adamw["betas"] = 0.85, (0.85, 0.999)
    opt.step()
    assert adamw["betas"] == (0.85, 0.999) and adamw["momentum"] == 0.85
    opt.close()


def case_resume_mid_cycle_gives_the_uninterrupted_bits():
    """state_dict() after the scheduler wrote the next momentum (opt.step(); sched.step();
    save, as trainers do) saves it as the AdamW group's beta1 in betas too; a new optimizer
    and scheduler loaded from it go on with the uninterrupted run's bits (before: the saved
    betas were fixed and compared, and the cycled momentum was refused at the step)."""
    def run(split):
        m = model()
        opt = Muon(m.named_parameters(), lr=0.02, model=m)
        s = L.OneCycleLR(opt, max_lr=0.02, total_steps=8)
        for k in range(6):
            if k == split:
                sd, ssd = opt.state_dict(), s.state_dict()
                g = sd["param_groups"][1]
                assert g["momentum"] == g["betas"][0] == opt.param_groups[1]["betas"][0]
                opt.close()
                opt = Muon(m.named_parameters(), lr=0.02, model=m)
                s = L.OneCycleLR(opt, max_lr=0.02, total_steps=8)
                opt.load_state_dict(sd)
                s.load_state_dict(ssd)
                assert opt.param_groups[1]["betas"] == tuple(g["betas"])
            opt.zero_grad()
            m(*batch(k)).backward()
            opt.step()
            s.step()
        opt.close()
        return [p.detach().clone() for p in m.parameters()]
    whole, resumed = run(None), run(3)
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed))


def case_binding_step_takes_adamw_betas_and_eps():
    """shardopt.Optimizer.step(adamw_betas=, adamw_eps=) (the binding under Muon, through the
    C helper where it was built, else ctypes) writes the bits of a runtime configured with
    those values, and None / < 0 the config's."""
    src = nn.Linear(16, 4)
    grad = [torch.randn(4, 16), torch.randn(4)]
    outs = []
    for cfg, kw in (({"adamw_beta1": 0.5, "adamw_beta2": 0.6, "adamw_eps": 1e-3}, {}),
                    ({}, {"adamw_betas": (0.5, 0.6), "adamw_eps": 1e-3}),
                    ({"adamw_beta1": 0.5, "adamw_beta2": 0.6, "adamw_eps": 1e-3},
                     {"adamw_betas": (-1.0, -1.0), "adamw_eps": -1.0}),
                    ({}, {})):
        m = nn.Linear(16, 4)
        m.load_state_dict(src.state_dict())
        opt = quiet(shardopt.Optimizer, shardopt.torch_params(m.named_parameters()),
                    config=dict(cfg, adamw_patterns="weight,bias"))
        for k in range(3):
            for p, g in zip(m.parameters(), grad):
                p.grad = g * (k + 1)
            opt.step(0.01, **kw)
        opt.close()
        outs.append([p.detach().clone() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[2]))
    assert not all(torch.equal(a, b) for a, b in zip(outs[0], outs[3]))


if __name__ == "__main__":
    cases.run("test_torch_betas", globals())
