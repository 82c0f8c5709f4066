"""shardopt.torch.Muon in training scripts as others write them, the tenth round (after
test_torch_real6.py): torchtitan's OptimizersContainer (one optimizer per pipeline stage, built
with AdamW's keywords, schedulers per optimizer, a step pre-hook for MoE load balancing, its
flattened state dicts merged across stages), torch.distributed.checkpoint's full_state_dict /
cpu_offload / broadcast_from_rank0 options, ReLoRA's in-place edits of opt.state, and steps
taken inside an autocast region. Each script is what its author would run, the import
swapped, compared with the optimizer it was written for. One process.

    test_torch_real7.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import functools
import io
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import refused
from test_torch_ports import init_one_rank_group
from test_torch_real import FP32, Fp32TorchMuon, mlp, torch_pair, worst

from shardopt.torch import Muon

torch.set_num_threads(1)


def x_of(k):
    return torch.randn(32, 8, generator=torch.Generator().manual_seed(k))


def train(nets_opts, steps, first=0, after=None):
    """Each (net, [optimizers]) stepped on the same batches, after(k) once per step."""
    for k in range(first, first + steps):
        for net, opts in nets_opts:
            net(x_of(k)).square().mean().backward()
            for o in opts:
                o.step()
                o.zero_grad()
        if after is not None:
            after(k)


# ---- torchtitan ---------------------------------------------------------------------------

def torchtitan_kwargs(eps):
    """torchtitan's build_optimizers for "AdamW", implementation "foreach": the keywords it
    hands whatever optimizer class it is given."""
    return {"lr": 0.02, "betas": (0.9, 0.95), "eps": eps, "weight_decay": 0.1,
            "fused": False, "foreach": True}


def case_adamw_keywords_eps_reaches_the_adamw_tensors():
    """torchtitan's build_optimizers (and any AdamW trainer with the class swapped) passes
    lr, betas, eps, weight_decay, fused, foreach. betas= was taken as the AdamW tensors'
    (adamw_betas), but eps= went to the Muon norm: the AdamW tensors kept eps 1e-8, silently.
    An eps= beside betas= is now theirs (adamw_eps), the Muon norm keeping torch.optim.Muon's
    1e-7; adamw_eps= given still wins, and eps= without betas= is still the Muon norm's.
    Against torch.optim.Muon + AdamW(betas=, eps=) on the same tensors, fp32 Newton-Schulz:
    within 1e-6 after 5 steps (before, the AdamW group's eps was 1e-8 and the Muon group's
    1e-3)."""
    eps = 1e-3  # large enough that an AdamW step with 1e-8 is far from one with it
    a, b = mlp(), mlp()
    opt = Muon(a.named_parameters(), config=FP32, **torchtitan_kwargs(eps))
    assert [(g["algo"], g["eps"]) for g in opt.param_groups] == [("muon", 1e-7),
                                                                  ("adamw", eps)]
    ref = [torch.optim.Muon([p for p in b.parameters() if p.ndim == 2], lr=0.02,
                            weight_decay=0.1),
           torch.optim.AdamW([p for p in b.parameters() if p.ndim < 2], lr=0.02,
                             betas=(0.9, 0.95), eps=eps, weight_decay=0.1)]
    with Fp32TorchMuon():
        train([(a, [opt]), (b, ref)], 5)
    print(f"  eps {eps} from AdamW's keywords: {worst(a, b):.1e} from torch")
    assert worst(a, b) < 1e-6, worst(a, b)
    opt.close()
    m = mlp()
    for kw, want in ((dict(torchtitan_kwargs(1e-6), adamw_eps=1e-10), [1e-6, 1e-10]),
                     (dict(lr=0.02, eps=1e-6), [1e-6, 1e-8])):
        opt = Muon(m.named_parameters(), **kw)
        assert [g["eps"] for g in opt.param_groups] == want, (kw, want)
        opt.close()


class OptimizersContainer(torch.optim.Optimizer):
    """torchtitan's OptimizersContainer (torchtitan/components/optimizer.py) in miniature: one
    optimizer per model part over [p for p in part.parameters() if p.requires_grad], then
    Optimizer.__init__ on all of them for the hooks; step / zero_grad call each; state_dict
    merges each part's get_optimizer_state_dict(flatten_optimizer_state_dict=True), and
    load_state_dict hands the merged dict to set_optimizer_state_dict for each part."""

    def __init__(self, model_parts, optimizer_cls, optimizer_kwargs):
        import torch.distributed.checkpoint.state_dict as dsd
        self._dsd = dsd
        all_params, self.optimizers, self.model_parts = [], [], model_parts
        for model in model_parts:
            params = [p for p in model.parameters() if p.requires_grad]
            self.optimizers.append(optimizer_cls(params, **optimizer_kwargs))
            all_params.extend(params)
        torch.optim.Optimizer.__init__(self, all_params, optimizer_kwargs)

    def __iter__(self):
        return iter(self.optimizers)

    def step(self, *args, **kwargs):
        for o in self.optimizers:
            o.step(*args, **kwargs)

    def zero_grad(self, *args, **kwargs):
        for o in self.optimizers:
            o.zero_grad(*args, **kwargs)

    def state_dict(self):
        f = functools.partial(self._dsd.get_optimizer_state_dict, options=self._dsd.
                              StateDictOptions(flatten_optimizer_state_dict=True))
        return {k: v for sd in map(f, self.model_parts, self.optimizers) for k, v in sd.items()}

    def load_state_dict(self, state_dict):
        f = functools.partial(self._dsd.set_optimizer_state_dict, optim_state_dict=state_dict,
                              options=self._dsd.StateDictOptions(
                                  flatten_optimizer_state_dict=True))
        list(map(f, self.model_parts, self.optimizers))


class Stage(nn.Module):
    """A pipeline stage as torchtitan cuts one: the whole model's names kept (layers.0 and .1
    here, .2 and .3 in the next stage), an expert_bias buffer the load-balancing hook moves."""

    def __init__(self, first):
        super().__init__()
        self.tok_embeddings = nn.Embedding(24, 16) if first else None
        self.layers = nn.ModuleDict({str(i + (0 if first else 2)): nn.Sequential(
            nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for i in range(2)})
        self.register_buffer("expert_bias", torch.zeros(4))
        self.output = None if first else nn.Linear(16, 24, bias=False)

    def forward(self, x):
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
        for layer in self.layers.values():
            x = x + layer(x)
        return x if self.output is None else self.output(x)


def case_torchtitan_container_over_two_stages():
    """torchtitan's trainer with the class swapped in build_optimizers: an
    OptimizersContainer over two pipeline stages (one Muon per stage, made with AdamW's
    keywords), a LambdaLR per optimizer (its LRSchedulersContainer), the MoE load-balancing
    update registered with register_step_pre_hook on the container, a checkpoint of the
    merged flattened state dicts (and the schedulers') through torch.save, loaded by a new
    container into new stages: the resumed 3 steps are the uninterrupted run's bits, the hook
    ran once per step, and every tensor's state has its FQN in the merged dict."""
    kw = torchtitan_kwargs(1e-8)

    def stages(seed=0):
        torch.manual_seed(seed)
        return [Stage(True), Stage(False)]

    def make(parts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unnamed parameters: the warning is not the point
            opt = OptimizersContainer(parts, Muon, kw)
        scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3))
                  for o in opt]
        calls = []

        def update_expert_bias(*args, **kwargs):  # torchtitan's _update_expert_bias's place
            calls.append(1)
            with torch.no_grad():
                for part in parts:
                    part.expert_bias.add_(0.01)

        opt.register_step_pre_hook(update_expert_bias)
        return opt, scheds, calls

    def run(parts, opt, scheds, first, n):
        for k in range(first, first + n):
            g = torch.Generator().manual_seed(k)
            x = torch.randint(0, 24, (4, 9), generator=g)
            h = x[:, :-1]
            for part in parts:
                h = part(h)
            nn.functional.cross_entropy(h.reshape(-1, 24), x[:, 1:].reshape(-1)).backward()
            opt.step()
            for s in scheds:
                s.step()
            opt.zero_grad()

    parts = stages()
    opt, scheds, calls = make(parts)
    run(parts, opt, scheds, 0, 3)
    sd = opt.state_dict()
    names = {n for part in parts for n, _ in part.named_parameters()}
    assert {k.split(".", 1)[1].rsplit(".", 1)[0] for k in sd if k.startswith("state.")} == \
        names, sorted(sd)[:4]
    buf = io.BytesIO()
    torch.save({"optim": sd, "model": [p.state_dict() for p in parts],
                "lr": [s.state_dict() for s in scheds]}, buf)
    run(parts, opt, scheds, 3, 3)
    ck = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    parts2 = stages(1)
    for part, msd in zip(parts2, ck["model"]):
        part.load_state_dict(msd)
    opt2, scheds2, calls2 = make(parts2)
    for s, ssd in zip(scheds2, ck["lr"]):
        s.load_state_dict(ssd)
    opt2.load_state_dict(ck["optim"])
    run(parts2, opt2, scheds2, 3, 3)
    assert len(calls) == 6 and len(calls2) == 3, (len(calls), len(calls2))
    for a, b in zip(parts, parts2):
        assert worst(a, b) == 0.0, worst(a, b)
        assert torch.equal(a.expert_bias, b.expert_bias)
    for o in list(opt) + list(opt2):
        o.close()


# ---- torch.distributed.checkpoint's full state dict ----------------------------------------

def case_dcp_full_state_dict_cpu_offload_broadcast():
    """torchtune's and accelerate's FSDP2 checkpoints on one gloo rank: the model's and the
    optimizer's state through get_model_state_dict / get_optimizer_state_dict with
    StateDictOptions(full_state_dict=True, cpu_offload=True) (every tensor gathered whole on
    rank 0, on the CPU), torch.save / torch.load(weights_only=True), then loaded into a new
    model and optimizer with full_state_dict=True, broadcast_from_rank0=True: the resumed
    steps are the uninterrupted run's bits. Worked before this round; kept as a case."""
    import torch.distributed.checkpoint.state_dict as dsd
    init_one_rank_group()
    save = dsd.StateDictOptions(full_state_dict=True, cpu_offload=True)
    load = dsd.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)

    def make():
        m = mlp()
        return m, Muon(m.named_parameters(), lr=0.02, adamw_lr=1e-3)

    m, opt = make()
    train([(m, [opt])], 3)
    msd, osd = dsd.get_model_state_dict(m, options=save), dsd.get_optimizer_state_dict(
        m, opt, options=save)
    assert set(osd["state"]["0.weight"]) == {"momentum", "momentum_buffer", "step"}, osd
    buf = io.BytesIO()
    torch.save({"model": msd, "optim": osd}, buf)
    train([(m, [opt])], 2, 3)
    m2, opt2 = make()
    ck = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    dsd.set_model_state_dict(m2, ck["model"], options=load)
    dsd.set_optimizer_state_dict(m2, opt2, ck["optim"], options=load)
    train([(m2, [opt2])], 2, 3)
    assert worst(m, m2) == 0.0, worst(m, m2)
    opt.close()
    opt2.close()


# ---- ReLoRA: opt.state changed in place -----------------------------------------------------

def relora_reset(opts, params, keys, ratio, seed):
    """ReLoRA's optimizer reset (its random_pruning_ at each merge): each parameter's state
    tensors of `keys` multiplied in place by a random keep-mask, through opt.state[p]."""
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        state = next(o.state[p] for o in opts
                     if any(p is q for g in o.param_groups for q in g["params"]))
        if len(state) == 0:
            continue
        for key in keys:
            if key in state:
                state[key].mul_(torch.rand(state[key].shape, generator=gen) > ratio)


def case_relora_reset_changes_the_state_in_place():
    """ReLoRA (and the trainers that ship its reset) prunes the optimizer state in place:
    `optimizer.state[p][key].mul_(mask)` for exp_avg, exp_avg_sq and momentum_buffer. That
    tensor is torch.optim's state; here opt.state hands out copies, and the change was lost,
    silently (5e-2 off torch.optim.Muon + AdamW 4 steps later). Copies changed in place are
    now written back before the next step (or state read, or state_dict()): within 1e-6 of
    torch's pair over the reset. So is the one-liner `opt.state[p]["momentum_buffer"].zero_()`,
    and a copy read for a log and dropped is not kept past the next step."""
    keys = ["exp_avg", "exp_avg_sq", "momentum_buffer"]
    a, b = mlp(), mlp()
    so = Muon(a.named_parameters(), lr=0.02, adamw_lr=1e-3, config=FP32)
    ref = torch_pair(b)

    def reset(k):
        if k == 2:
            relora_reset([so], a.parameters(), keys, 0.9, seed=1)
            relora_reset(ref, b.parameters(), keys, 0.9, seed=1)
        if k == 4:
            so.state[a[2].weight]["momentum_buffer"].zero_()
            ref[0].state[b[2].weight]["momentum_buffer"].zero_()
            so.state[a[0].bias]["exp_avg_sq"].mul_(0.5)
            ref[1].state[b[0].bias]["exp_avg_sq"].mul_(0.5)

    with Fp32TorchMuon():
        train([(a, [so]), (b, ref)], 7, after=reset)
    print(f"  ReLoRA's reset at step 2, zero_() at step 4: {worst(a, b):.1e} from torch")
    assert worst(a, b) < 1e-6, worst(a, b)
    norms = [so.state[p]["exp_avg"].norm() for p in (a[0].bias, a[2].bias)]  # a log line
    assert all(n > 0 for n in norms)
    train([(a, [so])], 1, 7)
    edits = so.state._edits
    assert not edits.kept and not edits.live, (len(edits.kept), len(edits.live))
    so.close()


def case_state_changed_after_a_step_refused_by_name():
    """A copy read before a step and changed in place after it holds the state of before the
    step; torch.optim's tensor would be the state the step left (mul_(mask) of the new
    state), which no copy can give. The next step refuses it, naming the tensor and the key,
    nothing written (the parameters unchanged); the step after goes on, and a copy read
    again after the step is taken."""
    m = mlp()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=1e-3)
    train([(m, [opt])], 2)
    held = opt.state[m[0].weight]["momentum_buffer"]
    train([(m, [opt])], 1, 2)
    held.zero_()
    m(x_of(3)).square().mean().backward()
    before = [p.detach().clone() for p in m.parameters()]
    refused(opt.step, ValueError, "0.weight", "'momentum_buffer'", "read before a step",
            "Nothing of it was written")
    assert all(torch.equal(x, p) for x, p in zip(before, m.parameters()))
    assert opt.state[m[0].weight]["momentum_buffer"].abs().sum() > 0
    opt.step()
    opt.zero_grad()
    opt.state[m[0].weight]["momentum_buffer"].zero_()
    assert opt.state[m[0].weight]["momentum_buffer"].abs().sum() == 0
    opt.close()


def case_state_entry_deep_copied():
    """copy.deepcopy(opt.state[p]), a snapshot of one tensor's state as a script takes it to
    compare later: torch.optim's gives a dict of tensor copies. Here it deep-copied the
    entry's runtime too and failed (`ValueError: ctypes objects containing pointers cannot be
    pickled`); now a plain dict of copies, which later steps and in-place changes of it leave
    alone (changing the snapshot writes nothing)."""
    import copy
    m = mlp()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=1e-3)
    train([(m, [opt])], 2)
    snap = copy.deepcopy(opt.state[m[0].weight])
    assert type(snap) is dict and set(snap) == {"momentum", "momentum_buffer", "step"}, snap
    snap["momentum_buffer"].zero_()
    train([(m, [opt])], 1, 2)
    now = opt.state[m[0].weight]
    assert now["step"] == 3 and snap["step"] == 2 and now["momentum_buffer"].abs().sum() > 0
    opt.close()


def case_state_reset_by_assignment():
    """A script that resets its optimizer mid-run by assigning a fresh state
    (`opt.state = collections.defaultdict(dict)`; torch.optim then starts every tensor
    afresh at its next step: zero moments, step count 0, AdamW's bias correction from 1).
    Here the assignment replaced the view and the runtimes kept their state: the old state
    stepped on, silently, 2e-2 off torch (and with _torch_edits the next step failed on the
    defaultdict). Now the runtimes' state is what was assigned: within 1e-6 of
    torch.optim.Muon + AdamW reset the same way, and opt.state is still the view."""
    import collections
    a, b = mlp(), mlp()
    so = Muon(a.named_parameters(), lr=0.02, adamw_lr=1e-3, config=FP32)
    ref = torch_pair(b)

    def reset(k):
        if k == 2:
            for o in [so] + ref:
                o.state = collections.defaultdict(dict)
            assert len(so.state) == 0 and so.state is not None

    with Fp32TorchMuon():
        train([(a, [so]), (b, ref)], 5, after=reset)
    print(f"  state reset at step 2: {worst(a, b):.1e} from torch")
    assert worst(a, b) < 1e-6, worst(a, b)
    assert so.state[a[0].weight]["step"] == 2 and "exp_avg" in so.state[a[0].bias]
    so.close()


# ---- autocast ------------------------------------------------------------------------------

def case_step_inside_autocast_region():
    """Scripts that keep the whole iteration under `with torch.autocast(...)` (forward,
    backward and opt.step() in one block) give this class the same bits as with the step
    outside it: the library's arithmetic is its own, in the configured precision.
    (torch.optim.Muon's Newton-Schulz matmuls are autocast's there, bf16 on the CPU: 4e-4
    from its own run outside after one step.) Worked before this round; kept as a case."""
    nets = [mlp(), mlp()]
    opts = [Muon(n.named_parameters(), lr=0.02, adamw_lr=1e-3, config=FP32) for n in nets]
    for k in range(4):
        for i, (n, o) in enumerate(zip(nets, opts)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                n(x_of(k)).float().square().mean().backward()
                if i == 0:
                    o.step()
            if i == 1:
                o.step()
            o.zero_grad()
    assert worst(nets[0], nets[1]) == 0.0, worst(nets[0], nets[1])
    for o in opts:
        o.close()


if __name__ == "__main__":
    cases.run("test_torch_real7", dict(globals()))
