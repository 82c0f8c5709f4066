"""shardopt.torch.Muon in training scripts as others write them, the seventh round (after
test_torch_real4.py; its param groups and schedules are test_torch_real5_groups.py): bf16
weights with fp32 gradients (torch's Tensor.grad_dtype), a subclass with its own step() and
step hooks, torchtitan's optimizer in backward, SAM over this class, checkpoints saved before
the state dict held torch.optim.Muon's "momentum_buffer" resumed through
torch.distributed.checkpoint, a parameter that is a strided view. Each script is what its
author would run, the import swapped, compared with the optimizer it was written for. One
process.

    test_torch_real5.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import tempfile
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import refused, relative
from test_torch_real import FP32, Fp32TorchMuon, mlp, worst
from test_torch_real4 import mats, saved, train

from shardopt.torch import Muon

torch.set_num_threads(1)


def x_of(k, dtype=torch.float32):
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(k)).to(dtype)


# ---- bf16 weights, fp32 gradients -------------------------------------------------------------

def case_bf16_weights_fp32_gradients_as_torch_muon():
    """bf16 weights whose gradients autograd makes in fp32 (`p.grad_dtype = torch.float32`,
    torch >= 2.10: gradients accumulated over micro-batches without bf16 rounding), stepped by
    torch.optim.Muon as they are (its buffer fp32). Before, each tensor was registered with
    its own dtype's gradients (no .grad yet at construction) and every step refused the fp32
    ones ('registered with 128 elements of grad dtype bf16'). Now the declared gradient dtype
    is registered: the first step's buffer is torch.optim.Muon's bit for bit (the fp32
    gradient read as fp32), and after 4 steps the bf16 weights are within 2e-2 of torch's
    (1.5e-2 measured; torch rounds its decay and its update into bf16 one after the other,
    the library once; bf16 gradients give 1.5e-2 too). A grad_dtype set after the optimizer
    was made is refused at the step, saying so; a declared float16 at construction."""
    if not hasattr(torch.Tensor, "grad_dtype"):
        print("  skipped: this torch has no Tensor.grad_dtype")
        return
    with Fp32TorchMuon():
        a, b = mats().bfloat16(), mats().bfloat16()
        for p in list(a.parameters()) + list(b.parameters()):
            p.grad_dtype = torch.float32
        so = Muon(a.named_parameters(), lr=0.02, config=FP32)
        tm = torch.optim.Muon(b.parameters(), lr=0.02)
        for k in range(4):
            for net, o in ((a, so), (b, tm)):
                o.zero_grad()
                net(x_of(k, torch.bfloat16)).float().square().mean().backward()
                o.step()
            assert a[0].weight.grad.dtype == torch.float32
            if k == 0:
                for p, q in zip(a.parameters(), b.parameters()):
                    assert torch.equal(so.state[p]["momentum_buffer"],
                                       tm.state[q]["momentum_buffer"])
    w = worst(a, b)
    print(f"  bf16 weights, fp32 gradients: {w:.1e} from torch.optim.Muon after 4 steps")
    assert w < 2e-2 and a[0].weight.dtype == torch.bfloat16, w
    # AdamW tensors too (torch.optim.AdamW itself refuses fp32 gradients on bf16 weights)
    m = mlp().bfloat16()
    for p in m.parameters():
        p.grad_dtype = torch.float32
    o = Muon(m.named_parameters(), lr=0.02)
    bias = m[0].bias.detach().clone()
    m(x_of(0, torch.bfloat16)).float().square().mean().backward()
    o.step()
    assert not torch.equal(bias, m[0].bias) and o.state[m[0].bias]["exp_avg"].dtype == \
        torch.float32
    o.close()
    # declared after the optimizer was made: the runtime holds the dtype it registered
    c = mats().bfloat16()
    late = Muon(c.named_parameters(), lr=0.02)
    for p in c.parameters():
        p.grad_dtype = torch.float32
    c(x_of(0, torch.bfloat16)).float().square().mean().backward()
    refused(late.step, ValueError, "0.weight.grad has 128 fp32 elements", "grad_dtype set after",
            "set p.grad_dtype to the gradients' dtype")
    # a declared dtype the library has no kernels for: refused at construction, by name
    f = mats()
    f[0].weight.grad_dtype = torch.float16
    refused(lambda: Muon(f.named_parameters(), lr=0.02), ValueError,
            "0.weight: grad_dtype = torch.float16", "float32 or bfloat16 gradients")
    for o in (so, late):
        o.close()


# ---- a subclass with its own step ---------------------------------------------------------------

class LoggingMuon(Muon):
    """A script's own subclass: its step() logs the gradient norm, then steps."""

    def step(self, closure=None):
        self.norms = getattr(self, "norms", []) + [float(torch.stack(
            [p.grad.norm() for g in self.param_groups for p in g["params"]
             if p.grad is not None]).norm())]
        return super().step(closure)


def case_subclass_with_its_own_step_runs_hooks_once():
    """A subclass that defines step() and calls super().step() (a script's logging or timing
    wrapper): torch.optim.Optimizer wraps the subclass's step at construction with its hooks
    and profiler record, as for a subclass of torch.optim.Muon. Before, this class's step ran
    them again inside: every step pre-hook and post-hook (an EMA update in a post-hook, a
    gradient clip in a pre-hook) twice a step, the global ones too. Now once, and the steps
    are those of this class without a subclass. (torch's own subclasses run them once until
    their parent class is made itself: torch wraps a class's step at its first construction,
    and a subclass's super().step() is then wrapped twice too.)"""
    from torch.optim.optimizer import register_optimizer_step_post_hook
    counts = {}
    for cls in (LoggingMuon, Muon):
        net = mats()
        o = cls(net.named_parameters(), lr=0.02)
        calls = []
        o.register_step_pre_hook(lambda opt, a, k: calls.append("pre"))
        o.register_step_post_hook(lambda opt, a, k: calls.append("post"))
        handle = register_optimizer_step_post_hook(lambda opt, a, k: calls.append("global"))
        try:
            train(net, o, 2)
        finally:
            handle.remove()
        counts[cls.__name__] = (calls, net, o)
    want = ["pre", "post", "global"] * 2
    for name, (calls, _, _) in counts.items():
        assert calls == want, (name, calls)
    assert len(counts["LoggingMuon"][2].norms) == 2
    a, b = counts["LoggingMuon"][1], counts["Muon"][1]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    for name in ("LoggingMuon", "Muon"):
        counts[name][2].close()


def case_optimizer_in_backward_one_per_parameter():
    """torchtitan's optimizer in backward (its OptimizersInBackwardContainer, torch's
    tutorial on it): one optimizer per parameter, each stepped and zeroed in the parameter's
    post-accumulate-grad hook, while backward goes on to the layers below, so the gradients
    never all live at once. Each is its own runtime of one tensor: the weights are those of one
    optimizer over the whole model stepped after backward, bit for bit, and each saves and
    resumes its own state dict."""
    a, b, c = mlp(), mlp(), mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per = {p: Muon([(n, p)], lr=0.02, adamw_lr=1e-3) for n, p in a.named_parameters()}

    def hook(p):
        per[p].step()
        per[p].zero_grad()

    for p in a.parameters():
        p.register_post_accumulate_grad_hook(hook)
    whole = Muon(b.named_parameters(), lr=0.02, adamw_lr=1e-3)
    for k in range(3):
        a(x_of(k)).square().mean().backward()
        whole.zero_grad()
        b(x_of(k)).square().mean().backward()
        whole.step()
        assert all(p.grad is None for p in a.parameters())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert [per[p].algo(p) for p in a.parameters()] == [whole.algo(p) for p in b.parameters()]
    c.load_state_dict(a.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = {}
        for (n, p), q in zip(c.named_parameters(), a.parameters()):
            again[p] = Muon([(n, p)], lr=0.02, adamw_lr=1e-3)
            again[p].load_state_dict(saved(per[q].state_dict()))
    def hook_again(p):
        again[p].step()
        again[p].zero_grad()

    for p in c.parameters():
        p.register_post_accumulate_grad_hook(hook_again)
    for k in range(3, 5):
        a(x_of(k)).square().mean().backward()
        c(x_of(k)).square().mean().backward()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    for o in list(per.values()) + list(again.values()) + [whole]:
        o.close()


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimization as davda54/sam writes it (its essentials): the base
    optimizer is made over SAM's own param groups (rho, adaptive and the base's keywords in
    each), SAM then shares the base's param_groups; first_step moves every weight up the
    gradient by rho, second_step puts the saved weights back (`p.data = old_p`: new storage
    under every parameter, each step) and steps the base."""

    def __init__(self, params, base_optimizer, rho=0.05, adaptive=False, **kwargs):
        super().__init__(params, dict(rho=rho, adaptive=adaptive, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @torch.no_grad()
    def first_step(self):
        norm = torch.stack([p.grad.norm() for g in self.param_groups for p in g["params"]
                            if p.grad is not None]).norm()
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    self.state[p]["old_p"] = p.data.clone()
                    p.add_(p.grad * (g["rho"] / (norm + 1e-12)))
        self.zero_grad()

    @torch.no_grad()
    def second_step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        self.zero_grad()


def case_sam_over_this_class_as_over_torch_muon():
    """SAM(model.parameters(), base_optimizer=Muon, rho=0.05, lr=0.02): this class is made over
    SAM's groups (its rho and adaptive keys kept in both parts of a split group), shares them
    back, and its parameters get new storage at every second_step (`p.data = old_p`), which
    the step follows. Against SAM over torch.optim.Muon (fp32 Newton-Schulz both): within 1e-6
    after 3 steps (1.3e-7 measured)."""
    nets = []
    with Fp32TorchMuon():
        for base, kw in ((Muon, dict(config=FP32)), (torch.optim.Muon, {})):
            net = mats()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # unnamed parameters: every one a matrix here
                opt = SAM(net.parameters(), base, rho=0.05, lr=0.02, **kw)
            for k in range(3):
                net(x_of(k)).square().mean().backward()
                opt.first_step()
                net(x_of(k)).square().mean().backward()
                opt.second_step()
            nets.append(net)
            if base is Muon:
                assert all("rho" in g for g in opt.base_optimizer.param_groups)
                opt.base_optimizer.close()
    w = worst(*nets)
    print(f"  SAM over this class: {w:.1e} from SAM over torch.optim.Muon after 3 steps")
    assert w < 1e-6, w


# ---- checkpoints saved before "momentum_buffer" -------------------------------------------------

def _old(sd):
    """sd as this class saved it before its Muon state held "momentum_buffer"."""
    for st in sd["state"].values():
        st.pop("momentum_buffer", None)
    return sd


def case_dcp_checkpoint_saved_before_the_buffer_resumes():
    """torch.distributed.checkpoint loads into the state dict it is given, and asks the
    checkpoint for every key there: a checkpoint this class saved before its Muon state held
    "momentum_buffer", loaded as docs/python.md says (dcp.load into a fresh
    opt.state_dict(), then load_state_dict), failed on it ('Missing key in checkpoint
    state_dict: optim.state.0.momentum_buffer'). An optimizer that has not stepped now has no
    buffer in state_dict() (its momenta are 0, and torch.optim.Muon starts a zero buffer all
    the same): the fresh template asks only for what every checkpoint holds, and the run goes
    on with the same bits as the uninterrupted one. Once it has stepped, every Muon tensor
    has one, as before (one that never had a gradient too). A script that keeps its checkpoints at
    their old size drops the buffers in a state_dict post-hook; load_state_dict takes
    "momentum" alone, exact."""
    import torch.distributed.checkpoint as dcp
    a, b, c = mats(), mats(), mats()
    ref = Muon(a.named_parameters(), lr=0.02)
    train(a, ref, 3)
    fresh = Muon(b.named_parameters(), lr=0.02).state_dict()
    assert sorted(fresh["state"][0]) == ["momentum", "step"], fresh["state"][0]
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp's warning: no process group, one process
        dcp.save({"optim": _old(ref.state_dict())}, checkpoint_id=d)
        b.load_state_dict(a.state_dict())
        so = Muon(b.named_parameters(), lr=0.02)
        tmpl = {"optim": so.state_dict()}
        dcp.load(tmpl, checkpoint_id=d)
        so.load_state_dict(tmpl["optim"])
    train(a, ref, 2, 3)
    train(b, so, 2, 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))

    # the size kept as before: the buffers dropped by a post-hook, resumed exactly
    def drop_buffers(opt, sd):
        _old(sd)

    ref.register_state_dict_post_hook(drop_buffers)
    sd = saved(ref.state_dict())
    assert "momentum_buffer" not in sd["state"][0] and "momentum" in sd["state"][0]
    c.load_state_dict(a.state_dict())
    back = Muon(c.named_parameters(), lr=0.02)
    back.load_state_dict(sd)
    train(a, ref, 2, 5)
    train(c, back, 2, 5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    # once the optimizer has stepped, every Muon tensor has the buffer, one that never had a
    # gradient too: a template of a stepped optimizer asks for no key its checkpoints lack
    e, unused = mats(), nn.Parameter(torch.randn(4, 4))
    some = Muon(list(e.named_parameters()) + [("unused.weight", unused)], lr=0.02)
    train(e, some, 1)
    sd = some.state_dict()
    assert float(sd["state"][2]["step"]) == 0 and all(
        sorted(st) == ["momentum", "momentum_buffer", "step"] for st in sd["state"].values())
    for o in (ref, so, back, some):
        o.close()


def case_dcp_partial_load_keeps_the_saved_momentum():
    """torch.distributed.checkpoint.state_dict's get_optimizer_state_dict (torchtitan's and
    torchtune's template) first steps an optimizer without state once with zero gradients,
    so its template holds a zero "momentum_buffer" beside a zero "momentum". A checkpoint
    without the buffer (saved before this class wrote it) then fails dcp.load on the missing
    key; dcp.load(..., planner=DefaultLoadPlanner(allow_partial_load=True)) loads what it has
    and leaves the template's zero buffer. Before, load_state_dict took that buffer as newer
    than the loaded "momentum" (the two disagree) and the momentum was zero, silently (the run
    then 6.0e-2 from the uninterrupted one after 2 steps); now an all-zero buffer beside a
    momentum that is not is the template's: the saved momentum is loaded and the run goes on
    with the same bits."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    a, b = mats(), mats()
    ref = Muon(a.named_parameters(), lr=0.02)
    train(a, ref, 3)
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"optim": _old(get_optimizer_state_dict(a, ref))}, checkpoint_id=d)
        b.load_state_dict(a.state_dict())
        so = Muon(b.named_parameters(), lr=0.02)
        tmpl = get_optimizer_state_dict(b, so)
        assert "momentum_buffer" in tmpl["state"]["0.weight"]  # stepped once: it has one
        dcp.load({"optim": tmpl}, checkpoint_id=d,
                 planner=DefaultLoadPlanner(allow_partial_load=True))
        set_optimizer_state_dict(b, so, tmpl)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(ref.state[p]["momentum"], so.state[q]["momentum"])
    train(a, ref, 2, 3)
    train(b, so, 2, 3)
    w = worst(a, b)
    assert w == 0, w
    for o in (ref, so):
        o.close()


# ---- a parameter that is a strided view -------------------------------------------------------

def case_strided_view_parameter_named_with_what_to_do():
    """A Parameter over part of another tensor (`nn.Parameter(fused[:, :8])`, a column slice
    of a fused weight) is no dense block of memory in any order; torch.optim steps it, the
    library steps each parameter as one block. Refused at construction as before, but the
    message now gives its shape and strides and what to do (make it contiguous, or a
    Parameter of its own), where it said only 'the local shard is not contiguous'. Made
    contiguous, it steps as torch.optim.Muon steps the view (fp32 Newton-Schulz both)."""
    fused = torch.randn(16, 24, generator=torch.Generator().manual_seed(0))
    view = nn.Parameter(fused[:, :8])
    assert not view.is_contiguous()
    refused(lambda: Muon([("q.weight", view)], lr=0.02), ValueError, "q.weight",
            "not contiguous", "strides [24, 1]", "p.data = p.data.contiguous()")
    ref = nn.Parameter(fused[:, :8])
    view.data = view.data.contiguous()
    with Fp32TorchMuon():
        so = Muon([("q.weight", view)], lr=0.02, config=FP32)
        tm = torch.optim.Muon([ref], lr=0.02)
        for k in range(3):
            g = torch.randn(16, 8, generator=torch.Generator().manual_seed(k))
            view.grad, ref.grad = g.clone(), g.clone()
            so.step()
            tm.step()
    r = relative(view.detach(), ref.detach())
    print(f"  a column slice made contiguous: {r:.1e} from torch.optim.Muon on the view")
    assert r < 1e-6, r
    so.close()


if __name__ == "__main__":
    cases.run("test_torch_real5", dict(globals()))
