"""shardopt.torch.Muon in small training scripts as others write them (the third round after
test_torch_dropin.py and test_torch_scripts.py): each script is what its author would run with
torch.optim, the import swapped, compared with torch.optim where the two should agree. One
process.

    test_torch_real.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

import torch.optim._muon as _tm
from test_torch_dropin import refused, relative
from test_torch_optim import _fp32_newton_schulz

import shardopt
from shardopt.torch import Muon

torch.set_num_threads(1)
FP32 = {"ns_compute": "fp32", "comm_dtype": "fp32"}  # the library's Newton-Schulz in fp32


class Fp32TorchMuon:
    """torch.optim.Muon with its Newton-Schulz in fp32 (torch has no switch), for as long as
    the with block lasts."""

    def __enter__(self):
        self.saved = _tm._zeropower_via_newtonschulz
        _tm._zeropower_via_newtonschulz = _fp32_newton_schulz

    def __exit__(self, *exc):
        _tm._zeropower_via_newtonschulz = self.saved


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def torch_pair(m, lr=0.02, adamw_lr=1e-3):
    """torch.optim.Muon for the matrices, torch.optim.AdamW for the rest: the pair a script
    swapped for shardopt.torch.Muon had."""
    return [torch.optim.Muon([p for p in m.parameters() if p.ndim == 2 and p.requires_grad],
                             lr=lr),
            torch.optim.AdamW([p for p in m.parameters() if p.ndim < 2 and p.requires_grad],
                              lr=adamw_lr)]


def worst(a, b):
    return max(relative(p.detach().float(), q.detach().float())
               for p, q in zip(a.parameters(), b.parameters()))


# ---- a NaN in one tensor's gradient ----------------------------------------------------------

def case_nan_gradient_in_one_tensor():
    """A NaN (or inf) in one tensor's gradient, as a log(0) in one layer gives it, without a
    GradScaler: torch.optim writes NaN into that tensor and steps the others. The library's
    default (nonfinite = skip) skipped the step of that tensor's group only, each group being
    one runtime: every Muon matrix kept its values while the AdamW tensors stepped, and the
    script heard nothing but a line on stderr. Now step() raises shardopt.Error naming the
    tensor, nothing written in its group; where an earlier group had stepped the message says
    so. config={"nonfinite": "skip"} keeps the library's skip."""
    m = mlp()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=1e-3)
    assert [g["algo"] for g in opt.param_groups] == ["muon", "adamw"]
    m(torch.randn(5, 8)).sum().backward()
    m[0].weight.grad[0, 0] = float("nan")
    before = [p.detach().clone() for p in m.parameters()]
    refused(opt.step, shardopt.Error, "0.weight", "NaN/Inf gradients", "nothing was updated")
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    m[0].weight.grad[0, 0] = 0.0
    m[2].bias.grad[1] = float("inf")  # in the AdamW group, stepped after the Muon group
    refused(opt.step, shardopt.Error, "param group 1 (adamw)", "2.bias",
            "param group(s) 0 (muon) had already stepped")
    moved = [not torch.equal(a, p) for a, p in zip(before, m.parameters())]
    assert moved == [True, False, True, False], moved
    m[2].bias.grad[1] = 0.0
    opt.step()  # finite again: the run goes on
    opt.close()
    # the library's skip, asked for: that group is left as it was, the other steps
    m = mlp()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=1e-3, config={"nonfinite": "skip"})
    m(torch.randn(5, 8)).sum().backward()
    m[0].weight.grad[0, 0] = float("nan")
    before = [p.detach().clone() for p in m.parameters()]
    opt.step()
    moved = [not torch.equal(a, p) for a, p in zip(before, m.parameters())]
    assert moved == [False, True, False, True], moved
    assert opt.stats()[0]["last_step_skipped"] == 1
    opt.close()


# ---- Lightning 1.x moving the optimizer state ------------------------------------------------

def case_lightning_1x_state_move():
    """PyTorch Lightning 1.x's optimizer_to_device: opt.state[p] = apply_to_collection(v,
    Tensor, move_data_to_device, device), a new dict holding every key handed out, momentum
    and momentum_buffer. Written back key by key, momentum_buffer went through its scale
    1 / (1 - mu) after momentum was set: the momentum moved by an fp32 ulp, by a bf16 ulp
    (0.0078 here) with bf16 momentum, at every move. Values equal to those handed out are not
    written: the state is bit for bit as it was. A changed momentum_buffer still is."""
    for dtype in ("fp32", "bf16"):
        m = mlp()
        opt = Muon(m.named_parameters(), lr=0.02, config={"momentum_dtype": dtype})
        for k in range(2):
            m(torch.randn(3, 8, generator=torch.Generator().manual_seed(k))).sum().backward()
            opt.step()
            opt.zero_grad()
        before = opt.state_dict()["state"]
        for p, v in list(opt.state.items()):
            opt.state[p] = {k: t.to("cpu") if isinstance(t, torch.Tensor) else t
                            for k, t in v.items()}
        after = opt.state_dict()["state"]
        for i in before:
            for k in before[i]:
                assert torch.equal(before[i][k], after[i][k]), (dtype, i, k)
        w = m[0].weight
        opt.state[w] = {"momentum_buffer": torch.ones(16, 8)}  # a new value is written
        assert torch.allclose(opt.state[w]["momentum_buffer"].float(), torch.ones(16, 8),
                              rtol=1e-2), dtype
        opt.close()


# ---- Conv1d kernels ----------------------------------------------------------------------------

def case_conv1d_kernels_one_matrix():
    """A 1-D CNN (audio, Mamba's conv1d): its Conv1d kernels [out, in, k] are 3-D, which the
    binding registered as a stack of out [in, k] matrices (an expert stack), each orthogonalized
    on its own, where a Conv2d kernel is one [out, in kh kw] matrix as Muon scripts flatten
    it (torch.optim.Muon refuses anything but 2-D). With model= the kernels of nn.Conv1d
    modules are one [out, in k] matrix: within 1e-4 of torch.optim.Muon stepping the flattened
    kernel (fp32 Newton-Schulz on both sides); the state has the kernel's shape. Without
    model= a 3-D tensor stays a stack, with a warning that names it and says what to pass."""
    def net():
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv1d(4, 6, 3), nn.ReLU(), nn.Conv1d(6, 5, 3))

    x = torch.randn(2, 4, 10)
    m = net()
    w0 = [m[0].weight.detach().clone(), m[2].weight.detach().clone()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning with model=
        opt = Muon(m.named_parameters(), lr=0.02, config=FP32, model=m)
    m(x).sum().backward()
    grads = [m[0].weight.grad.clone(), m[2].weight.grad.clone()]
    opt.step()
    with Fp32TorchMuon():
        for w, g, p in zip(w0, grads, (m[0].weight, m[2].weight)):
            flat = nn.Parameter(w.reshape(len(w), -1).clone())
            flat.grad = g.reshape(len(g), -1)
            torch.optim.Muon([flat], lr=0.02).step()
            d = relative((p.detach() - w).reshape(len(w), -1),
                         flat.detach() - w.reshape(len(w), -1))
            assert d < 1e-4, f"Conv1d kernel {list(w.shape)} against the flattened one: {d:.2e}"
    assert [tuple(s["momentum"].shape) for s in opt.state_dict()["state"].values()
            if "momentum" in s] == [(6, 4, 3), (5, 6, 3)]
    opt.close()
    m = net()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Muon(m.named_parameters(), lr=0.02).close()
    said = [str(w.message) for w in caught if "stepped as 6 [4, 3] matrices" in str(w.message)]
    assert len(said) == 1 and "0.weight" in said[0] and "model=" in said[0], \
        [str(w.message) for w in caught]


# ---- what a script passes that the binding cannot take ---------------------------------------

def case_sparse_gradients_and_torch_groups_named():
    """nn.Embedding(sparse=True) gives sparse gradients, which torch.optim.AdamW refuses too:
    the step said "the torch tensor must be strided and contiguous", naming neither the layout
    nor the way out. A torch.distributed process group passed as comm= (a script written for
    torch.distributed) got mpi4py's "expecting an MPI instance", naming no argument."""
    emb = nn.Embedding(10, 4, sparse=True)
    opt = Muon(emb.named_parameters(), lr=0.02)
    emb(torch.tensor([1, 2])).sum().backward()
    refused(opt.step, ValueError, "weight.grad", "sparse", "sparse=False")
    opt.close()
    try:
        import mpi4py  # noqa: F401 - comm= needs it
    except ImportError:
        return
    refused(lambda: Muon(nn.Linear(4, 4).named_parameters(), comm=object()), TypeError,
            "comm = builtins.object", "mpi4py communicator", "process group")


# ---- scripts that agree with torch.optim ---------------------------------------------------

def case_lora_adapters_against_torch_muon():
    """peft-style LoRA: the base Linear frozen (requires_grad_(False) before the optimizer is
    made), lora_A random and lora_B zeros (its first Muon input is a zero gradient for A):
    4 steps within 1e-5 of torch.optim.Muon (fp32 Newton-Schulz on both sides), the frozen
    base untouched."""
    class LoRA(nn.Module):
        def __init__(self, d=16, r=4):
            super().__init__()
            self.base = nn.Linear(d, d)
            self.base.requires_grad_(False)
            self.lora_A = nn.Parameter(torch.randn(r, d) / d ** 0.5)
            self.lora_B = nn.Parameter(torch.zeros(d, r))

        def forward(self, x):
            return self.base(x) + x @ self.lora_A.T @ self.lora_B.T

    torch.manual_seed(1)
    a, b = LoRA(), LoRA()
    b.load_state_dict(a.state_dict())
    base = a.base.weight.detach().clone()
    opt = Muon(a.named_parameters(), lr=0.02, config=FP32)
    with Fp32TorchMuon():
        ref = torch.optim.Muon([b.lora_A, b.lora_B], lr=0.02)
        for k in range(4):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(k))
            for m, o in ((a, opt), (b, ref)):
                m(x).pow(2).mean().backward()
                o.step()
                o.zero_grad()
    d = worst(a, b)
    assert d < 1e-5, f"LoRA against torch.optim.Muon: {d:.2e}"
    assert torch.equal(a.base.weight, base)
    opt.close()


def case_megatron_flat_buffers():
    """Megatron's layout by hand: every parameter a view into one flat parameter buffer, its
    gradient (main_grad) a view into one flat gradient buffer assigned to .grad before each
    step, the buffer refilled in place: 3 steps within 1e-5 of torch.optim.Muon + AdamW on
    copies, and the parameters still views of their buffer (updated in place)."""
    shapes = [(16, 8), (8, 16), (16,)]
    n = sum(torch.Size(s).numel() for s in shapes)
    torch.manual_seed(2)
    pbuf, gbuf = torch.randn(n), torch.zeros(n)
    ps, gs, off = [], [], 0
    for s in shapes:
        k = torch.Size(s).numel()
        ps.append(nn.Parameter(pbuf[off:off + k].view(s)))
        gs.append(gbuf[off:off + k].view(s))
        off += k
    refs = [nn.Parameter(p.detach().clone()) for p in ps]
    opt = Muon([("l.w1", ps[0]), ("l.w2", ps[1]), ("l.b", ps[2])], lr=0.02, adamw_lr=1e-3,
               config=FP32)
    with Fp32TorchMuon():
        ref = [torch.optim.Muon(refs[:2], lr=0.02), torch.optim.AdamW(refs[2:], lr=1e-3)]
        for k in range(3):
            gbuf.copy_(torch.randn(n, generator=torch.Generator().manual_seed(k)))
            for p, g, r in zip(ps, gs, refs):
                p.grad, r.grad = g, g.clone()
            opt.step()
            for o in ref:
                o.step()
    d = max(relative(p.detach(), r.detach()) for p, r in zip(ps, refs))
    assert d < 1e-5, f"flat buffers against torch.optim: {d:.2e}"
    assert ps[0].data_ptr() == pbuf.data_ptr() and torch.equal(pbuf[:128], ps[0].reshape(-1))
    opt.close()


def case_freeze_mid_training_gradients_kept():
    """A layer frozen mid-run with requires_grad_(False) while the script zeroes gradients
    with zero_grad(set_to_none=False): the frozen layer keeps a zero .grad, which torch.optim
    steps (momentum and weight decay go on); so does this class: 4 steps within 1e-5 of
    torch.optim.Muon + AdamW."""
    a, b = mlp(4), mlp(4)
    opt = Muon(a.named_parameters(), lr=0.02, adamw_lr=1e-3, config=FP32)
    with Fp32TorchMuon():
        ref = torch_pair(b)
        for k in range(4):
            if k == 2:
                a[0].requires_grad_(False)
                b[0].requires_grad_(False)
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(k))
            for m, os_ in ((a, [opt]), (b, ref)):
                m(x).sum().backward()
                for o in os_:
                    o.step()
                    o.zero_grad(set_to_none=False)
    d = worst(a, b)
    assert d < 1e-5, f"frozen mid-run against torch.optim: {d:.2e}"
    opt.close()


def case_dataloader_workers_fork():
    """A DataLoader with num_workers=2 forks its workers after the optimizer was made (MPI
    initialised through the library on MPI_COMM_SELF): two epochs run, the loss goes down, no
    worker hangs or dies."""
    from torch.utils.data import DataLoader, TensorDataset
    m = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=1e-3)
    g = torch.Generator().manual_seed(5)
    ds = TensorDataset(torch.randn(128, 8, generator=g), torch.randn(128, 1, generator=g))
    losses = []
    for epoch in range(2):
        total = 0.0
        for x, y in DataLoader(ds, batch_size=32, num_workers=2, generator=g, shuffle=True):
            loss = nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            total += loss.item()
        losses.append(total)
    assert losses[1] < losses[0], losses
    opt.close()


def case_numpy_scalar_hyperparameters():
    """Hyperparameters read from a numpy array (a sweep's np.geomspace(..., dtype=np.float32),
    an np.load'ed config): torch.optim takes np.float32 lr and weight_decay; they were refused
    as "a finite number >= 0". Taken now, with the bits of the same values as Python floats."""
    import numpy as np
    runs = []
    for conv in (float, np.float32):
        m = mlp(6)
        opt = Muon(m.named_parameters(), lr=conv(0.015625), weight_decay=conv(0.125),
                   adamw_lr=conv(0.0009765625))
        for k in range(3):
            m(torch.full((2, 8), float(k))).sum().backward()
            opt.step()
            opt.zero_grad()
        runs.append([p.detach().clone() for p in m.parameters()])
        opt.close()
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    refused(lambda: Muon(mlp().named_parameters(), lr=np.float32(-1)), ValueError, "lr = -1.0")


def case_zero_redundancy_optimizer():
    """torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=Muon) on one gloo rank,
    as a DDP script that shards AdamW's state with it would swap the class: with the Muon and
    AdamW tensors in groups of their own ("algo"), it steps, and LinearLR's lrs reach the inner
    optimizer's groups (ZeRO copies its groups' keys into them by position at each step). A
    group holding both kinds is split by this class: refused by name (test_torch_real6)."""
    import os
    import tempfile
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    tmp = tempfile.mkdtemp(prefix="shardopt_zero_")
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0,
                            world_size=1)
    try:
        m = mlp(7)
        groups = [{"params": [p for p in m.parameters() if p.ndim == 2], "algo": "muon"},
                  {"params": [p for p in m.parameters() if p.ndim < 2], "algo": "adamw"}]
        z = ZeroRedundancyOptimizer(groups, optimizer_class=Muon, lr=0.02)
        sched = torch.optim.lr_scheduler.LinearLR(z, 0.5, 1.0, total_iters=4)
        before = [p.detach().clone() for p in m.parameters()]
        for k in range(2):
            m(torch.randn(2, 8)).sum().backward()
            z.step()
            sched.step()
            z.zero_grad()
        assert all(not torch.equal(a, p) for a, p in zip(before, m.parameters()))
        lrs = [g["lr"] for g in z.optim.param_groups]  # LinearLR's second factor, 0.625
        assert len(lrs) == 2 and all(abs(lr - 0.0125) < 1e-12 for lr in lrs), lrs
        z.optim.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            refused(lambda: ZeroRedundancyOptimizer(mlp().parameters(), optimizer_class=Muon),
                    ValueError, "ZeroRedundancyOptimizer", "'algo': 'adamw'")
    finally:
        dist.destroy_process_group()


def case_ported_conv1d_kernels():
    """Moonlight's Muon flattens every tensor of more than 2 dims to [out, rest]
    (g.view(g.size(0), -1)), and so does dion's with flatten=True. Ported, a Conv1d kernel
    [out, in, k] was a stack of [in, k] matrices: under Moonlight's spelling silently, under
    dion's flatten=True refused with a message pointing to expert=. Now one matrix in both: the
    bits of the same kernel given as an [out, in k] parameter. dion's flatten=False (its
    default) keeps the batch of matrices, as dion steps it."""
    w = torch.randn(6, 4, 3, generator=torch.Generator().manual_seed(8))
    grads = [torch.randn(6, 4, 3, generator=torch.Generator().manual_seed(9 + k))
             for k in range(2)]
    spellings = (lambda p: Muon(muon_params=[("conv.weight", p)], lr=0.02, wd=0.1),
                 lambda p: Muon([dict(params=[("conv.weight", p)], algorithm="muon")],
                                lr=0.02, flatten=True))
    for make in spellings:
        runs = []
        for shape in ((6, 4, 3), (6, 12)):
            p = nn.Parameter(w.reshape(shape).clone())
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no stack warning under these spellings
                opt = make(p)
            for g in grads:
                p.grad = g.reshape(shape).clone()
                opt.step()
            runs.append(p.detach().reshape(6, 12).clone())
            opt.close()
        assert torch.equal(*runs), relative(*runs)
    p = nn.Parameter(w.clone())
    opt = Muon([dict(params=[("conv.weight", p)], algorithm="muon")], lr=0.02)
    p.grad = grads[0].clone()
    opt.step()
    q = nn.Parameter(w[0].clone())  # flatten=False: slice 0 is a matrix of its own
    ref = Muon([dict(params=[("s", q)], algorithm="muon")], lr=0.02)
    q.grad = grads[0][0].clone()
    ref.step()
    assert torch.equal(p.detach()[0], q.detach())
    opt.close()
    ref.close()


def case_state_get_as_torch_defaultdict():
    """A logger or a resume check written against torch.optim's state, a defaultdict:
    opt.state.get(p) is None until p has stepped (and for a tensor the optimizer does not
    hold), and get() inserts nothing, so len(opt.state) == 0 says "no step taken yet". get()
    went through __getitem__: an empty state instead of None, and an entry made for a foreign
    key (len(opt.state) was 1 before any step). As torch.optim.AdamW, with a parameter whose
    gradient is None at the first step."""
    got = []
    for make in (lambda m: torch.optim.AdamW(m.parameters()),
                 lambda m: Muon(m.named_parameters())):
        m = mlp(9)
        opt = make(m)
        other = torch.zeros(3)
        row = [opt.state.get(m[0].weight), opt.state.get(other), len(opt.state),
               opt.state.get(other, "default")]
        m(torch.ones(1, 8)).sum().backward()
        m[2].weight.grad = None
        opt.step()
        st = opt.state.get(m[0].weight)
        row += [opt.state.get(m[2].weight), len(opt.state), st is not None and "step" in st,
                len(list(opt.state))]
        got.append(row)
    assert got[0] == got[1], got


def case_vit_tokens_against_torch():
    """A timm-style ViT: a patch-embedding Conv2d, [1, 1, d] cls_token, [1, n, d] pos_embed,
    a [1, 0, d] reg_token (no register tokens configured), blocks, a head. The torch script
    gives torch.optim.Muon the blocks' 2-D weights and AdamW the rest (torch.optim.Muon refuses
    3-D). Ported with model.named_parameters(): the construction raised on the empty reg_token
    (the library refuses a dim of 0, where torch.optim steps nothing), and the cls_token went to
    Muon as a [1, d] matrix (its update its direction alone), with a warning calling it a stack.
    Now the empty tensor is kept unregistered, a tensor with at most one dim over 1 goes to
    AdamW, and 3 steps are within 1e-5 of the torch pair (fp32 Newton-Schulz)."""
    class ViT(nn.Module):
        def __init__(self, d=16, reg=0):
            super().__init__()
            self.patch_embed = nn.Conv2d(3, d, 4, stride=4)
            self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
            self.reg_token = nn.Parameter(torch.zeros(1, reg, d))
            self.pos_embed = nn.Parameter(torch.randn(1, 5, d) * 0.02)
            self.blocks = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(),
                                        nn.Linear(2 * d, d))
            self.head = nn.Linear(d, 3)

        def forward(self, x):
            t = self.patch_embed(x).flatten(2).transpose(1, 2)
            b = t.shape[0]
            t = torch.cat([self.cls_token.expand(b, -1, -1), t], 1) + self.pos_embed
            t = torch.cat([t[:, :1], self.reg_token.expand(b, -1, -1), t[:, 1:]], 1)
            return self.head(t + self.blocks(t))[:, 0]

    torch.manual_seed(10)
    a, b = ViT(), ViT()
    b.load_state_dict(a.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = Muon(a.named_parameters(), lr=0.02, adamw_lr=1e-3, model=a, config=FP32)
    muon = [n for n, p in a.named_parameters() if opt.algo(p) == "muon"]
    assert muon == ["blocks.1.weight", "blocks.3.weight"], muon
    with Fp32TorchMuon():
        ref = [torch.optim.Muon([b.blocks[1].weight, b.blocks[3].weight], lr=0.02),
               torch.optim.AdamW([p for n, p in b.named_parameters()
                                  if n not in ("blocks.1.weight", "blocks.3.weight")], lr=1e-3)]
        for k in range(3):
            x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(k))
            for m, os_ in ((a, [opt]), (b, ref)):
                m(x).pow(2).mean().backward()
                for o in os_:
                    o.step()
                    o.zero_grad()
    d = worst(a, b)
    assert d < 1e-5, f"ViT against torch.optim: {d:.2e}"
    opt.close()


def case_zero_eps_and_ns_steps_named():
    """eps=0 (torch.optim.Muon and AdamW take it) and ns_steps=0 are outside what the library
    takes; the refusal named the library's config keys (config ns_eps (config_set) = '0.0'),
    not the keyword the script gave. Now a ValueError naming the group, the key and the
    value, before any runtime is made."""
    for kw, words in (({"eps": 0.0}, ("param group 0 (muon)", "eps = 0.0", "(0, 1]")),
                      ({"ns_steps": 0}, ("param group 0 (muon)", "ns_steps = 0", "1 to 16")),
                      ({"adamw_eps": 0.0}, ("param group 1 (adamw)", "eps = 0.0", "(0, 1]")),
                      # the kernels' fp32 holds no smaller eps: 0/0 on a zero gradient
                      ({"eps": 1e-40}, ("param group 0 (muon)", "eps = 1e-40",
                                        "at least 1.1754943508222875e-38"))):
        refused(lambda: Muon(mlp().named_parameters(), **kw), ValueError, *words)
    refused(lambda: Muon([{"params": [nn.Parameter(torch.randn(4, 4))], "algo": "muon",
                           "eps": -1e-8}]), ValueError, "eps = -1e-08")


if __name__ == "__main__":
    cases.run("test_torch_real", globals())
