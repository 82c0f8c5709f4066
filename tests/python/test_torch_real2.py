"""shardopt.torch.Muon in training scripts as others write them, the fourth round (after
test_torch_real.py): modded-nanogpt's per-parameter multipliers, torch.optim.AdamW's switches
set in a param group, and what the next probes found. Each script is what its author would run,
the import swapped, compared with the optimizer it was written for where the two should agree.
One process.

    test_torch_real2.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import refused, relative
from test_torch_real import FP32, Fp32TorchMuon

from shardopt.torch import Muon

torch.set_num_threads(1)


class ModdedGPT(nn.Module):
    """modded-nanogpt's parameters in miniature: an embedding and value embeddings, blocks whose
    attention holds a [3, h, d] qkv stack, an untied lm_head, a 1-D vector of scalars, and the
    per-parameter multipliers its optimizers read (param.lr_mul, param.wd_mul)."""

    def __init__(self, vocab=24, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.value_embeds = nn.ModuleList([nn.Embedding(vocab, d) for _ in range(2)])
        self.blocks = nn.ModuleList([nn.ModuleDict(dict(fc=nn.Linear(d, 2 * d, bias=False),
                                                        proj=nn.Linear(2 * d, d, bias=False)))
                                     for _ in range(2)])
        self.qkv_w = nn.Parameter(torch.randn(3, d, d) / d ** 0.5)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.scalars = nn.Parameter(torch.ones(4))
        # as modded-nanogpt's GPT.__init__ sets them
        for p in self.embed.parameters():
            p.lr_mul = 75.
        for p in self.value_embeds.parameters():
            p.lr_mul = 75.
        self.lm_head.weight.lr_mul = 27.5
        self.scalars.lr_mul = 5.0
        self.blocks[1].proj.weight.lr_mul = 2.0  # a Muon matrix of its own rate
        self.value_embeds[1].weight.wd_mul = 0.5

    def forward(self, idx, targets):
        x = self.embed(idx) + self.scalars[0] * self.value_embeds[0](idx)
        q, k, v = (x @ w.T for w in self.qkv_w)
        x = x + self.scalars[1] * torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        x = x + self.scalars[2] * self.value_embeds[1](idx)
        for b in self.blocks:
            x = x + b["proj"](torch.relu(b["fc"](x)))
        logits = self.lm_head(x * self.scalars[3])
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def tokens(k):
    g = torch.Generator().manual_seed(k)
    return torch.randint(0, 24, (3, 8), generator=g), torch.randint(0, 24, (3, 8), generator=g)


def case_modded_nanogpt_lr_mul():
    """modded-nanogpt sets `param.lr_mul = 75.` on its embeddings (27.5 on the lm_head, 5 on
    the scalars) and `wd_mul` on some, which its DistAdam and Muon read as an lr of
    lr · lr_mul and a decay of lr · lr_mul · wd · wd_mul. Its optimizers swapped for this
    class (the Adam groups with "algo": "adamw", the hidden matrices and the qkv stack to
    Muon), the run must be theirs: here against torch.optim.AdamW with each parameter in a
    group of lr · lr_mul and weight decay wd · wd_mul, and torch.optim.Muon (fp32 Newton-Schulz
    on both sides) with the matrix of lr_mul 2 in its own group, the qkv stack as three
    matrices, under modded-nanogpt's schedule (g["lr"] = g["initial_lr"] · frac). Before, the
    multipliers were ignored: the embeddings moved at 1/75 of their rate, silently."""
    torch.manual_seed(0)
    a = ModdedGPT()
    b = ModdedGPT()
    b.load_state_dict(a.state_dict())

    def split(m):
        hidden = [p for blk in m.blocks for p in blk.parameters()]
        adam = [dict(params=[m.lm_head.weight], lr=0.008),
                dict(params=[*m.embed.parameters(), *m.value_embeds.parameters()], lr=0.002),
                dict(params=[m.scalars], lr=0.004)]
        return hidden, adam

    hidden, adam = split(a)
    opt = Muon([*(dict(g, algo="adamw", betas=(0.8, 0.95), eps=1e-10, weight_decay=0.05)
                  for g in adam),
                dict(params=hidden + [a.qkv_w], algo="muon", lr=0.05, momentum=0.95,
                     weight_decay=0.0)], config=FP32)
    hidden_b, adam_b = split(b)
    per_param = [dict(params=[p], lr=g["lr"] * getattr(p, "lr_mul", 1.0),
                      weight_decay=0.05 * getattr(p, "wd_mul", 1.0))
                 for g in adam_b for p in g["params"]]
    ref_adam = torch.optim.AdamW(per_param, betas=(0.8, 0.95), eps=1e-10)
    fast = b.blocks[1].proj.weight
    ref_muon = torch.optim.Muon([dict(params=[p for p in hidden_b if p is not fast]),
                                 dict(params=[fast], lr=0.05 * 2.0)],
                                lr=0.05, momentum=0.95, weight_decay=0.0)
    stack = [nn.Parameter(b.qkv_w.detach()[i].clone()) for i in range(3)]
    ref_stack = torch.optim.Muon(stack, lr=0.05, momentum=0.95, weight_decay=0.0)
    opts = [[opt], [ref_adam, ref_muon, ref_stack]]
    for os_ in opts:
        for o in os_:
            for g in o.param_groups:
                g["initial_lr"] = g["lr"]
    with Fp32TorchMuon():
        for step in range(4):
            frac = 1 - step / 8
            for m, os_ in ((a, opts[0]), (b, opts[1])):
                for o in os_:
                    for g in o.param_groups:
                        g["lr"] = g["initial_lr"] * frac
                m(*tokens(step)).backward()
                if m is b:
                    for i in range(3):
                        stack[i].grad = b.qkv_w.grad[i].clone()
                    b.qkv_w.grad = None  # in no optimizer of b: stepped through stack
                for o in os_:
                    o.step()
                    o.zero_grad(set_to_none=True)
                if m is b:
                    with torch.no_grad():
                        b.qkv_w.copy_(torch.stack([s.detach() for s in stack]))
    d = max((relative(p.detach(), q.detach()), n)
            for (n, p), q in zip(a.named_parameters(), b.parameters()))
    print(f"  worst tensor {d[1]}: {d[0]:.2e}")
    assert d[0] < 1e-5, f"against modded-nanogpt's multipliers: {d[1]} {d[0]:.2e}"
    moved = relative(a.embed.weight.detach(), ModdedGPT().embed.weight.detach())
    assert moved > 0, "the embeddings did not move"
    # a multiplier the library cannot take is named, with the attribute
    m = ModdedGPT()
    m.scalars.lr_mul = -1.0
    refused(lambda: Muon(m.named_parameters(), model=m), ValueError, "scalars", "lr_mul = -1.0",
            "[0, 1e6)")
    opt.close()


def case_adamw_switches_in_groups():
    """torch.optim.AdamW reads maximize, amsgrad, capturable and differentiable from each
    group; the keywords were refused here, but a group that set one ({"params": ...,
    "maximize": True}, or g["maximize"] = True later) was taken and ignored: a maximised
    objective minimised, silently. Now a group that sets one is refused at construction and
    add_param_group, naming the group and the key; an AdamW group holds them as False, as
    torch.optim.AdamW's groups do (scripts read g["amsgrad"]), and one set True later is
    refused at step(), nothing stepped; set back to False, the step goes on."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    for k in ("maximize", "amsgrad", "capturable", "differentiable"):
        refused(lambda: Muon([{"params": list(m.parameters()), k: True}]), ValueError,
                "param group 0 (muon)", f"{k} = True", "not supported")
        refused(lambda: Muon([{"params": [m[0].bias], k: True}]), ValueError,
                "param group 0 (adamw)", f"{k} = True")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = Muon([{"params": [m[0].weight, m[2].weight], "algo": "muon"},
                    {"params": [m[0].bias], "algo": "adamw", "maximize": False}])
        refused(lambda: opt.add_param_group({"params": [m[2].bias], "amsgrad": True}),
                ValueError, "param group 2 (adamw)", "amsgrad = True")
        opt.add_param_group({"params": [m[2].bias]})
    ref = torch.optim.AdamW([m[0].bias])
    adamw = [g for g in opt.param_groups if g["algo"] == "adamw"]
    assert all(g[k] is False for g in adamw
               for k in ("maximize", "amsgrad", "capturable", "differentiable")), adamw
    assert set(ref.param_groups[0]) - set(adamw[0]) <= {"foreach", "fused",
                                                          "decoupled_weight_decay"}
    m(torch.randn(5, 4)).sum().backward()
    opt.step()
    adamw[0]["maximize"] = True
    before = [p.detach().clone() for p in m.parameters()]
    refused(opt.step, ValueError, "param group 1 (adamw)", "maximize = True", "not supported")
    assert all(torch.equal(x, p) for x, p in zip(before, m.parameters())), "something stepped"
    adamw[0]["maximize"] = False
    opt.step()
    assert not torch.equal(before[1], m[0].bias)
    # torch.optim.AdamW's state dict with one of them True: refused naming it, nothing loaded
    # (capturable / differentiable were refused as a key 'fixed when the optimizer is made')
    for k in ("capturable", "differentiable", "amsgrad"):
        sd = opt.state_dict()
        sd["param_groups"][1][k] = True
        refused(lambda: opt.load_state_dict(sd), ValueError, "param group 1", f"{k} = True",
                f"has no {k}")
    opt.close()


def case_add_param_group_refused_leaves_no_trace():
    """Progressive unfreezing adds a layer with add_param_group; a refused group (here its AdamW
    part's adamw_eps = 0, after its Muon part's runtime was made) must leave the optimizer as
    torch.optim leaves it: the groups it had, its tensors not held. Before, each part was
    appended before its checks, so the refused part stayed in param_groups with no runtime,
    the Muon part's tensors counted as held (the corrected group refused as 'already in this
    optimizer'), and the next step failed on the half-made group. Now the corrected group is
    taken, and the run is that of an optimizer given it right the first time."""
    runs = []
    for first_try_bad in (True, False):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        m[2].requires_grad_(False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt = Muon([p for p in m.parameters() if p.requires_grad], lr=0.02, model=m)
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
            m(x).sum().backward()
            opt.step()
            opt.zero_grad()
            m[2].requires_grad_(True)
            groups = [dict(g) for g in opt.param_groups]
            if first_try_bad:
                refused(lambda: opt.add_param_group({"params": list(m[2].parameters()),
                                                     "adamw_eps": 0.0}), ValueError,
                        "param group 3 (adamw)", "eps = 0.0")
                assert len(opt.param_groups) == 2 and all(
                    a["params"] == b["params"] for a, b in zip(groups, opt.param_groups))
            # the optimizer as it was steps, the layer not yet in it left alone
            w2 = m[2].weight.detach().clone()
            m(x).sum().backward()
            opt.step()
            opt.zero_grad()
            assert torch.equal(w2, m[2].weight)
            opt.add_param_group({"params": list(m[2].parameters()), "lr": 0.01})
        assert [g["algo"] for g in opt.param_groups] == ["muon", "adamw", "muon", "adamw"]
        for k in range(2):
            m(torch.randn(5, 4, generator=torch.Generator().manual_seed(2 + k))).sum().backward()
            opt.step()
            opt.zero_grad()
        runs.append([p.detach().clone() for p in m.parameters()])
        opt.close()
    assert all(torch.equal(a, b) for a, b in zip(*runs)), "not the run of a group given right"


def case_modded_nanogpt_rank_world_size():
    """modded-nanogpt's records of late 2024 and early 2025 build their Muon as
    `Muon(hidden_matrix_params, lr=0.05, momentum=0.95, rank=rank, world_size=world_size)`:
    rank and world_size split its Newton-Schulz work over the torch.distributed ranks, and its
    Muon has no weight decay. The import swapped, the call was refused (`unexpected keyword
    argument 'rank'`), and with the two keywords deleted by hand the matrices took
    torch.optim.Muon's default weight decay of 0.1, silently. Now rank / world_size are taken
    (every rank's runtime computes every matrix's update, the result the split gives) and the
    keys the call leaves out take that Muon's defaults (lr 0.02, weight decay 0): against
    torch.optim.Muon with weight_decay=0 (its arithmetic otherwise, fp32 Newton-Schulz on both
    sides) under modded-nanogpt's lr schedule. A rank outside world_size is refused by name."""
    torch.manual_seed(0)
    a = ModdedGPT()
    b = ModdedGPT()
    b.load_state_dict(a.state_dict())
    hidden = [[p for n, p in m.blocks.named_parameters() if p.ndim >= 2] for m in (a, b)]
    for m in (a, b):
        m.requires_grad_(False)
        del m.blocks[1].proj.weight.lr_mul  # multipliers came with later records
    for hs in hidden:
        for p in hs:
            p.requires_grad_(True)
    opt = Muon(hidden[0], lr=0.05, momentum=0.95, rank=0, world_size=1, config=FP32)
    assert opt.param_groups[0]["weight_decay"] == 0.0
    ref = torch.optim.Muon(hidden[1], lr=0.05, momentum=0.95, weight_decay=0.0)
    for o in (opt, ref):
        for g in o.param_groups:
            g["initial_lr"] = g["lr"]
    with Fp32TorchMuon():
        for step in range(4):
            for m, o in ((a, opt), (b, ref)):
                for g in o.param_groups:
                    g["lr"] = g["initial_lr"] * (1 - step / 8)
                m(*tokens(step)).backward()
                o.step()
                m.zero_grad(set_to_none=True)
    d = max(relative(p.detach(), q.detach()) for p, q in zip(hidden[0], hidden[1]))
    print(f"  worst matrix: {d:.2e}")
    assert d < 1e-5, f"against modded-nanogpt's Muon: {d:.2e}"
    assert Muon(hidden[0], rank=0, world_size=2).param_groups[0]["lr"] == 0.02
    refused(lambda: Muon(hidden[0], rank=2, world_size=2), ValueError, "rank = 2",
            "world_size = 2", "0 <= rank < world_size")
    opt.close()


def case_adamw_positional_betas_named():
    """torch.optim.AdamW(model.parameters(), 3e-4, (0.9, 0.95)) with the class swapped: the
    positional arguments are torch.optim.Muon's (params, lr, weight_decay, ...), so the betas
    land on weight_decay. The refusal said only `weight_decay = (0.9, 0.95): a finite number
    >= 0`; now it says why and the way out (betas= by name)."""
    m = nn.Linear(4, 4)
    for betas in ((0.9, 0.95), [0.9, 0.95]):
        refused(lambda: Muon(m.parameters(), 3e-4, betas), ValueError,
                f"weight_decay = {betas!r}", "AdamW's betas given by position",
                "betas=(b1, b2)")
    opt = Muon(m.parameters(), 3e-4, betas=(0.9, 0.95))  # by name: taken
    assert opt.param_groups[-1]["betas"] == (0.9, 0.95)
    opt.close()


def case_params_in_a_set_refused():
    """Parameters given as a set (`{"params": set(model.parameters())}`, or a set of a layer's
    tensors given to add_param_group): torch.optim refuses one in a group, since a set's order
    changes between runs; this class took it everywhere. Every rank registers its tensors in
    the order given, and a set's order is that of the tensors' hashes, which differ between
    processes: where names are made from the position (param.<i>), one name was another tensor
    on each rank. Now a set is refused with torch.optim's message, at construction (the whole
    params argument too, which torch.optim takes) and in add_param_group."""
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    words = ("ordered collections", "between ranks", "use a list")
    refused(lambda: Muon(set(m.parameters())), TypeError, "params:", *words)
    refused(lambda: Muon([{"params": set(m.parameters())}]), TypeError, "'params'", *words)
    refused(lambda: Muon(muon_params=set(m.parameters())), TypeError, "muon_params", *words)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = Muon([m[0].weight, m[0].bias])
    n = len(opt.param_groups)
    refused(lambda: opt.add_param_group({"params": set(m[1].parameters())}), TypeError, *words)
    assert len(opt.param_groups) == n
    opt.add_param_group({"params": list(m[1].parameters())})  # as a list: taken
    opt.close()


if __name__ == "__main__":
    cases.run("test_torch_real2", globals())
