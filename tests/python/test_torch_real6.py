"""shardopt.torch.Muon in training scripts as others write them, the eighth round (after
test_torch_real5.py): NVIDIA Emerging-Optimizers' Muon (the base of Megatron-Core's
TensorParallelMuon) ported by its import, in both of its spellings, against its update rule
written out in fp32; OLMo-core's MuonConfig building dion's Muon (cautious_wd, num_heads);
other optimizers' key names written into a group by a ported loop, and read from it; then
(the ninth round) ZeroRedundancyOptimizer over this class on one gloo rank, HF Trainer's,
Lightning's and SWA's loops. Each script is what its
author would run, the import swapped, compared with the optimizer it was written for. One
process.

    test_torch_real6.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import io
import json
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch

from test_torch_dropin import quiet, refused, relative
from test_torch_real import FP32, mlp, worst

from shardopt.torch import Muon

torch.set_num_threads(1)


def x_of(k):
    # 32 rows: full-rank gradients (5 gave rank 5, whose null space the steeper tables lift
    # from fp32 noise, differently in any two fp32 implementations)
    return torch.randn(32, 8, generator=torch.Generator().manual_seed(k))


# ---- NVIDIA Emerging-Optimizers' Muon ---------------------------------------------------------

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
POLAR = [(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
         (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
         (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)]
AOL = [(4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
       (2.7215, -3.0494, 1.3169)]


class EmergingMuonRule:
    """Emerging-Optimizers' Muon step on 2-D tensors as its README and docstrings state it, in
    fp32: an EMA momentum buffer (buf.lerp_(g, 1 - beta); Nesterov g.lerp(buf, beta)), the
    Newton-Schulz iteration on the wide orientation after x / max(|x|, 1e-7) with one (a, b, c)
    per step, the update scaled by its scale_mode times extra_scale_factor, and decoupled
    weight decay W -= lr * wd * W before W -= lr * update."""

    def __init__(self, params, lr, beta, wd, nesterov, table, mode, extra):
        self.params, self.lr, self.beta, self.wd = list(params), lr, beta, wd
        self.nesterov, self.table, self.mode, self.extra = nesterov, table, mode, extra
        self.buf = {}

    def scale(self, out, inp):
        return {"spectral": max(out, inp) ** 0.5, "shape_scaling": max(1, out / inp) ** 0.5,
                "unit_rms_norm": (out / inp) ** 0.5}[self.mode] * self.extra

    @torch.no_grad()
    def step(self):
        for p in self.params:
            g = p.grad
            buf = self.buf.setdefault(p, torch.zeros_like(g))
            buf.lerp_(g, 1 - self.beta)
            u = g.lerp(buf, self.beta) if self.nesterov else buf.clone()
            tall = u.size(0) > u.size(1)
            x = u.T if tall else u
            x = x / x.norm().clamp_min(1e-7)
            for a, b, c in self.table:
                A = x @ x.T
                x = a * x + (b * A + c * A @ A) @ x
            x = x.T if tall else x
            p.add_(p, alpha=-self.lr * self.wd)
            p.add_(x * self.scale(*p.shape), alpha=-self.lr)

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def _against_emerging(kw, rule, tol, steps=4):
    """Emerging-Optimizers' call kw (with the import swapped) on the test MLP's matrices,
    torch.optim.AdamW on its biases (Emerging's Muon steps matrices only, so its scripts pair
    it with one), against rule's arithmetic; the worst relative distance after steps, and
    the Muon state against its momentum_buffer (within tol)."""
    a, b = mlp(), mlp()
    mats = [n for n, p in a.named_parameters() if p.ndim == 2]
    so = Muon(a.named_parameters(), adamw_lr=1e-3, config=FP32, **kw)
    ref = EmergingMuonRule([p for n, p in b.named_parameters() if n in mats], **rule)
    adamw = torch.optim.AdamW([p for n, p in b.named_parameters() if n not in mats], lr=1e-3,
                              weight_decay=rule["wd"])
    for k in range(steps):
        so.zero_grad()
        a(x_of(k)).square().mean().backward()
        so.step()
        ref.zero_grad()
        adamw.zero_grad()
        b(x_of(k)).square().mean().backward()
        ref.step()
        adamw.step()
    for n, p in a.named_parameters():
        if n in mats:
            q = dict(b.named_parameters())[n]
            assert relative(so.state[p]["momentum_buffer"], ref.buf[q]) < tol, n
    return worst(a, b)


def _resumed_with_lists():
    """A state dict of such a run (its table of ns_coefficients a tuple of triples) resumes
    bit for bit through torch.load(weights_only=True), and with its groups' values as lists
    (a JSON or YAML round trip), which before were refused as a fixed key changed
    (`ns_coefficients = [[8.2051, ...]] in the state dict, ((8.2051, ...)) here`)."""
    kw = dict(lr=0.02, coefficient_type="polar_express", num_ns_steps=8, config=FP32)
    a = mlp()
    o = Muon(a.named_parameters(), **kw)
    for k in range(2):
        o.zero_grad()
        a(x_of(k)).square().mean().backward()
        o.step()
    buf = io.BytesIO()
    torch.save(o.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    listed = json.loads(json.dumps(sd["param_groups"]))
    runs = [(a, o)]
    for groups in (sd["param_groups"], listed):
        b = mlp()
        b.load_state_dict(a.state_dict())
        o2 = Muon(b.named_parameters(), **kw)
        o2.load_state_dict({"state": sd["state"], "param_groups": groups})
        runs.append((b, o2))
    for k in range(2, 4):
        for net, opt in runs:
            opt.zero_grad()
            net(x_of(k)).square().mean().backward()
            opt.step()
    for net, opt in runs[1:]:
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), net.parameters()))
        opt.close()
    o.close()


def case_emerging_optimizers_muon():
    """A script written for NVIDIA Emerging-Optimizers' Muon (`from emerging_optimizers.
    orthogonalized_optimizers import Muon`; Megatron-Core's TensorParallelMuon derives from
    it), the import swapped: its keywords (num_ns_steps, coefficient_type, scale_mode,
    extra_scale_factor, fp32_matmul_prec, use_syrk, weight_decay_method, split_qkv) and its
    earlier spelling (momentum_beta, use_nesterov, use_decoupled_weight_decay) are taken, the
    keys left unset take its defaults (lr 3e-4, weight decay 0.01, no Nesterov, quintic, 5
    steps, the update scaled by sqrt(max(A, B))), and the run is its arithmetic: within 2e-6
    over 4 steps for each table and scale (1.4e-7 to 9.0e-7 measured, the most with quintic
    repeated to 10 steps; on a rank-5 gradient the steep tables lift its null space out of
    the fp32 noise, differently in any two fp32 implementations, hence full-rank inputs).
    Its polar_express and aol are not the library's tables of those names: given as custom
    tables; its spectral scale, 5 times the library's rms_norm, goes through each Muon
    tensor's lr_mult, the decay staying lr * wd. The momentum_buffer of the state is its
    buffer, and a state dict resumes bit for bit (_resumed_with_lists). Before, `unexpected
    keyword argument 'num_ns_steps'`. What it computes otherwise is refused by name."""
    runs = [
        # its defaults, one keyword of its own given
        ({"fp32_matmul_prec": "highest"},
         dict(lr=3e-4, beta=0.95, wd=0.01, nesterov=False, table=QUINTIC, mode="spectral",
              extra=1.0)),
        # Megatron's recipe: spectral scale times 0.2 (the library's rms_norm exactly)
        ({"lr": 0.02, "weight_decay": 0.1, "coefficient_type": "quintic", "num_ns_steps": 5,
          "scale_mode": "spectral", "extra_scale_factor": 0.2, "nesterov": True},
         dict(lr=0.02, beta=0.95, wd=0.1, nesterov=True, table=QUINTIC, mode="spectral",
              extra=0.2)),
        # the earlier spelling; polar_express past its 8 triples repeats the last
        ({"lr": 0.02, "momentum_beta": 0.9, "use_nesterov": True,
          "use_decoupled_weight_decay": True, "coefficient_type": "polar_express",
          "num_ns_steps": 9, "scale_mode": "shape_scaling"},
         dict(lr=0.02, beta=0.9, wd=0.01, nesterov=True, table=POLAR + POLAR[-1:],
              mode="shape_scaling", extra=1.0)),
        ({"lr": 0.01, "coefficient_type": "aol", "num_ns_steps": 8,
          "scale_mode": "unit_rms_norm", "extra_scale_factor": 0.5, "weight_decay": 0.05,
          "weight_decay_method": "decoupled", "use_syrk": True, "split_qkv": False},
         dict(lr=0.01, beta=0.95, wd=0.05, nesterov=False, table=AOL * 2,
              mode="unit_rms_norm", extra=0.5)),
        ({"lr": 0.02, "coefficient_type": "simple", "num_ns_steps": 3, "weight_decay": 0.0},
         dict(lr=0.02, beta=0.95, wd=0.0, nesterov=False, table=[(3.4445, -4.7750, 2.0315)] * 3,
              mode="spectral", extra=1.0)),
        ({"lr": 0.02, "num_ns_steps": 10, "weight_decay": 0.0},
         dict(lr=0.02, beta=0.95, wd=0.0, nesterov=False, table=QUINTIC * 2, mode="spectral",
              extra=1.0))]
    for kw, rule in runs:
        tol = 2e-6
        w = _against_emerging(kw, rule, tol)
        print(f"  {kw}: {w:.1e} from Emerging-Optimizers' arithmetic after 4 steps")
        assert w < tol, (kw, w)
    _resumed_with_lists()
    m = mlp()
    for kw, words in (
            ({"split_qkv": True}, ("split_qkv = True", "Q, K and V")),
            ({"weight_decay_method": "l2"}, ("weight_decay_method = 'l2'", "decoupled")),
            ({"use_decoupled_weight_decay": False}, ("'l2'",)),
            ({"use_independent_weight_decay": True}, ("'independent'",)),
            ({"coefficient_type": "cans"}, ("coefficient_type = 'cans'", "polar_express")),
            ({"num_ns_steps": 7}, ("num_ns_steps = 7", "multiple of 5")),
            ({"coefficient_type": "polar_express", "num_ns_steps": 6}, ("at least 8",)),
            ({"num_ns_steps": 5, "ns_steps": 5}, ("ns_steps and num_ns_steps both given",)),
            ({"scale_mode": "spectral", "adjust_lr_fn": "original"}, ("both given",)),
            ({"momentum_beta": 0.9, "momentum": 0.9}, ("both given",)),
            ({"scale_mode": "rms"}, ("scale_mode = 'rms'", "'shape_scaling'")),
            ({"extra_scale_factor": 0}, ("extra_scale_factor = 0",)),
            ({"fp32_matmul_prec": "tf32"}, ("fp32_matmul_prec = 'tf32'",)),
            ({"num_ns_steps": 5, "mu": 0.9}, ("Emerging-Optimizers' Muon) and mu",))):
        refused(lambda: quiet(Muon, m.named_parameters(), **kw), ValueError, *words)
    # a name of none of the ports still names them all, Emerging-Optimizers' included
    refused(lambda: Muon(m.named_parameters(), num_steps=5), TypeError, "'num_steps'",
            "num_ns_steps")


# ---- OLMo-core's MuonConfig over dion's Muon ---------------------------------------------------

def olmo_core_muon(model, opt_class, heads, **extra):
    """OLMo-core's MuonConfig.create_optimizer as it builds dion's Muon: every field of its
    config as a keyword (mu, betas, weight_decay, cautious_wd, nesterov, adjust_lr, flatten,
    use_triton) with distributed_mesh None on one device, and its groups: the matrices, the
    attention projections in a group of their own with "num_heads" (heads[name], where it is
    more than 1), the embeddings and the rest to AdamW (the embeddings without decay), empty
    groups dropped."""
    names = dict(model.named_parameters())
    mats = [n for n, p in names.items() if p.ndim == 2 and "wte" not in n and "wpe" not in n
            and n not in heads]
    by_heads = {}
    for n, h in heads.items():
        by_heads.setdefault(h, []).append(n)
    groups = [dict(params=mats)] + [dict(params=ns, num_heads=h) for h, ns in by_heads.items()]
    groups += [dict(params=[n for n, p in names.items() if p.ndim < 2], algorithm="adamw"),
               dict(params=[n for n in names if "wte" in n or "wpe" in n], algorithm="adamw",
                    weight_decay=0.0)]
    groups = [dict(g, params=[names[n] for n in g["params"]]) for g in groups if g["params"]]
    return opt_class(groups, lr=3e-3, mu=0.95, betas=(0.9, 0.95), weight_decay=0.1,
                     cautious_wd=False, nesterov=False, adjust_lr="rms_norm", flatten=False,
                     use_triton=False, distributed_mesh=None, **extra)


def case_olmo_core_muon_config():
    """OLMo-core's MuonConfig builds dion's Muon with cautious_wd= among its keywords and a
    "num_heads" key on its attention groups (dion then orthogonalizes each head's rows apart).
    Before, cautious_wd was an unexpected keyword argument, and num_heads, kept in the group
    and never read, stepped each attention projection as one matrix, silently. Now
    cautious_wd=False and num_heads 1 are taken (4 steps within 1e-5 of dion's arithmetic
    (fp32) and torch.optim.AdamW), and what the library does not compute is refused by name:
    num_heads over 1, cautious_wd=True (as a keyword or a group's key)."""
    from test_torch_dropin import model
    from test_torch_ports import QUINTIC as DION, RefMuon, _TorchAdamW, against, rms_scale
    m = model()
    attn = [n for n, p in m.named_parameters() if p.ndim == 2 and ".h.0." in n]
    # its matrix groups name no algorithm and hold tensors without names: dion's default
    # algorithm, Muon, with no warning (before: the warning that every unnamed 2-D tensor
    # goes to Muon, which OLMo-core's own grouping had decided)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = olmo_core_muon(m, Muon, {attn[0]: 1}, config=FP32)
    assert [g["algo"] for g in opt.param_groups] == ["muon", "muon", "adamw", "adamw"]
    assert opt.param_groups[1]["num_heads"] == 1  # kept, as dion keeps it
    refs = [(p, RefMuon(p, 0.95, False, DION, 1e-8, rms_scale))
            for g in opt.param_groups[:2] for p in g["params"]]
    refs += [(p, _TorchAdamW(torch.nn.Parameter(p.detach().clone()), 3e-3, (0.9, 0.95), 1e-8,
                             g["weight_decay"]))
             for g in opt.param_groups[2:] for p in g["params"]]
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    w = against(m, opt, refs, 4, lambda p: (3e-3, wd[id(p)]))
    print(f"  OLMo-core's dion Muon (num_heads 1): {w:.2e} from dion's arithmetic (fp32)")
    opt.close()
    refused(lambda: quiet(olmo_core_muon, m, Muon, {attn[0]: 4}), ValueError,
            "param group 1: num_heads = 4", "each head's rows")
    refused(lambda: quiet(Muon, m.parameters(), mu=0.95, cautious_wd=True), ValueError,
            "cautious_wd = True")
    refused(lambda: Muon([dict(params=list(m.parameters()), algorithm="adamw",
                               cautious_wd=True)]), ValueError,
            "param group 0: cautious_wd = True")
    refused(lambda: Muon([dict(params=list(m.parameters()), num_heads=True)]), ValueError,
            "num_heads = True")
    # add_param_group's groups are checked alike
    m2 = model()
    o = quiet(Muon, [p for p in m2.parameters() if p.ndim == 2][:1], mu=0.95)
    refused(lambda: o.add_param_group(dict(params=[p for p in m2.parameters() if p.ndim == 2][1:2],
                                           num_heads=2)), ValueError, "num_heads = 2")
    o.close()


def case_their_names_written_into_groups():
    """A script ported from another optimizer keeps its own loop: a dion momentum warmup
    writes g["mu"] each step, one for Emerging-Optimizers' earlier spelling g["momentum_beta"]
    (this class reads "momentum"). Before, the key was added to the group and never read: the
    run went on with the first momentum, silently. Now the step refuses it, naming the key and
    this class's name, nothing stepped (before the first step too), and with "momentum"
    written instead the warmup takes effect; so is a group given with Moonlight's "wd". Other
    new keys (a tag, a scheduler's initial_lr added after the first step) are taken."""
    m = mlp()
    for key, kw in (("mu", dict(mu=0.9, adjust_lr="rms_norm")),
                    ("momentum_beta", dict(momentum_beta=0.9, num_ns_steps=5))):
        for before_first in (True, False):
            m = mlp()
            o = Muon(m.named_parameters(), lr=0.02, **kw)
            if not before_first:
                m(x_of(0)).square().mean().backward()
                o.step()
            w = m[0].weight.detach().clone()
            o.param_groups[0][key] = 0.95
            m(x_of(1)).square().mean().backward()
            refused(o.step, ValueError, f"param group 0 (muon): {key} = 0.95",
                    "name for 'momentum'", "nothing was stepped")
            assert torch.equal(w, m[0].weight)
            del o.param_groups[0][key]
            o.param_groups[0]["momentum"] = 0.95  # this class's name: read at every step
            o.param_groups[0]["my_tag"] = "attn"
            torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0)  # adds initial_lr
            o.step()
            assert not torch.equal(w, m[0].weight)
            o.close()
    refused(lambda: quiet(Muon, [dict(params=list(m.parameters()), wd=0.1)]), ValueError,
            "param group 0", "wd = 0.1", "name for 'weight_decay'")



def case_their_names_read_from_groups():
    """A script written for Emerging-Optimizers' earlier Muon reads its group key
    g["momentum_beta"] (a logger, a warmup computing from it); dion's scripts read g["mu"],
    its AdamW groups g["beta1"] / g["beta2"] / g["epsilon"]. Before, a KeyError (the groups
    hold this class's names). Now each reads as this class's key, as their optimizer's group
    would give it, following a write of this class's key (a warmup of g["momentum"]) and a
    load_state_dict; the key is not added to the group (`in`, state_dict() unchanged), and
    writing it is still refused at step (case_their_names_written_into_groups)."""
    m = mlp()
    o = Muon(m.named_parameters(), lr=0.02, momentum_beta=0.9, num_ns_steps=5)
    g, a = o.param_groups
    assert (g["momentum_beta"], g["mu"], g.get("momentum_beta"), g.get("nope", 7)) == \
        (0.9, 0.9, 0.9, 7)
    assert (a["beta1"], a["beta2"], a["epsilon"]) == (a["betas"][0], a["betas"][1], a["eps"])
    assert "momentum_beta" not in g and "momentum_beta" not in o.state_dict()["param_groups"][0]
    refused(lambda: g["nope"], KeyError, "nope")
    refused(lambda: g["adjust_lr"], KeyError)  # dion's values are not adjust_lr_fn's
    g["momentum"] = 0.8  # this class's warmup: the other name follows
    m(x_of(0)).square().mean().backward()
    o.step()
    assert g["momentum_beta"] == 0.8
    sd = o.state_dict()
    sd["param_groups"][0]["momentum"] = 0.85
    o.load_state_dict(sd)
    assert o.param_groups[0]["momentum_beta"] == 0.85
    o.close()


def case_zero_redundancy_optimizer_one_rank():
    """torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class=Muon, ...) on
    one rank (gloo, world 1). Groups by algorithm are taken: 3 steps bit for bit those of
    Muon alone, and a resume through its consolidate_state_dict / state_dict /
    load_state_dict bit for bit the run that went on (before, 1 ulp off: its load assigns
    each parameter's whole state, opt.state[p] = {...}, and the momentum_buffer written after
    the momentum replaced it through its scale 1 / (1 - mu)). One group of both kinds,
    which this class splits, is refused naming ZeroRedundancyOptimizer and the way out
    (before: its AssertionError 'Mismatch between number of source and destination parameter
    groups')."""
    import tempfile
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer as ZeRO

    def groups(m):
        return [{"params": [p for p in m.parameters() if p.ndim == 2], "algo": "muon"},
                {"params": [p for p in m.parameters() if p.ndim < 2], "algo": "adamw"}]

    def run(pairs, ks):
        for k in ks:
            for net, opt in pairs:
                opt.zero_grad()
                net(x_of(k)).square().mean().backward()
                opt.step()

    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
    try:
        a, b, c = mlp(), mlp(), mlp()
        kw = dict(optimizer_class=Muon, lr=0.02, adamw_lr=1e-3, config=FP32)
        z = ZeRO(groups(a), **kw)
        alone = Muon(groups(b), lr=0.02, adamw_lr=1e-3, config=FP32)
        run([(a, z), (b, alone)], range(3))
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        z.consolidate_state_dict(0)
        sd = z.state_dict()
        c.load_state_dict(a.state_dict())
        z2 = ZeRO(groups(c), **kw)
        z2.load_state_dict(sd)
        run([(a, z), (c, z2)], range(3, 5))
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
        for o in (z, z2):
            o.optim.close()
        alone.close()
        refused(lambda: quiet(ZeRO, mlp().parameters(), optimizer_class=Muon), ValueError,
                "ZeroRedundancyOptimizer", "1 of its 1 param group(s)", "'algo': 'muon'")
    finally:
        dist.destroy_process_group()


def case_trainer_lightning_and_swa_flows():
    """Three training loops as their frameworks run them, against torch.optim.Muon + AdamW
    (fp32 Newton-Schulz; the probes of this round, which passed as they were): HF Trainer's
    optimizers=(opt, sched) with get_linear_schedule_with_warmup's and
    get_cosine_schedule_with_warmup's LambdaLR (written out: transformers is not needed),
    param_groups[0]["lr"] logged every step (torch's values), the state dict saved with
    torch.save every 3 steps and resumed through torch.load(weights_only=True) bit for bit;
    Lightning's {"optimizer", "lr_scheduler": {"scheduler", "interval": "step"}} with
    opt.step(closure), zero_grad(set_to_none=True) inside the closure (a closure without
    backward steps nothing); CosineAnnealingLR then SWALR with an EMA AveragedModel. Within
    1e-6 of torch (1.4e-7 measured)."""
    import math
    from test_torch_real import Fp32TorchMuon, torch_pair
    from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR
    from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn

    def linear(s, w=2, n=8):
        return s / max(1, w) if s < w else max(0.0, (n - s) / max(1, n - w))

    def cosine(s, w=2, n=8):
        return s / max(1, w) if s < w else \
            max(0.0, 0.5 * (1.0 + math.cos(math.pi * (s - w) / max(1, n - w))))

    def pair():
        a, b = mlp(), mlp()
        return a, b, Muon(a.named_parameters(), lr=0.02, adamw_lr=1e-3, config=FP32), \
            torch_pair(b)

    def save(o, s, net):
        buf = io.BytesIO()
        torch.save({"o": o.state_dict(), "s": s.state_dict(), "m": net.state_dict()}, buf)
        return buf.getvalue()

    with Fp32TorchMuon():
        for lam in (linear, cosine):  # HF Trainer
            a, b, so, ref = pair()
            sched, rs = LambdaLR(so, lam), [LambdaLR(o, lam) for o in ref]
            for k in range(6):
                for net, opts, scheds in ((a, [so], [sched]), (b, ref, rs)):
                    net(x_of(k)).square().mean().backward()
                    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                    for o, s in zip(opts, scheds):
                        o.step()
                        s.step()
                        o.zero_grad()
                assert so.param_groups[0]["lr"] == ref[0].param_groups[0]["lr"]
                if k == 2:
                    ck = save(so, sched, a)
            d = torch.load(io.BytesIO(ck), weights_only=True)
            c = mlp()
            c.load_state_dict(d["m"])
            o2 = Muon(c.named_parameters(), lr=0.02, adamw_lr=1e-3, config=FP32)
            s2 = LambdaLR(o2, lam)
            o2.load_state_dict(d["o"])
            s2.load_state_dict(d["s"])
            for k in range(3, 6):
                c(x_of(k)).square().mean().backward()
                torch.nn.utils.clip_grad_norm_(c.parameters(), 1.0)
                o2.step()
                s2.step()
                o2.zero_grad()
            assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
            assert worst(a, b) < 1e-6, (lam.__name__, worst(a, b))
            for o in (so, o2):
                o.close()
        a, b, so, ref = pair()  # Lightning
        conf = {"optimizer": so, "lr_scheduler": {"scheduler": LambdaLR(so, lambda s: 1 / (1 + s)),
                                                  "interval": "step"}}
        rs = [LambdaLR(o, lambda s: 1 / (1 + s)) for o in ref]
        w = [p.detach().clone() for p in a.parameters()]
        assert so.step(lambda: so.zero_grad(set_to_none=True)) is None
        assert all(torch.equal(p, q) for p, q in zip(w, a.parameters())) and not len(so.state)
        for k in range(4):
            opt = conf["optimizer"]

            def closure(net=a, opts=(opt,)):
                for o in opts:
                    o.zero_grad(set_to_none=True)
                loss = net(x_of(k)).square().mean()
                loss.backward()
                return loss

            opt.step(closure)
            conf["lr_scheduler"]["scheduler"].step()
            ref[0].step(lambda: closure(b, ref))
            ref[1].step()
            for s in rs:
                s.step()
        assert worst(a, b) < 1e-6, worst(a, b)
        so.close()
        a, b, so, ref = pair()  # SWA
        cos = [CosineAnnealingLR(o, T_max=10) for o in [so] + ref]
        swa = [SWALR(o, swa_lr=0.01, anneal_epochs=2) for o in [so] + ref]
        ema = [AveragedModel(n, multi_avg_fn=get_ema_multi_avg_fn(0.9)) for n in (a, b)]
        for k in range(7):
            for net, opts in ((a, [so]), (b, ref)):
                for o in opts:
                    o.zero_grad()
                net(x_of(k)).square().mean().backward()
                for o in opts:
                    o.step()
            for e, n in zip(ema, (a, b)):
                e.update_parameters(n)
            for s in swa if k >= 4 else cos:
                s.step()
        assert [g["lr"] for g in so.param_groups] == [0.01, 0.01]
        print(f"  SWA: {worst(a, b):.1e} from torch, its EMA model "
              f"{worst(ema[0].module, ema[1].module):.1e}")
        assert worst(a, b) < 1e-6 and worst(ema[0].module, ema[1].module) < 1e-6
        so.close()

if __name__ == "__main__":
    cases.run("test_torch_real6", dict(globals()))
