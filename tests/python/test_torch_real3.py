"""shardopt.torch.Muon in training scripts as others write them, the fifth round (after
test_torch_real2.py): Keller Jordan's Muon of December 2024 to February 2025 (muon_params,
adamw_params, adamw_lr, adamw_wd) under nanoGPT's hand-written lr loop, and a state dict that
holds no state for some tensor loaded into an optimizer that has stepped (a rollback to a
checkpoint). Each script is what its author would run, the import swapped, compared with the
optimizer it was written for. One process.

    test_torch_real3.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import collections
import functools
import io
import math
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import batch, model, quiet, refused, relative
from test_torch_ports import JORDAN, MoonlightAdamW, RefMuon, against_one

from shardopt.torch import Muon

torch.set_num_threads(1)
FP32 = {"ns_compute": "fp32", "comm_dtype": "fp32"}  # the library's Newton-Schulz in fp32


def jordan_scale(a, b):
    return max(1.0, a / b) ** 0.5


def nanogpt_lr(it, lr=0.02, warmup=2, decay=6, min_lr=0.002):
    """nanoGPT's get_lr: linear warmup, cosine decay to min_lr."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    ratio = min(1.0, (it - warmup) / (decay - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def case_keller_jordan_muon_with_adamw_params():
    """Keller Jordan's muon.py of December 2024 to February 2025 (at 28c793b), which many
    projects copied: Muon(muon_params, lr=0.02, momentum=0.95, adamw_params=...,
    adamw_lr=3e-4, adamw_betas=(0.90, 0.95), adamw_wd=0.01), its first argument the Muon
    tensors. Its AdamW lr is adamw_lr / lr times the group's lr, so nanoGPT's loop
    `for g in opt.param_groups: g["lr"] = get_lr(it)` moves both sides; its Muon has no weight
    decay, 6 Newton-Schulz steps and the sqrt(max(1, A/B)) scale; its muon_params under 2 dims
    go to AdamW. Ported, every tensor within 1e-5 of its arithmetic (written out in fp32, the
    library with fp32 Newton-Schulz) after each of 6 steps. Before, adamw_wd was an unexpected
    keyword; without it, the call was read as Moonlight's (params and adamw_params refused,
    or with muon_params= Moonlight's lr scale and decay, and the AdamW side at adamw_lr
    whatever the loop wrote)."""
    m = model()
    # its README's split: the body's matrices to Muon, the rest (embeddings, norms, biases)
    # to AdamW; a 1-D tensor in muon_params goes to AdamW as its use_muon marks it
    body = [p for n, p in m.named_parameters() if "wte" not in n and "wpe" not in n]
    muon_params = [p for p in body if p.ndim >= 2] + [m.transformer.ln_f.bias]
    adamw_params = [p for n, p in m.named_parameters()
                    if not any(p is q for q in muon_params)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the lists fix each tensor's algorithm: no warning
        opt = Muon(muon_params, lr=0.02, momentum=0.95, adamw_params=adamw_params,
                   adamw_lr=3e-4, adamw_betas=(0.90, 0.95), adamw_wd=0.01, config=FP32)
    assert opt.algo(m.transformer.ln_f.bias) == "adamw"
    assert opt.algo(m.transformer.wte.weight) == "adamw"
    groups = [(g["algo"], g["lr"], g["weight_decay"], g.get("betas"), g["eps"], g["ns_steps"])
              for g in opt.param_groups]
    assert groups == [("muon", 0.02, 0.0, None, 1e-7, 6),
                      ("adamw", 0.02, 0.01, (0.9, 0.95), 1e-8, 6)], groups
    ratio = 3e-4 / 0.02  # as its constructor computes it
    assert opt.param_groups[1]["adamw_lr_ratio"] == ratio
    refs = []
    for g in opt.param_groups:
        for p in g["params"]:
            refs.append((p, RefMuon(p, 0.95, True, JORDAN + JORDAN[:1], 1e-7, jordan_scale)
                         if g["algo"] == "muon" else MoonlightAdamW(p, (0.9, 0.95), 1e-8)))
    algo = {id(p): g["algo"] for g in opt.param_groups for p in g["params"]}
    worst = 0.0
    for it in range(6):
        lr = nanogpt_lr(it)
        for g in opt.param_groups:  # nanoGPT's train.py, unchanged
            g["lr"] = lr
        worst = max(worst, against_one(
            m, opt, refs, it,
            lambda p: (lr, 0.0) if algo[id(p)] == "muon" else (ratio * lr, 0.01)))
    print(f"  Keller Jordan's Muon port: {worst:.2e} from its arithmetic (fp32)")
    # a state dict carries the ratio, and a resumed optimizer steps as the first one
    sd = opt.state_dict()
    assert sd["param_groups"][1]["adamw_lr_ratio"] == ratio
    opt.close()


def case_keller_jordan_muon_spellings():
    """Its defaults (lr 0.02, no Muon decay, AdamW lr 3e-4, betas (0.95, 0.95), eps 1e-8, decay
    0, 6 steps) where the call leaves them out; muon_params= by name with adamw_lr (which
    Moonlight's Muon, one lr for both sides, does not have) is its spelling too; Moonlight's
    call keeps Moonlight's defaults; mixed spellings and a ratio that is no number refused."""
    m = model()
    mats = [p for n, p in m.named_parameters() if p.ndim >= 2 and "wte" not in n
            and "wpe" not in n]
    rest = [p for p in m.parameters() if not any(p is q for q in mats)]
    opt = Muon(mats, adamw_params=rest, adamw_wd=0)
    got = [(g["algo"], g["lr"], g["weight_decay"], g.get("betas"), g["eps"], g["ns_steps"],
            g.get("adamw_lr_ratio"), g["adjust_lr_fn"]) for g in opt.param_groups]
    assert got == [("muon", 0.02, 0.0, None, 1e-7, 6, None, None),
                   ("adamw", 0.02, 0.0, (0.95, 0.95), 1e-8, 6, 3e-4 / 0.02, None)], got
    opt.close()
    opt = Muon(muon_params=mats, adamw_params=rest, adamw_lr=1e-3, lr=0.05)
    assert [g.get("adamw_lr_ratio") for g in opt.param_groups] == [None, 1e-3 / 0.05]
    # a group added later: its AdamW part at the group's lr times the ratio, as there (its
    # defaults hold adamw_lr_ratio); its Muon part at the lr given
    extra = nn.Linear(4, 4)
    quiet(opt.add_param_group, {"params": [extra.weight, extra.bias]})  # unnamed, split
    got = [(g["algo"], g["lr"], g.get("adamw_lr_ratio")) for g in opt.param_groups[2:]]
    assert got == [("muon", 0.05, None), ("adamw", 0.05, 1e-3 / 0.05)], got
    opt.close()
    opt = Muon(lr=1e-3, wd=0.1, muon_params=mats, adamw_params=rest)  # Moonlight's
    got = [(g["lr"], g["weight_decay"], g["adjust_lr_fn"], g.get("adamw_lr_ratio"))
           for g in opt.param_groups]
    assert got == [(1e-3, 0.1, "match_rms_adamw", None)] * 2, got
    opt.close()
    refused(lambda: Muon(muon_params=mats, wd=0.1, adamw_wd=0.0), ValueError, "wd", "adamw_wd",
            "port from one")
    refused(lambda: Muon(mats, adamw_wd=0.0, mu=0.9), ValueError, "adamw_wd", "mu",
            "port from one")
    refused(lambda: Muon(mats, muon_params=mats, adamw_wd=0.0), ValueError,
            "params and muon_params")
    refused(lambda: Muon(mats, lr=0.0, adamw_params=rest), ValueError, "lr = 0.0",
            "adamw_lr / lr")
    opt = Muon(mats, adamw_params=rest)
    opt.param_groups[1]["adamw_lr_ratio"] = "0.1"
    m(*batch(0)).backward()
    before = [p.detach().clone() for p in m.parameters()]
    refused(opt.step, ValueError, "param group 1 (adamw)", "adamw_lr_ratio = '0.1'",
            "nothing was stepped")
    assert all(torch.equal(p, b) for p, b in zip(m.parameters(), before))
    opt.close()


def hf_create_optimizer(opt_model, optimizer_cls_and_kwargs, weight_decay=0.01):
    """transformers.Trainer.create_optimizer in miniature: decay and no-decay groups of tensors
    (no names), then its handling of optimizer_cls_and_kwargs, whose kwargs' "params" or
    "model" replace the groups."""
    decay = [n for n, p in opt_model.named_parameters() if p.ndim >= 2]
    groups = [{"params": [p for n, p in opt_model.named_parameters() if n in decay],
               "weight_decay": weight_decay},
              {"params": [p for n, p in opt_model.named_parameters() if n not in decay],
               "weight_decay": 0.0}]
    optimizer_cls, optimizer_kwargs = optimizer_cls_and_kwargs
    optimizer_kwargs = dict(optimizer_kwargs)
    if "params" in optimizer_kwargs:
        groups = optimizer_kwargs.pop("params")
    if "model" in optimizer_kwargs:
        groups = optimizer_kwargs.pop("model")
    return optimizer_cls(groups, **optimizer_kwargs)


def case_hf_trainer_optimizer_cls_and_kwargs():
    """HF's Trainer(optimizer_cls_and_kwargs=(Muon, {"model": model, ...})) hands the model
    itself to the class as its params (the kwargs' "model" replaces the groups): taken as its
    named parameters with model=, the embeddings to AdamW, the same bits as
    Muon(model.named_parameters(), model=model). Before, `'GPT' object is not iterable`
    (torch.optim refuses a module too). Its decay / no-decay groups of unnamed tensors,
    through functools.partial(Muon, model=model), classify by module as well."""
    nets = [model(), model()]
    opts = [hf_create_optimizer(nets[0], (Muon, {"lr": 0.02, "model": nets[0]})),
            Muon(nets[1].named_parameters(), lr=0.02, model=nets[1])]
    assert opts[0].algo(nets[0].transformer.wte.weight) == "adamw"
    for k in range(2):
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            net(*batch(k)).backward()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    refused(lambda: Muon(nets[0], model=nets[1]), ValueError, "params is a module", "give one")
    for opt in opts:
        opt.close()
    m = model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the groups hold both kinds: split, with a warning
        opt = hf_create_optimizer(m, (functools.partial(Muon, model=m), {"lr": 0.02}))
    assert opt.algo(m.transformer.wte.weight) == "adamw"
    assert [(g["algo"], g["weight_decay"]) for g in opt.param_groups] == [
        ("muon", 0.01), ("adamw", 0.01), ("adamw", 0.0)], opt.param_groups
    opt.close()


class Lookahead(torch.optim.Optimizer):
    """timm's Lookahead (timm/optim/lookahead.py) in its essentials: its slow weights live in
    the base optimizer's state[p]["lookahead_slow_buff"], made at the first sync and updated
    in place; its state dict is the base optimizer's."""

    def __init__(self, base_optimizer, alpha=0.5, k=6):
        defaults = dict(lookahead_alpha=alpha, lookahead_k=k, lookahead_step=0)
        self._base_optimizer = base_optimizer
        self.param_groups = base_optimizer.param_groups
        self.defaults = base_optimizer.defaults
        self.defaults.update(defaults)
        self.state = collections.defaultdict(dict)
        for name, default in defaults.items():
            for group in self._base_optimizer.param_groups:
                group.setdefault(name, default)
        self._optimizer_step_pre_hooks = dict()
        self._optimizer_step_post_hooks = dict()

    @torch.no_grad()
    def update_slow(self, group):
        for fast_p in group["params"]:
            if fast_p.grad is None:
                continue
            param_state = self._base_optimizer.state[fast_p]
            if "lookahead_slow_buff" not in param_state:
                param_state["lookahead_slow_buff"] = torch.empty_like(fast_p)
                param_state["lookahead_slow_buff"].copy_(fast_p)
            slow = param_state["lookahead_slow_buff"]
            slow.add_(fast_p - slow, alpha=group["lookahead_alpha"])
            fast_p.copy_(slow)

    def step(self, closure=None):
        loss = self._base_optimizer.step(closure)
        for group in self._base_optimizer.param_groups:
            group["lookahead_step"] += 1
            if group["lookahead_step"] % group["lookahead_k"] == 0:
                self.update_slow(group)
        return loss

    def state_dict(self):
        return self._base_optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self._base_optimizer.load_state_dict(state_dict)
        self.param_groups = self._base_optimizer.param_groups


def case_timm_lookahead_keeps_its_slow_weights():
    """timm's Lookahead over this class (create_optimizer_v2's "lookahead_" prefix wraps it
    so): its slow weights are a key it adds to the base optimizer's state[p] and updates in
    place, so that key must hold the same tensor at every access, go into state_dict() and
    come back from load_state_dict, as torch.optim keeps any key. Against
    Lookahead(torch.optim.AdamW) with the same AdamW groups, 6 steps (k = 2) and a resume
    through torch.save / torch.load(weights_only=True) after the third: within 1e-6. Before,
    `KeyError: state key 'lookahead_slow_buff'` at the first sync. Keys of the other
    algorithm or of another optimizer are still refused."""
    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def loss(net, k):
        g = torch.Generator().manual_seed(k)
        return ((net(torch.randn(5, 8, generator=g)) - torch.randn(5, 4, generator=g)) ** 2
                ).mean()

    def make(net, ours):
        if ours:
            base = Muon([{"params": list(net.parameters()), "algo": "adamw"}], lr=1e-2,
                        weight_decay=0.01)
        else:
            base = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
        return Lookahead(base, alpha=0.5, k=2)

    nets = [mlp(), mlp()]
    opts = [make(nets[0], False), make(nets[1], True)]
    saved = []
    for k in range(6):
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            loss(net, k).backward()
            opt.step()
        if k == 2:
            saved = [(io_roundtrip(net.state_dict()), io_roundtrip(opt.state_dict()))
                     for net, opt in zip(nets, opts)]
    slow = opts[1]._base_optimizer.state[nets[1][0].weight]["lookahead_slow_buff"]
    assert slow is opts[1]._base_optimizer.state[nets[1][0].weight]["lookahead_slow_buff"]
    assert torch.equal(slow, nets[1][0].weight.detach())  # k = 2: synced at step 6
    worst = max(relative(b.detach(), a.detach())
                for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    assert worst < 1e-6, worst
    # resumed after the third step into objects made anew: the slow weights come back
    again = [mlp(), mlp()]
    ropts = [make(again[0], False), make(again[1], True)]
    for net, opt, (msd, osd) in zip(again, ropts, saved):
        net.load_state_dict(msd)
        opt.load_state_dict(osd)
    assert "lookahead_slow_buff" in osd["state"][0]
    for k in range(3, 6):
        for net, opt in zip(again, ropts):
            opt.zero_grad()
            loss(net, k).backward()
            opt.step()
    resumed = max(relative(b.detach(), a.detach())
                  for a, b in zip(nets[1].parameters(), again[1].parameters()))
    assert resumed == 0.0, resumed
    print(f"  timm Lookahead: {worst:.2e} from Lookahead(torch.optim.AdamW); resumed: "
          f"{resumed:.1e}")
    ours = nets[1][0].bias
    st = opts[1]._base_optimizer.state
    refused(lambda: st[ours].__setitem__("momentum_buffer", torch.zeros(16)), KeyError,
            "'momentum_buffer'", "exp_avg")
    refused(lambda: st[ours].__setitem__("mu_product", torch.ones(())), KeyError,
            "'mu_product'")
    del st[ours]["lookahead_slow_buff"]
    assert "lookahead_slow_buff" not in st[ours]
    opts[1]._base_optimizer.close()
    ropts[1]._base_optimizer.close()


def case_null_hyperparameters_named():
    """A config file's null (Hydra / YAML `lr: null`, a sweep that left a value unset) handed
    to the class: torch.optim refuses it at construction, and so does this class, naming the
    keyword. Before, `lr=None` (or a group's) reached float() ("float() argument must be a
    string or a real number, not 'NoneType'", naming nothing), and `weight_decay=None` or
    `momentum=None` the library's config key (`config weight_decay (config_set) = 'None'`)."""
    m = model()
    for kw, words in (({"lr": None}, ("lr = None", "finite number")),
                      ({"weight_decay": None}, ("weight_decay = None",)),
                      ({"momentum": None}, ("momentum = None", "[0, 1)")),
                      ({"adamw_weight_decay": None}, ("adamw_weight_decay = None",))):
        refused(lambda: Muon(m.named_parameters(), model=m, **kw), ValueError, *words)
    refused(lambda: Muon([{"params": list(m.parameters()), "lr": None}], model=m), ValueError,
            "lr = None")
    opt = Muon(m.named_parameters(), model=m, adamw_lr=None)  # None: the group's lr, as before
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-3]
    opt.close()


def io_roundtrip(sd):
    """sd through torch.save and torch.load(weights_only=True), as a checkpoint is."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def case_state_dict_without_a_tensors_state_clears_it():
    """torch.optim saves no state for a tensor that never had a gradient (a layer frozen, an
    expert without tokens), and its load_state_dict replaces the whole state: loading such a
    checkpoint into an optimizer that has stepped (a rollback after a loss spike) leaves that
    tensor without state, to start afresh at its next step. Here against torch.optim.AdamW
    doing the same: within 1e-6 after two more steps. Before, the tensor kept this
    optimizer's moments and step count (3 here), silently."""
    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def loss(net, k):
        g = torch.Generator().manual_seed(k)
        return ((net(torch.randn(5, 8, generator=g)) - torch.randn(5, 4, generator=g)) ** 2
                ).mean()

    # the checkpoint: one step where the last bias had no gradient
    src = mlp()
    src_opt = torch.optim.AdamW(src.parameters(), lr=1e-2)
    loss(src, 0).backward()
    src[2].bias.grad = None
    src_opt.step()
    ckpt = src_opt.state_dict()
    assert sorted(ckpt["state"]) == [0, 1, 2]
    nets, opts = [mlp(), mlp()], []
    opts.append(torch.optim.AdamW(nets[0].parameters(), lr=1e-2))
    opts.append(Muon([{"params": list(nets[1].parameters()), "algo": "adamw"}], lr=1e-2,
                     weight_decay=0.01))
    for net, opt in zip(nets, opts):
        for k in range(3):
            opt.zero_grad()
            loss(net, k).backward()
            opt.step()
        net.load_state_dict(src.state_dict())
        opt.load_state_dict(ckpt)
    ours = nets[1][2].bias
    assert ours not in opts[1].state, dict(opts[1].state.get(ours) or {})
    assert opts[1].state_dict()["state"][3]["step"] == 0
    for k in range(3, 5):
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            loss(net, k).backward()
            opt.step()
    worst = max(relative(b.detach(), a.detach())
                for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    assert worst < 1e-6, worst
    print(f"  rollback into a stepped optimizer: {worst:.2e} from torch.optim.AdamW")
    # the same for a Muon tensor, with this class's own state dict less one entry
    m = model()
    opt = Muon(m.named_parameters(), lr=0.02, model=m)
    m(*batch(0)).backward()
    opt.step()
    sd = opt.state_dict()
    w = m.transformer.h[0][1].weight
    i = [j for j, p in enumerate(p for g in opt.param_groups for p in g["params"]) if p is w][0]
    del sd["state"][i]
    opt.zero_grad()
    m(*batch(1)).backward()
    opt.step()
    opt.load_state_dict(sd)
    assert w not in opt.state
    assert not bool(opt.state_dict()["state"][i]["momentum"].any())
    opt.close()
    opts[1].close()


if __name__ == "__main__":
    cases.run("test_torch_real3", dict(globals()))
