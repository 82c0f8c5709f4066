"""Training scripts written for other Muon implementations, ported to shardopt.torch.Muon by
changing the import (docs/python.md, "Ported from other Muon implementations"): Moonlight's
Muon(lr=, wd=, muon_params=, adamw_params=), dion's Muon as prime-rl builds it (groups with
"algorithm", adjust_lr=, distributed_mesh=), Keller Jordan's MuonWithAuxAdam groups leaning on
its defaults; and driving patterns the other suites do not cover (a tensor lr under a
per-group scheduler, SWALR, weight decay edited each step, state-dict hooks, a generator of
named parameters, a resume in a new process through torch.load(weights_only=True)). Each run
is compared step by step with the original's arithmetic, written out below in fp32 (the
library with fp32 Newton-Schulz), or with torch.optim.AdamW. One process.

    test_torch_ports.py [CASE ...]     every case when none is named

Exit 77 (skip) only where torch is not importable."""
import os
import subprocess
import sys
import tempfile
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import batch, model, refused, relative

from shardopt.torch import Muon

torch.set_num_threads(1)
L = torch.optim.lr_scheduler
FP32 = {"ns_compute": "fp32", "comm_dtype": "fp32"}  # the library's Newton-Schulz in fp32
JORDAN = [(3.4445, -4.775, 2.0315)] * 5
QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def orthogonalize(u, coeffs, eps):
    """X / (||X|| + eps), then the quintic steps, in fp32 (the originals run it in bf16)."""
    x = u.float()
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    x = x / (x.norm() + eps)
    for a, b, c in coeffs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class RefMuon:
    """One Muon tensor as the ported project steps it: M = mu M + g (Moonlight, dion) or its
    (1 - mu) multiple, lerp (Keller), Nesterov or not, lr scaled by shape, decoupled decay with
    the unscaled lr."""

    def __init__(self, w, mu, nesterov, coeffs, eps, scale, lerp=False):
        self.w, self.m = w.detach().clone(), torch.zeros_like(w)
        self.mu, self.nesterov, self.coeffs, self.eps = mu, nesterov, coeffs, eps
        self.scale, self.lerp = scale(*w.shape), lerp

    def step(self, g, lr, wd):
        mu = self.mu
        if self.lerp:
            self.m.lerp_(g, 1 - mu)
            u = g.lerp(self.m, mu) if self.nesterov else self.m
        else:
            self.m = mu * self.m + g
            u = g + mu * self.m if self.nesterov else self.m
        o = orthogonalize(u, self.coeffs, self.eps)
        self.w = self.w * (1 - lr * wd) - lr * self.scale * o


class MoonlightAdamW:
    """Moonlight's AdamW backup: eps added to sqrt(v) before the bias correction."""

    def __init__(self, w, betas, eps):
        self.w, self.m, self.v = w.detach().clone(), torch.zeros_like(w), torch.zeros_like(w)
        self.betas, self.eps, self.t = betas, eps, 0

    def step(self, g, lr, wd):
        b1, b2 = self.betas
        self.t += 1
        self.m.lerp_(g, 1 - b1)
        self.v.lerp_(g.square(), 1 - b2)
        u = self.m / (self.eps + self.v.sqrt())
        scale = (1 - b1 ** self.t) / (1 - b2 ** self.t) ** 0.5
        self.w = self.w * (1 - lr * wd) - lr / scale * u


def rms_scale(a, b):
    return 0.2 * max(a, b) ** 0.5


def against(m, opt, refs, steps, lr_wd, sched=None, tol=1e-5):
    """Steps m with opt and each (tensor, reference) pair of refs on m's gradients; after every
    step each tensor within tol (relative) of its reference. lr_wd(tensor) -> the (lr, wd) the
    original would use now. Returns the worst difference seen."""
    worst = 0.0
    for k in range(steps):
        worst = max(worst, against_one(m, opt, refs, k, lr_wd, tol))
        if sched is not None:
            sched.step()
    return worst


def against_one(m, opt, refs, k, lr_wd, tol=1e-5):
    """One step of against() at step k (batch k)."""
    opt.zero_grad()
    m(*batch(k)).backward()
    grads = [(p, r, p.grad.detach().clone(), *lr_wd(p)) for p, r in refs]
    opt.step()
    worst = 0.0
    for p, r, g, lr, wd in grads:
        r.step(g, lr, wd)
        err = relative(p.detach(), r.w)
        worst = max(worst, err)
        assert err < tol, (k, tuple(p.shape), err)
    return worst


def moonlight_get_optimizer(m, lr, wd, opt_class):
    """Moonlight's get_optimizer (examples/toy_train.py), its names for this model's: the
    embeddings (wte, wpe; the head is tied to wte) and every tensor under 2 dims to AdamW."""
    def muon_ok(n, p):
        return p.ndim >= 2 and "wte" not in n and "wpe" not in n
    muon_params = [p for n, p in m.named_parameters() if muon_ok(n, p)]
    adamw_params = [p for n, p in m.named_parameters() if not muon_ok(n, p)]
    return opt_class(lr=lr, wd=wd, muon_params=muon_params, adamw_params=adamw_params)


def case_moonlight_port():
    """Moonlight's toy_train: Muon(lr=, wd=, muon_params=, adamw_params=) under a warmup-cosine
    LambdaLR, with its defaults for the rest (momentum 0.95, Nesterov, 5 Jordan steps, the
    0.2 sqrt(max(A, B)) lr scale, AdamW betas (0.9, 0.95) at the same lr and wd). Every tensor
    within 1e-5 of Moonlight's arithmetic after each of 4 steps (its AdamW eps added before the
    bias correction, here after it: the difference is within that bound at eps 1e-8)."""
    m = model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the lists fix each tensor's algorithm: no warning
        opt = moonlight_get_optimizer(m, 2e-3, 0.1, lambda **kw: Muon(**kw, config=FP32))
    algos = {n: opt.algo(p) for n, p in m.named_parameters()}
    assert algos["transformer.wte.weight"] == "adamw" and algos["transformer.h.0.1.weight"] \
        == "muon", algos
    groups = [(g["algo"], g["lr"], g["weight_decay"], g.get("betas"), g["eps"])
              for g in opt.param_groups]
    assert groups == [("muon", 2e-3, 0.1, None, 1e-7), ("adamw", 2e-3, 0.1, (0.9, 0.95), 1e-8)], \
        groups
    sched = L.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2))
    refs = []
    for g in opt.param_groups:
        for p in g["params"]:
            refs.append((p, RefMuon(p, 0.95, True, JORDAN, 1e-7, rms_scale)
                         if g["algo"] == "muon" else MoonlightAdamW(p, (0.9, 0.95), 1e-8)))
    lr_now = {id(p): g for g in opt.param_groups for p in g["params"]}
    worst = against(m, opt, refs, 4, lambda p: (lr_now[id(p)]["lr"], 0.1), sched)
    print(f"  Moonlight port: {worst:.2e} from Moonlight's arithmetic (fp32)")
    refused(lambda: Muon(lr=0.01, wd=0.1, weight_decay=0.1, muon_params=[]), ValueError,
            "weight_decay and wd both given")
    refused(lambda: Muon(m.parameters(), muon_params=list(m.parameters())), ValueError,
            "params and muon_params")
    refused(lambda: Muon(m.parameters(), wd=0.1, mu=0.9), ValueError, "wd", "mu", "port from one")
    refused(lambda: Muon(m.parameters(), bogus=1), TypeError, "'bogus'", "muon_params", "mu")
    opt.close()


def init_one_rank_group():
    """A gloo process group of this process alone (prime-rl hands dion a DeviceMesh)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (1,))


def prime_rl_setup_optimizer(m, lr, weight_decay, device_mesh, opt_class):
    """prime-rl's setup_optimizer, "muon" case: dion's Muon over two groups by name."""
    def muon_enabled(n, p):
        return p.ndim >= 2 and "wte" not in n and "wpe" not in n  # lm_head is tied to wte
    muon_params = [p for n, p in m.named_parameters() if p.requires_grad and muon_enabled(n, p)]
    adamw_params = [p for n, p in m.named_parameters()
                    if p.requires_grad and not muon_enabled(n, p)]
    return opt_class(
        [dict(params=muon_params, algorithm="muon", lr=lr, weight_decay=weight_decay,
              adjust_lr="rms_norm"),
         dict(params=adamw_params, algorithm="adamw", lr=lr, weight_decay=weight_decay)],
        lr=lr, weight_decay=weight_decay, adjust_lr="rms_norm", distributed_mesh=device_mesh)


def case_dion_port_as_prime_rl_builds_it():
    """prime-rl's dion Muon: groups with algorithm "muon" / "adamw", adjust_lr="rms_norm",
    distributed_mesh (a 1-rank DeviceMesh here, comm None), dion's defaults for the rest (mu
    0.95, no Nesterov, its quintic table, epsilon 1e-8 on both sides, betas (0.9, 0.95)).
    Muon tensors within 1e-5 of dion's arithmetic in fp32, AdamW ones of torch.optim.AdamW
    (dion's AdamW is torch's), 4 steps. Refused by name: algorithm "lion", a custom
    newton_schulz_func, a 2-D mesh, adjust_lr outside dion's three, mu given with momentum."""
    mesh = init_one_rank_group()
    m = model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = prime_rl_setup_optimizer(m, 3e-3, 0.05, mesh,
                                       lambda ps, **kw: Muon(ps, **kw, config=FP32))
    keys = [(g["algo"], g["lr"], g["weight_decay"], g["eps"], g.get("betas"))
            for g in opt.param_groups]
    assert keys == [("muon", 3e-3, 0.05, 1e-8, None), ("adamw", 3e-3, 0.05, 1e-8, (0.9, 0.95))], \
        keys
    assert opt.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    muon_group, adamw_group = opt.param_groups
    assert muon_group["momentum"] == 0.95 and muon_group["nesterov"] is False
    refs = [(p, RefMuon(p, 0.95, False, QUINTIC, 1e-8, rms_scale)) for p in muon_group["params"]]
    refs += [(p, _TorchAdamW(nn.Parameter(p.detach().clone()), 3e-3, (0.9, 0.95), 1e-8, 0.05))
             for p in adamw_group["params"]]
    worst = against(m, opt, refs, 4, lambda p: (3e-3, 0.05))
    print(f"  dion port (prime-rl): {worst:.2e} from dion's arithmetic (fp32)")
    opt.close()
    ps = list(m.parameters())
    refused(lambda: Muon([dict(params=ps, algorithm="lion")]), ValueError,
            "algorithm = 'lion'", "'muon' or 'adamw'")
    refused(lambda: Muon(ps, newton_schulz_func=lambda x, epsilon: x), ValueError,
            "newton_schulz_func")
    refused(lambda: Muon(ps, adjust_lr="spectral"), ValueError, "adjust_lr = 'spectral'",
            "'rms_norm'")
    refused(lambda: Muon(ps, mu=0.9, momentum=0.9), ValueError, "momentum and mu both given")
    refused(lambda: Muon(ps, distributed_mesh=object()), TypeError, "distributed_mesh",
            "DeviceMesh")
    from torch.distributed.device_mesh import init_device_mesh
    refused(lambda: Muon(ps, distributed_mesh=init_device_mesh("cpu", (1, 1))), ValueError,
            "distributed_mesh", "2-D DeviceMesh")
    # flatten against how the library steps a tensor of 3 or more dims: a convolution kernel is
    # one [out, in kh kw] matrix (dion's flatten=True), an expert stack E matrices (False)
    conv = nn.Parameter(torch.randn(8, 3, 3, 3))
    refused(lambda: Muon([dict(params=[("conv", conv)], algorithm="muon")]), ValueError,
            "conv", "shape [8, 3, 3, 3]", "one [out, in...] matrix", "flatten = False")
    Muon([dict(params=[("conv", conv)], algorithm="muon")], flatten=True).close()
    stack = nn.Parameter(torch.randn(4, 8, 6))
    refused(lambda: Muon([dict(params=[("experts.w", stack)], algorithm="muon")], flatten=True,
                         expert=lambda n: n.startswith("experts")), ValueError,
            "experts.w", "a stack of matrices", "flatten = True")
    Muon([dict(params=[("experts.w", stack)], algorithm="muon")],
         expert=lambda n: n.startswith("experts")).close()
    # dion's keywords without groups: adjust_lr=None is a factor of 1, epsilon both sides'
    w = nn.Parameter(torch.randn(12, 20) * 0.1)
    o = Muon([("w", w)], lr=0.02, mu=0.9, epsilon=1e-6, adjust_lr=None, config=FP32)
    g = o.param_groups[0]
    assert (g["momentum"], g["eps"], g["adjust_lr_fn"], g["nesterov"]) == (0.9, 1e-6, "none",
                                                                            False), g
    r = RefMuon(w, 0.9, False, QUINTIC, 1e-6, lambda a, b: 1.0)
    for k in range(2):
        w.grad = torch.randn(12, 20, generator=torch.Generator().manual_seed(k))
        o.step()
        r.step(w.grad, 0.02, 0.01)
        assert relative(w.detach(), r.w) < 1e-5, (k, relative(w.detach(), r.w))
    o.close()


def case_muon_with_aux_adam_defaults():
    """Keller Jordan's README example of MuonWithAuxAdam, ported: its Adam groups give lr,
    betas and eps but no weight_decay, the Muon group no weight_decay either, relying on its
    class's defaults (weight decay 0; an Adam group's betas (0.9, 0.95), eps 1e-10). Those are
    the ported run's: every tensor within 1e-5 of MuonWithAuxAdam's arithmetic in fp32 after 3
    steps. Before, the keys left out took torch's defaults (Muon weight decay 0.1, AdamW 0.01):
    a decay the script never asked for. A keyword given to the constructor still sets them."""
    m = model()
    t = m.transformer
    hidden = [p for n, p in t.h.named_parameters() if p.ndim >= 2]
    embed = [t.wte.weight, t.wpe.weight]
    scalar = [p for p in m.parameters() if p.ndim < 2]
    adam_groups = [dict(params=embed, lr=0.01), dict(params=scalar, lr=0.004)]
    adam_groups = [dict(**g, betas=(0.8, 0.95), eps=1e-10, use_muon=False) for g in adam_groups]
    muon_group = dict(params=hidden, lr=0.02, momentum=0.95, use_muon=True)
    opt = Muon([*adam_groups, muon_group], config=FP32)
    wds = [(g["algo"], g["weight_decay"]) for g in opt.param_groups]
    assert wds == [("adamw", 0.0), ("adamw", 0.0), ("muon", 0.0)], wds
    refs, lrs = [], {}
    for g in opt.param_groups:
        for p in g["params"]:
            lrs[id(p)] = g["lr"]
            if g["algo"] == "muon":
                refs.append((p, RefMuon(p, 0.95, True, JORDAN, 1e-7,
                                        lambda a, b: max(1, a / b) ** 0.5, lerp=True)))
            else:
                c = nn.Parameter(p.detach().clone())
                refs.append((p, _TorchAdamW(c, g["lr"], (0.8, 0.95), 1e-10, 0.0)))
    worst = against(m, opt, refs, 3, lambda p: (lrs[id(p)], 0.0))
    print(f"  MuonWithAuxAdam port: {worst:.2e} from its arithmetic (fp32)")
    opt.close()
    o = Muon([dict(params=[nn.Parameter(torch.zeros(4, 4))], use_muon=True)], weight_decay=0.2)
    assert (o.param_groups[0]["weight_decay"], o.param_groups[0]["lr"]) == (0.2, 0.02)
    o.close()
    o = Muon([dict(params=[nn.Parameter(torch.zeros(4))], use_muon=False)])
    g = o.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (3e-4, (0.9, 0.95), 1e-10,
                                                                  0.0), g
    o.close()


class _TorchAdamW:
    """One tensor stepped by its own torch.optim.AdamW (the reference interface of against)."""

    def __init__(self, c, lr, betas, eps, wd):
        self.c = c
        self.opt = torch.optim.AdamW([c], lr=lr, betas=betas, eps=eps, weight_decay=wd)

    @property
    def w(self):
        return self.c.detach()

    def step(self, g, lr, wd):
        self.c.grad = g
        for grp in self.opt.param_groups:
            grp["lr"], grp["weight_decay"] = lr, wd
        self.opt.step()


def case_add_param_group_in_ported_spelling():
    """add_param_group with the group spelling the script's constructor call used: a dion group
    ("algorithm", "epsilon", "beta1" / "beta2", "mu") and a MuonWithAuxAdam group ("use_muon",
    its defaults for the keys left out) are taken as the constructor takes them. Before, only
    the constructor translated them: add_param_group kept "algorithm" and "epsilon" as unread
    keys, so the 2-D tensor went to Muon by its dims and the eps, betas and mu given were not
    used, silently."""
    m = model()
    w = nn.Parameter(torch.randn(12, 8) * 0.1)
    v = nn.Parameter(torch.randn(12, 8) * 0.1)
    u = nn.Parameter(torch.randn(16, 8) * 0.1)
    opt = Muon([dict(params=[p for p in m.parameters() if p.ndim < 2], algorithm="adamw")],
               lr=0.01)
    opt.add_param_group(dict(params=[("extra.w", w)], algorithm="adamw", epsilon=1e-10,
                             beta1=0.8, beta2=0.9))
    opt.add_param_group(dict(params=[("extra.u", u)], algorithm="muon", mu=0.9))
    opt.add_param_group(dict(params=[("extra.v", v)], use_muon=False, lr=1e-3))
    rows = [(g["algo"], g["eps"], g.get("betas"), g["weight_decay"])
            for g in opt.param_groups[1:]]
    assert rows[0] == ("adamw", 1e-10, (0.8, 0.9), 0.01), rows
    assert opt.param_groups[2]["momentum"] == 0.9 and rows[1][0] == "muon", rows
    assert rows[2] == ("adamw", 1e-10, (0.9, 0.95), 0.0), rows
    refs = [(w, _TorchAdamW(nn.Parameter(w.detach().clone()), 0.01, (0.8, 0.9), 1e-10, 0.01)),
            (v, _TorchAdamW(nn.Parameter(v.detach().clone()), 1e-3, (0.9, 0.95), 1e-10, 0.0))]
    for k in range(2):
        gen = torch.Generator().manual_seed(k)
        grads = [torch.randn(p.shape, generator=gen) * 1e-9 for p, _ in refs]
        for (p, r), g in zip(refs, grads):
            p.grad = g.clone()
        opt.step()
        for (p, r), g, lr, wd in zip(refs, grads, (0.01, 1e-3), (0.01, 0.0)):
            r.step(g, lr, wd)
            assert relative(p.detach(), r.w) < 1e-5, (k, relative(p.detach(), r.w))
    opt.close()


def case_dion_state_dict_group_keys():
    """A state dict of dion's Muon (Muon-only: its "momentum" is the library's M) names its
    group keys as dion does: loaded, its mu is the group's momentum (0.9 saved, 0.95 here) and
    its momentum the runtime's, and the steps go on as dion's arithmetic from there; a saved
    epsilon other than this optimizer's (a key fixed at construction) is refused by name.
    Before, mu, epsilon and adjust_lr were kept as keys no step reads: the run went on with
    mu 0.95, silently."""
    w = nn.Parameter(torch.randn(12, 20) * 0.1)
    opt = Muon([dict(params=[("w", w)], algorithm="muon", lr=0.02)], config=FP32)
    gen = torch.Generator().manual_seed(9)
    m0 = torch.randn(12, 20, generator=gen)

    def saved(**kw):
        g = dict(params=[0], lr=0.02, mu=0.9, beta1=0.9, beta2=0.95, weight_decay=0.01,
                 algorithm="muon", step=3, epsilon=1e-8, nesterov=False, flatten=False,
                 adjust_lr="spectral_norm")
        g.update(kw)
        return {"state": {0: {"momentum": m0.clone()}}, "param_groups": [g]}
    refused(lambda: opt.load_state_dict(saved(epsilon=1e-6)), ValueError,
            "eps = 1e-06 in the state dict")
    opt.load_state_dict(saved())
    g = opt.param_groups[0]
    assert g["momentum"] == 0.9 and "mu" not in g and "epsilon" not in g, g
    r = RefMuon(w, 0.9, False, QUINTIC, 1e-8, lambda a, b: (a / b) ** 0.5)
    r.m = m0.clone()
    for k in range(2):
        w.grad = torch.randn(12, 20, generator=gen)
        opt.step()
        r.step(w.grad, 0.02, 0.01)
        assert relative(w.detach(), r.w) < 1e-5, (k, relative(w.detach(), r.w))
    opt.close()


# ---- driving patterns -----------------------------------------------------------------------

def split_like(m, opt, lr):
    """torch.optim.AdamW over copies of m's tensors, one group per group of opt (the same
    tensors in the same order), each with its own lr (a tensor lr copied per group, as a script
    writing its groups gives each its own): the lrs torch's schedulers give a torch optimizer
    of those groups."""
    idx = {id(p): i for i, p in enumerate(m.parameters())}
    copies = [nn.Parameter(p.detach().clone()) for p in m.parameters()]
    groups = [{"params": [copies[idx[id(p)]] for p in g["params"]],
               "lr": lr.clone() if isinstance(lr, torch.Tensor) else lr}
              for g in opt.param_groups]
    return torch.optim.AdamW(groups, lr=lr, foreach=False), copies


def case_tensor_lr_under_per_group_scheduler():
    """lr given as a 0-d tensor (torch takes a Tensor lr; torch's schedulers then write it in
    place, fill_) under LambdaLR with one lambda per group: each group's lr is its own, as on
    torch.optim.AdamW with the same groups, and each group steps with it (the AdamW tensors
    within fp32 rounding of torch's). Before, the Muon and AdamW groups split from one list
    held the same tensor object, so the scheduler's fill_ for the AdamW group set the Muon
    group's lr too: both stepped with the last lambda's lr."""
    m = model()
    opt = Muon(m.named_parameters(), lr=torch.tensor(0.02), model=m)
    ref, copies = split_like(m, opt, lr=torch.tensor(0.02))
    lams = [lambda s: 1.0 / (s + 1), lambda s: 0.5 ** s]
    ours, theirs = L.LambdaLR(opt, lams), L.LambdaLR(ref, lams)
    (ai,) = [i for i, g in enumerate(opt.param_groups) if g["algo"] == "adamw"]
    for gi, g in enumerate(ref.param_groups):
        g["betas"], g["eps"], g["weight_decay"] = (opt.param_groups[ai]["betas"],
                                                   opt.param_groups[ai]["eps"],
                                                   opt.param_groups[ai]["weight_decay"])
    index = {id(p): i for i, p in enumerate(m.parameters())}
    for k in range(3):
        opt.zero_grad()
        m(*batch(k)).backward()
        for p in m.parameters():
            copies[index[id(p)]].grad = p.grad.detach().clone()
        opt.step()
        ref.step()
        ours.step()
        theirs.step()
        got = [float(g["lr"]) for g in opt.param_groups]
        want = [float(g["lr"]) for g in ref.param_groups]
        assert got == want, (k, got, want)
        assert ours.get_last_lr() == theirs.get_last_lr()
        for p in opt.param_groups[ai]["params"]:
            err = relative(p.detach(), copies[index[id(p)]].detach())
            assert err < 2e-6, (k, tuple(p.shape), err)
    opt.close()


def case_swalr_and_reduce_on_plateau():
    """torch.optim.swa_utils.SWALR (annealing to swa_lr, cos and linear) and ReduceLROnPlateau
    give each group the lr they give torch.optim.AdamW with the same groups, step after step."""
    from torch.optim.swa_utils import SWALR
    for make in (lambda o: SWALR(o, swa_lr=0.005, anneal_epochs=3, anneal_strategy="cos"),
                 lambda o: SWALR(o, swa_lr=[0.004, 0.001], anneal_epochs=2,
                                 anneal_strategy="linear"),
                 lambda o: L.ReduceLROnPlateau(o, factor=0.5, patience=0)):
        m = model()
        opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
        ref, _ = split_like(m, opt, lr=0.02)
        for g, r in zip(opt.param_groups, ref.param_groups):
            r["lr"] = g["lr"]
        ours, theirs = make(opt), make(ref)
        for k in range(5):
            opt.zero_grad()
            loss = m(*batch(k))
            loss.backward()
            opt.step()
            ref.step()  # no gradients: nothing moves, but its schedulers see a step taken
            if isinstance(ours, L.ReduceLROnPlateau):
                ours.step(1.0)  # a loss that never improves: every step reduces
                theirs.step(1.0)
            else:
                ours.step()
                theirs.step()
            got = [g["lr"] for g in opt.param_groups]
            want = [g["lr"] for g in ref.param_groups]
            assert got == want, (type(ours).__name__, k, got, want)
        opt.close()


def case_weight_decay_edited_each_step():
    """weight_decay written into every group before each step (a decay schedule): the AdamW
    tensors follow torch.optim.AdamW with the same edits within fp32 rounding, the Muon ones
    torch.optim.Muon's arithmetic (decay with the unscaled lr) in fp32 within 1e-5."""
    m = model()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m, config=FP32)
    refs, lrs = [], {}
    for g in opt.param_groups:
        for p in g["params"]:
            lrs[id(p)] = g["lr"]
            refs.append((p, RefMuon(p, 0.95, True, JORDAN, 1e-7, lambda a, b: max(1, a / b) ** 0.5)
                         if g["algo"] == "muon" else
                         _TorchAdamW(nn.Parameter(p.detach().clone()), g["lr"], g["betas"],
                                     g["eps"], 0.0)))
    worst = 0.0
    for k in range(3):
        for g in opt.param_groups:  # the decay of step k, written into every group before it
            g["weight_decay"] = 0.05 * (k + 1)
        worst = max(worst, against_one(m, opt, refs, k,
                                       lambda p: (lrs[id(p)], 0.05 * (k + 1))))
    print(f"  weight decay edited each step: {worst:.2e} from the references")
    opt.close()


def case_state_dict_hooks():
    """torch.optim's state-dict hooks as a script registers them: register_state_dict_pre_hook
    sees the optimizer, a post hook's returned dict is what state_dict() returns; a
    load_state_dict pre hook's returned dict is what is loaded (here with group 0's lr edited),
    and the post hook runs after it; handles remove them."""
    m = model()
    opt = Muon(m.named_parameters(), lr=0.02, model=m)
    m(*batch(0)).backward()
    opt.step()
    seen = []
    h1 = opt.register_state_dict_pre_hook(lambda o: seen.append(("pre", o is opt)))
    h2 = opt.register_state_dict_post_hook(lambda o, sd: {**sd, "note": "from a hook"})
    sd = opt.state_dict()
    assert seen == [("pre", True)] and sd["note"] == "from a hook", (seen, list(sd))

    def edit(o, sd):
        sd = dict(sd, param_groups=[dict(g) for g in sd["param_groups"]])
        sd["param_groups"][0]["lr"] = 0.005
        return sd
    h3 = opt.register_load_state_dict_pre_hook(edit)
    h4 = opt.register_load_state_dict_post_hook(lambda o: seen.append(("loaded",
                                                                       o.param_groups[0]["lr"])))
    opt.load_state_dict(sd)
    assert seen[-1] == ("loaded", 0.005) and opt.param_groups[0]["lr"] == 0.005, seen
    for h in (h1, h2, h3, h4):
        h.remove()
    sd = opt.state_dict()
    assert "note" not in sd and len(seen) == 2
    opt.close()


def case_generator_and_named_tuples():
    """Parameters given as a generator of (name, tensor) pairs, and a group whose "params" is a
    generator: the same algorithms and steps as model.named_parameters() itself."""
    m, m2 = model(), model()
    a = Muon(m.named_parameters(), lr=0.02, model=m)
    b = Muon(((n, p) for n, p in m2.named_parameters()), lr=0.02)
    c_m = model()
    c = Muon([{"params": (p for n, p in c_m.named_parameters() if p.ndim >= 2 and "wte" not in n
                          and "wpe" not in n), "algo": "muon"},
              {"params": (p for n, p in c_m.named_parameters() if p.ndim < 2 or "wte" in n
                          or "wpe" in n), "algo": "adamw"}], lr=0.02)
    for x, y, z in zip(m.parameters(), m2.parameters(), c_m.parameters()):
        assert a.algo(x) == b.algo(y) == c.algo(z), tuple(x.shape)
    for k in range(2):
        for mm, o in ((m, a), (m2, b), (c_m, c)):
            o.zero_grad()
            mm(*batch(k)).backward()
            o.step()
    for x, y, z in zip(m.parameters(), m2.parameters(), c_m.parameters()):
        assert torch.equal(x, y) and torch.equal(x, z), tuple(x.shape)
    for o in (a, b, c):
        o.close()


RESUME = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_torch_ports import prime_rl_setup_optimizer, model, batch
from shardopt.torch import Muon
torch.set_num_threads(1)
m = model()
m.load_state_dict(torch.load(sys.argv[2] + "/model.pt", weights_only=True))
opt = prime_rl_setup_optimizer(m, torch.tensor(3e-3), 0.05, None, Muon)
opt.load_state_dict(torch.load(sys.argv[2] + "/opt.pt", weights_only=True))
for k in (2, 3):
    opt.zero_grad()
    m(*batch(k)).backward()
    opt.step()
torch.save(m.state_dict(), sys.argv[2] + "/after.pt")
"""


def case_resume_ported_optimizer_in_new_process():
    """The prime-rl port (with a tensor lr) saved after 2 steps with torch.save, loaded with
    torch.load(weights_only=True) in a new process into an optimizer built anew, 2 more steps:
    the bits of 4 uninterrupted steps."""
    m = model()
    opt = prime_rl_setup_optimizer(m, torch.tensor(3e-3), 0.05, None, Muon)
    with tempfile.TemporaryDirectory() as d:
        for k in range(4):
            if k == 2:
                torch.save(m.state_dict(), os.path.join(d, "model.pt"))
                torch.save(opt.state_dict(), os.path.join(d, "opt.pt"))
            opt.zero_grad()
            m(*batch(k)).backward()
            opt.step()
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, "-c", RESUME, here, d], capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        after = torch.load(os.path.join(d, "after.pt"), weights_only=True)
    for n, p in m.named_parameters():
        assert torch.equal(p.detach(), after[n]), n
    opt.close()


if __name__ == "__main__":
    cases.run("test_torch_ports", dict(globals()))
