"""shardopt.torch.Muon in training scripts as others write them, the sixth round (after
test_torch_real3.py): a checkpoint of this class resumed with torch.optim.Muon and back, and
DeepSpeed's per-parameter use_muon tags, prime-rl's dion Muon as it builds it now. Each
script is what its author would run, the import swapped, compared with the optimizer it was
written for. One process.

    test_torch_real4.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import io
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import batch, model, quiet, refused
from test_torch_ports import (QUINTIC, RefMuon, _TorchAdamW, against, init_one_rank_group,
                              rms_scale)
from test_torch_real import FP32, Fp32TorchMuon, worst

from shardopt.torch import Muon

torch.set_num_threads(1)


def mats(seed=0):
    """An MLP of matrices only: what torch.optim.Muon takes as one group."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=False))


def train(net, opt, steps, first=0):
    for k in range(first, first + steps):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(k))
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()


def saved(sd):
    """sd through torch.save / torch.load(weights_only=True), as a checkpoint goes."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=True)


def case_checkpoint_resumed_with_torch_muon_and_back():
    """A run with this class, its checkpoint resumed with torch.optim.Muon (a script switched
    back to compare, or a job moved to a machine without the library), and that run's
    checkpoint resumed with this class again. torch.optim.Muon's load takes the state dict as
    it is and starts a zero buffer wherever "momentum_buffer" is missing: before, the
    state dict held only "momentum" (the library's M), so torch went on with no momentum,
    silently (5.8e-2 from the uninterrupted run after 2 steps). Now state_dict() holds
    torch's "momentum_buffer" (M (1 - mu)) too: torch's buffer after the load is that tensor,
    and torch's 2 steps are within 1e-6 of this class's (6.1e-8 measured; both with fp32
    Newton-Schulz). Back
    here, the saved "momentum" is the one torch loaded, unchanged by its steps (torch keeps
    a key it does not know): before, it was loaded, the momentum of 2 steps ago (3.0e-2 from
    torch's run after 2 more steps); now a buffer
    that is not the one saved with it is taken (M = buffer / (1 - mu)), and the next 2 steps
    are within 1e-6 of torch.optim.Muon's (5.9e-8)."""
    with Fp32TorchMuon():
        a, b = mats(), mats()
        so = Muon(a.named_parameters(), lr=0.02, config=FP32)
        train(a, so, 3)
        sd = saved(so.state_dict())
        assert sorted(sd["state"][0]) == ["momentum", "momentum_buffer", "step"], sd["state"][0]
        b.load_state_dict(a.state_dict())
        tm = torch.optim.Muon(b.parameters(), lr=0.02)
        tm.load_state_dict(sd)
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.equal(tm.state[q]["momentum_buffer"], so.state[p]["momentum_buffer"])
        train(a, so, 2, 3)
        train(b, tm, 2, 3)
        there = worst(a, b)
        assert there < 1e-6, there
        # back: torch's checkpoint (its buffer stepped, the "momentum" it loaded stale)
        c = mats()
        c.load_state_dict(b.state_dict())
        back = Muon(c.named_parameters(), lr=0.02, config=FP32)
        back.load_state_dict(saved(tm.state_dict()))
        for p, q in zip(c.parameters(), b.parameters()):
            got, want = back.state[p]["momentum_buffer"], tm.state[q]["momentum_buffer"]
            assert (got - want).abs().max() <= 1e-6 * want.abs().max(), (got - want).abs().max()
        train(c, back, 2, 5)
        train(b, tm, 2, 5)
        again = worst(b, c)
        assert again < 1e-6, again
    print(f"  this class -> torch.optim.Muon {there:.1e}, -> this class {again:.1e}")
    # this class's own state dict, loaded here, takes "momentum" (exact): the same bits
    d, e = mats(), mats()
    o1 = Muon(d.named_parameters(), lr=0.02, momentum=0.9, config={"momentum_dtype": "bf16"})
    train(d, o1, 3)
    e.load_state_dict(d.state_dict())
    o2 = Muon(e.named_parameters(), lr=0.02, momentum=0.9, config={"momentum_dtype": "bf16"})
    o2.load_state_dict(saved(o1.state_dict()))
    for p, q in zip(d.parameters(), e.parameters()):
        assert torch.equal(o1.state[p]["momentum"], o2.state[q]["momentum"])
    train(d, o1, 2, 3)
    train(e, o2, 2, 3)
    assert all(torch.equal(p, q) for p, q in zip(d.parameters(), e.parameters()))
    for o in (so, back, o1, o2):
        o.close()


class MoEBlock(nn.Module):
    """A block with a router (a 2-D gate whose name no convention marks as AdamW's) and norms."""

    def __init__(self, d=8, experts=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.up = nn.Linear(d, 16)
        self.down = nn.Linear(16, d)

    def forward(self, x):
        h = self.norm(x)
        gate = self.router(h).softmax(-1)[..., :1]  # the first expert's weight
        return (x + gate * self.down(torch.relu(self.up(h)))).square().mean()


def case_deepspeed_use_muon_tags():
    """DeepSpeed's convention, kept by a script ported from it: each parameter tagged
    p.use_muon (True for the hidden matrices; False for the rest, here the router too, which
    the script keeps on Adam), and its decay / no-decay groups with a "name"
    ({"name": "decay", "params": ..., "weight_decay": 0.1}, biases and norms at 0). The tag
    decides each tensor's algorithm, the groups its lr and decay: within 1e-6 of
    torch.optim.Muon over the tagged matrices and torch.optim.AdamW over the rest, with
    those groups' decays, after 4 steps. Before, the tag was ignored: the router, 2-D, went to
    Muon by its shape (8.0e-2 from the reference; now 3.2e-7). A tag that is no bool, or one a group's
    algo contradicts, is refused naming the tensor."""
    def tagged(seed):
        torch.manual_seed(seed)
        m = MoEBlock()
        for n, p in m.named_parameters():
            p.use_muon = p.ndim >= 2 and "router" not in n
        return m

    def groups(m):
        decay = [p for n, p in m.named_parameters() if p.ndim >= 2]
        rest = [p for n, p in m.named_parameters() if p.ndim < 2]
        return [{"name": "decay", "params": decay, "weight_decay": 0.1},
                {"name": "no_decay", "params": rest, "weight_decay": 0.0}]

    a, b = tagged(0), tagged(0)
    with Fp32TorchMuon():
        so = quiet(Muon, groups(a), lr=0.02, adamw_lr=1e-3, config=FP32)
        got = [(g["name"], g["algo"], g["weight_decay"], len(g["params"]))
               for g in so.param_groups]
        assert got == [("decay", "muon", 0.1, 2), ("decay", "adamw", 0.1, 1),
                       ("no_decay", "adamw", 0.0, 4)], got
        mats = [p for p in b.parameters() if p.use_muon]
        ref = [torch.optim.Muon(mats, lr=0.02, weight_decay=0.1),
               torch.optim.AdamW([{"params": [b.router.weight], "weight_decay": 0.1},
                                  {"params": [p for p in b.parameters() if p.ndim < 2],
                                   "weight_decay": 0.0}], lr=1e-3)]
        for k in range(4):
            x = torch.randn(6, 8, generator=torch.Generator().manual_seed(k))
            for net, opts in ((a, [so]), (b, ref)):
                for o in opts:
                    o.zero_grad()
                net(x).backward()
                for o in opts:
                    o.step()
    w = worst(a, b)
    print(f"  DeepSpeed's use_muon tags: {w:.1e} from torch.optim.Muon + AdamW")
    assert w < 1e-6, w
    so.close()
    m = tagged(1)
    m.router.weight.use_muon = 1
    refused(lambda: Muon(m.named_parameters()), ValueError, "router.weight", "use_muon = 1",
            "True or False")
    m.router.weight.use_muon = False
    refused(lambda: Muon([{"params": [m.router.weight], "algo": "muon"}]), ValueError,
            "use_muon attribute is False", "'muon'", "disagree")


def case_eps_against_torch_muon():
    """torch.optim.Muon's eps clamps the norm (X / max(||X||, eps): nothing unless ||X|| < eps);
    the library adds it (X / (||X|| + eps)) to the norm of M, torch's buffer / (1 - mu): a
    relative eps / ||M|| always. The bounds docs/python.md gives (its table, row eps): at the
    default 1e-7 within 1e-6 of torch.optim.Muon after 4 steps, at 1e-5 within 1e-4 (measured
    1.8e-7 and 4.5e-6), both with fp32 Newton-Schulz and momentum 0.9."""
    got = {}
    for eps in (1e-7, 1e-5):
        a, b = mats(), mats()
        with Fp32TorchMuon():
            ref = torch.optim.Muon(a.parameters(), lr=0.02, momentum=0.9, eps=eps)
            so = Muon(b.named_parameters(), lr=0.02, momentum=0.9, eps=eps, config=FP32)
            train(a, ref, 4)
            train(b, so, 4)
        got[eps] = worst(a, b)
        so.close()
    print(f"  eps 1e-7: {got[1e-7]:.1e}, 1e-5: {got[1e-5]:.1e} from torch.optim.Muon")
    assert got[1e-7] < 1e-6 and got[1e-5] < 1e-4, got


def prime_rl_create_muon_optimizer(named_params, lr, weight_decay, mesh, opt_class, **extra):
    """prime-rl's _create_muon_optimizer as it builds dion's Muon now: the matrices to Muon in
    three groups (the others, the experts with distributed_mesh_name, the routers), the rest to
    AdamW, and world_mesh / fsdp_mesh_dim beside distributed_mesh. Here block 0's matrices
    stand for its experts (mlp.experts) and block 1's first for its router (mlp.router)."""
    def muon_enabled(n, p):
        return p.ndim >= 2 and "wte" not in n and "wpe" not in n
    muon, experts, routers, adamw = [], [], [], []
    for n, p in named_params:
        if p.requires_grad and muon_enabled(n, p):
            (experts if ".h.0." in n else routers if ".h.1.1." in n else muon).append(p)
        elif p.requires_grad:
            adamw.append(p)
    groups = [dict(params=muon, algorithm="muon", lr=lr, weight_decay=weight_decay,
                   adjust_lr="rms_norm"),
              dict(params=experts, algorithm="muon", lr=lr, weight_decay=weight_decay,
                   adjust_lr="rms_norm", distributed_mesh_name=None),
              dict(params=routers, algorithm="muon", lr=lr, weight_decay=weight_decay,
                   adjust_lr="rms_norm"),
              dict(params=adamw, algorithm="adamw", lr=lr, weight_decay=weight_decay)]
    return opt_class(params=groups, lr=lr, mu=0.95, betas=(0.9, 0.95),
                     weight_decay=weight_decay, adjust_lr="rms_norm", distributed_mesh=mesh,
                     world_mesh=mesh, fsdp_mesh_dim=0, **extra)


def case_dion_world_mesh_as_prime_rl_builds_it_now():
    """prime-rl's dion Muon as it builds it now: world_mesh= and fsdp_mesh_dim= beside
    distributed_mesh=, matrix_partitions= (None: no packed matrices), an experts group with
    "distributed_mesh_name", and its tests reading each group's "algorithm" and
    "distributed_mesh_name" back from param_groups. Before, `unexpected keyword argument
    'world_mesh'`; now the keywords are taken (the library reads each DTensor's own mesh and
    spans comm) and checked, each group keeps dion's keys, and the 4 steps are within 1e-5 of
    dion's arithmetic (fp32) and torch.optim.AdamW, and a state dict resumes bit for bit. A
    non-empty matrix_partitions (each packed matrix orthogonalized by parts, which the
    library does not do), a fsdp_mesh_dim outside world_mesh and a world_mesh that is no
    DeviceMesh are refused by name."""
    mesh = init_one_rank_group()
    m = model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = prime_rl_create_muon_optimizer(m.named_parameters(), 3e-3, 0.05, mesh, Muon,
                                             matrix_partitions=None, config=FP32)
    got = [(g["algorithm"], g["algo"], g.get("distributed_mesh_name", "-"), len(g["params"]))
           for g in opt.param_groups]
    assert got == [("muon", "muon", "-", 1), ("muon", "muon", None, 2), ("muon", "muon", "-", 1),
                   ("adamw", "adamw", "-", 12)], got
    refs = [(p, RefMuon(p, 0.95, False, QUINTIC, 1e-8, rms_scale))
            for g in opt.param_groups[:3] for p in g["params"]]
    refs += [(p, _TorchAdamW(nn.Parameter(p.detach().clone()), 3e-3, (0.9, 0.95), 1e-8, 0.05))
             for p in opt.param_groups[3]["params"]]
    w = against(m, opt, refs, 4, lambda p: (3e-3, 0.05))
    print(f"  dion port with world_mesh (prime-rl now): {w:.2e} from dion's arithmetic (fp32)")
    # a resume: the groups' dion keys back, the next steps the same bits
    m2 = model()
    m2.load_state_dict(m.state_dict())
    opt2 = prime_rl_create_muon_optimizer(m2.named_parameters(), 3e-3, 0.05, mesh, Muon,
                                          config=FP32)
    opt2.load_state_dict(saved(opt.state_dict()))
    assert [g["algorithm"] for g in opt2.param_groups] == ["muon"] * 3 + ["adamw"]
    assert all("_algorithm" not in g for g in opt2.param_groups)
    for net, o in ((m, opt), (m2, opt2)):
        o.zero_grad()
        net(*batch(7)).backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), m2.parameters()))
    opt.close()
    opt2.close()
    packed = dict(m.named_parameters())["transformer.h.1.1.weight"]
    refused(lambda: prime_rl_create_muon_optimizer(
        m.named_parameters(), 3e-3, 0.05, mesh, Muon, matrix_partitions={packed: [32, 32]}),
        ValueError, "matrix_partitions", "[64, 16]", "each partition")
    refused(lambda: Muon(m.parameters(), world_mesh=mesh, fsdp_mesh_dim=1), ValueError,
            "fsdp_mesh_dim = 1", "0 to 0")
    refused(lambda: Muon(m.parameters(), world_mesh=object()), TypeError, "world_mesh",
            "DeviceMesh")
    refused(lambda: Muon([dict(params=list(m.parameters()), algorithm="adamw",
                               distributed_mesh_name=3)]), ValueError,
            "distributed_mesh_name = 3")


def case_one_cycle_lr_against_torch_muon():
    """OneCycleLR over torch.optim.Muon's groups, 20 steps, as against torch.optim.Muon under
    the same schedule (fp32 Newton-Schulz both). Without cycle_momentum its lr schedule alone:
    within 1e-6 (1.6e-7 measured). With it (its default) the Muon groups' momentum swings
    between 0.95 and 0.85, where torch's buffer (a lerp, each gradient weighted by the
    (1 - mu) of its own step) and the library's M = mu M + g are no longer proportional: a
    nearby trajectory, 4.0e-2 measured, bound 1e-1 (docs/python.md, the table's momentum row;
    the library's step takes no per-step gradient factor that would make it torch's)."""
    got = {}
    for cycle in (False, True):
        a, b = mats(), mats()
        with Fp32TorchMuon():
            ref = torch.optim.Muon(a.parameters(), lr=0.02)
            so = Muon(b.named_parameters(), lr=0.02, config=FP32)
            scheds = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.02, total_steps=20,
                                                          cycle_momentum=cycle)
                      for o in (ref, so)]
            for k in range(20):
                x = torch.randn(5, 8, generator=torch.Generator().manual_seed(k))
                for net, o, sc in ((a, ref, scheds[0]), (b, so, scheds[1])):
                    o.zero_grad()
                    net(x).square().mean().backward()
                    o.step()
                    sc.step()
        got[cycle] = worst(a, b)
        so.close()
    print(f"  OneCycleLR: {got[False]:.1e} (lr only), {got[True]:.1e} (cycle_momentum)")
    assert got[False] < 1e-6 and got[True] < 1e-1, got


if __name__ == "__main__":
    cases.run("test_torch_real4", dict(globals()))
