"""shardopt.torch.Muon dropped into training code as others write it (issue 20): nanoGPT's
configure_optimizers, modded-nanogpt's Muon + AdamW pair with hand-set lr, HF / Lightning
habits (schedulers, GradScaler, opt.state, hooks, closures, torch.compile), torch.optim.Muon's
own arguments. One process.

    test_torch_dropin.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import inspect
import math
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

import shardopt
from shardopt.torch import Muon

torch.set_num_threads(1)


class GPT(nn.Module):
    """nanoGPT's names in miniature: transformer.wte / wpe / h / ln_f, a tied lm_head."""

    def __init__(self, vocab=24, d=16, block=8, layers=2):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d),
            h=nn.ModuleList([nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(),
                                           nn.Linear(4 * d, d)) for _ in range(layers)]),
            ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for b in t.h:
            x = x + b(x)
        logits = self.lm_head(t.ln_f(x))
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def configure_optimizers(self, opt_class, weight_decay, learning_rate, betas, device_type):
        """nanoGPT's configure_optimizers, with the optimizer class passed in."""
        param_dict = {pn: p for pn, p in self.named_parameters()}
        param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [{"params": decay_params, "weight_decay": weight_decay},
                        {"params": nodecay_params, "weight_decay": 0.0}]
        fused_available = "fused" in inspect.signature(opt_class).parameters
        use_fused = fused_available and device_type == "cuda"
        extra_args = dict(fused=True) if use_fused else dict(fused=False)
        return opt_class(optim_groups, lr=learning_rate, betas=betas, **extra_args)


def batch(step, vocab=24, block=8, n=4):
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randint(0, vocab, (n, block + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def model(seed=0):
    torch.manual_seed(seed)
    return GPT()


def relative(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unnamed matrices: the warning is not the point here
        return fn(*a, **kw)


def refused(fn, exc, *words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return
    raise AssertionError(f"not refused: expected {exc.__name__} with {words}")


# ---- nanoGPT -------------------------------------------------------------------------------

def case_nanogpt_configure_optimizers():
    """nanoGPT's configure_optimizers unchanged but for the class: betas= and fused= are
    taken (fused and foreach change nothing here), each group's weight_decay covers its AdamW
    tensors too (the no-decay group of biases and norms: 0.0, not AdamW's default 0.01), and
    its betas are the AdamW tensors' betas: one step of the 1-D tensors equals
    torch.optim.AdamW's with the same group settings."""
    m, ref = model(), model()
    opt = quiet(m.configure_optimizers, Muon, 0.1, 6e-3, (0.9, 0.95), "cpu")
    rows = [(g["algo"], g["weight_decay"], g["betas"] if g["algo"] == "adamw" else None)
            for g in opt.param_groups]
    assert rows == [("muon", 0.1, None), ("adamw", 0.0, (0.9, 0.95))], rows
    nodecay = [p for p in ref.parameters() if p.dim() < 2]
    radam = torch.optim.AdamW(nodecay, lr=6e-3, betas=(0.9, 0.95), weight_decay=0.0)
    start = {n: p.detach().clone() for n, p in m.named_parameters()}
    for mm, o in ((m, opt), (ref, radam)):  # one step: the same gradients on both sides
        mm(*batch(0)).backward()
        o.step()
    # the update of each 1-D tensor (AdamW's decay 0.01 of a LayerNorm weight at 1.0 would
    # be 1 % of it)
    one_d = [n for n, p in m.named_parameters() if p.dim() < 2]
    ours, theirs = dict(m.named_parameters()), dict(ref.named_parameters())
    worst = max(relative(ours[n].detach() - start[n], theirs[n].detach() - start[n])
                for n in one_d)
    assert worst < 1e-5, f"1-D tensors' update against torch.optim.AdamW: {worst:.2e}"
    opt.close()
    # torch.optim's other switches: foreach / fused taken, the ones that change the arithmetic
    # refused by name
    quiet(Muon, nn.Linear(4, 4).parameters(), foreach=True, fused=None).close()
    for k in ("maximize", "amsgrad", "capturable", "differentiable"):
        refused(lambda: Muon(nn.Linear(4, 4).parameters(), **{k: True}), ValueError, k,
                "not supported")
    refused(lambda: Muon(nn.Linear(4, 4).parameters(), betas=(0.9, 0.9),
                         adamw_betas=(0.9, 0.9)), ValueError, "betas and adamw_betas")
    # a weight_decay given is every tensor's, AdamW's too, unless adamw_weight_decay says
    # otherwise; left unset each side keeps its torch default
    for kw, want in (({"weight_decay": 0.05}, 0.05), ({}, 0.01),
                     ({"weight_decay": 0.05, "adamw_weight_decay": 0.2}, 0.2)):
        o = Muon(nn.Linear(4, 4).named_parameters(), **kw)
        got = [g["weight_decay"] for g in o.param_groups if g["algo"] == "adamw"]
        assert got == [want], (kw, got)
        o.close()


# ---- modded-nanogpt ------------------------------------------------------------------------

def case_modded_nanogpt_muon_with_adamw():
    """modded-nanogpt: Muon(hidden_matrix_params, lr=0.05, momentum=0.95) alone for the
    matrices, torch.optim.AdamW for the rest, initial_lr stored by hand and
    g["lr"] = g["initial_lr"] * frac each step; the lr a group holds at step() is the one
    applied (frac = 0 leaves the matrices as they are). A tensor lr is taken as torch.optim
    takes it. Its momentum warmup (g["momentum"] written each step, 0.85 -> 0.95) takes effect
    at each step: the momentum state is M = mu M + g with each step's mu, and the run differs
    from one at a constant 0.95. A momentum of 1 is refused by the library, nothing stepped."""
    runs = []
    for warm in (True, False):
        m = model()
        hidden = [p for n, p in m.transformer.h.named_parameters() if p.ndim >= 2]
        rest = [p for p in m.parameters() if all(p is not q for q in hidden)]
        muon = quiet(Muon, hidden, lr=torch.tensor(0.05), momentum=0.95)
        adam = torch.optim.AdamW(rest, lr=3e-3, betas=(0.8, 0.95), eps=1e-10)
        opts = [adam, muon]
        for o in opts:
            for g in o.param_groups:
                g["initial_lr"] = g["lr"]
        assert [g["algo"] for g in muon.param_groups] == ["muon"]
        want = [torch.zeros_like(p) for p in hidden]
        for step, frac in enumerate((1.0, 0.5, 0.0, 1.0)):
            for o in opts:
                for g in o.param_groups:
                    g["lr"] = g["initial_lr"] * frac
            mu = 0.85 + 0.1 * min(step / 3, 1) if warm else 0.95
            for g in muon.param_groups:
                g["momentum"] = mu
            before = [p.detach().clone() for p in hidden]
            m(*batch(step)).backward()
            want = [mu * w + p.grad for w, p in zip(want, hidden)]
            for o in opts:
                o.step()
            m.zero_grad(set_to_none=True)
            moved = [not torch.equal(p, b) for p, b in zip(hidden, before)]
            assert all(moved) == (frac > 0) and any(moved) == (frac > 0), (frac, moved)
        got = [muon.state[p]["momentum"] for p in hidden]
        worst = max(relative(a, b) for a, b in zip(got, want))
        assert worst < 1e-6, f"momentum state against M = mu M + g (warmup {warm}): {worst:.2e}"
        runs.append([p.detach().clone() for p in hidden])
        if warm:
            m(*batch(9)).backward()
            before = [p.detach().clone() for p in hidden]
            for g in muon.param_groups:
                g["momentum"] = 1.0
            refused(muon.step, ValueError, "momentum = 1.0: accepted [0, 1)",
                    "nothing was stepped")
            assert all(torch.equal(p, b) for p, b in zip(hidden, before))
        muon.close()
    assert any(not torch.equal(a, b) for a, b in zip(*runs)), "the warmup changed nothing"


def case_resume_mid_warmup_weights_only():
    """A modded-nanogpt run resumed mid-warmup: the state_dict saved at step 2 (momentum 0.9 in
    its Muon group) through torch.save and torch.load(weights_only=True) into an optimizer
    made anew with the script's starting momentum (0.85): it loads (an AdamW group's momentum
    key, which AdamW does not use, is neither compared nor restored), the Muon group's
    momentum is the saved one, and the steps after give the bits of the run that went on.
    torch.optim's state_dict / load_state_dict hooks run."""
    import io

    def run(stop, load=None):
        torch.manual_seed(4)
        net = nn.Sequential(nn.Linear(6, 10), nn.LayerNorm(10), nn.Linear(10, 3))
        if load is not None:
            net.load_state_dict(load["model"])
        opt = Muon(net.named_parameters(), lr=0.02, momentum=0.85 if load else 0.95)
        if load is not None:
            opt.load_state_dict(load["opt"])
            assert opt.param_groups[0]["momentum"] == 0.9, opt.param_groups[0]
        saved = None
        for k in range(2 if load else 0, stop):
            for g in opt.param_groups:
                if g["algo"] == "muon":
                    g["momentum"] = 0.85 + 0.05 * min(k, 2)
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(k))
            net(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
            if k == 1 and load is None:
                buf = io.BytesIO()
                torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
                saved = buf.getvalue()
        out = {n: p.detach().clone() for n, p in net.named_parameters()}
        opt.close()
        return out, saved

    full, saved = run(5)
    # torch.optim's state_dict hooks (register_state_dict_pre_hook / post_hook, and the
    # load_state_dict ones) run as for any torch optimizer; a post hook's result is returned
    lin = nn.Linear(3, 3)
    opt = Muon(lin.named_parameters())
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append("pre"))
    opt.register_state_dict_post_hook(lambda o, sd: dict(sd, extra=1))
    opt.register_load_state_dict_pre_hook(
        lambda o, sd: seen.append("load_pre") or {k: v for k, v in sd.items() if k != "extra"})
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load_post"))
    sd = opt.state_dict()
    assert sd.get("extra") == 1 and seen == ["pre"], (sorted(sd), seen)
    opt.load_state_dict(sd)
    assert seen == ["pre", "load_pre", "load_post"], seen
    opt.close()
    resumed, _ = run(5, load=torch.load(io.BytesIO(saved), weights_only=True))
    diff = [n for n in full if not torch.equal(full[n], resumed[n])]
    assert not diff, f"resumed differs in {diff}"


# ---- HF / Lightning habits -----------------------------------------------------------------

def case_schedulers_as_for_torch_optimizers():
    """Every scheduler HF and Lightning trainers build sets the same lrs on Muon's groups as on
    a torch optimizer's with the same groups, step after step (get_last_lr and
    param_groups[0]["lr"]); OneCycleLR with cycle_momentum=True (its default) cycles the Muon
    groups' momentum as for torch.optim.Muon, each step taking the one its group holds, and
    an AdamW group's momentum as its beta1 (betas[0] follows it at the step; before, refused);
    momentum and betas[0] both changed to different values since the last step is refused by
    name, nothing stepped on any group; cycle_momentum=False works."""
    L = torch.optim.lr_scheduler
    makers = {
        "CosineAnnealingLR": lambda o: L.CosineAnnealingLR(o, 5),
        "SequentialLR": lambda o: L.SequentialLR(o, [L.LinearLR(o, 0.1, 1.0, 2),
                                                     L.CosineAnnealingLR(o, 5)], milestones=[2]),
        "ChainedScheduler": lambda o: L.ChainedScheduler([L.LinearLR(o, 0.1, 1.0, 2),
                                                          L.ExponentialLR(o, 0.9)]),
        "ReduceLROnPlateau": lambda o: L.ReduceLROnPlateau(o, patience=0, factor=0.5),
        "OneCycleLR": lambda o: L.OneCycleLR(o, [0.05, 0.01], total_steps=6,
                                             cycle_momentum=False),
        "LambdaLR": lambda o: L.LambdaLR(o, lambda s: 1 / (s + 1)),
    }
    for name, make in makers.items():
        m = model()
        opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
        # a torch optimizer with the same groups and lrs: the scheduler's arithmetic is torch's
        ref = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": g["lr"]}
                               for g in opt.param_groups], lr=0.1)
        s, rs = make(opt), make(ref)
        for k in range(5):
            m(*batch(k)).backward()
            opt.step()
            ref.step()
            opt.zero_grad()
            if name == "ReduceLROnPlateau":
                s.step(1.0)
                rs.step(1.0)
            else:
                s.step()
                rs.step()
                assert s.get_last_lr() == rs.get_last_lr(), (name, k, s.get_last_lr())
            got = [g["lr"] for g in opt.param_groups]
            want = [g["lr"] for g in ref.param_groups]
            assert got == want and opt.param_groups[0]["lr"] == want[0], (name, k, got, want)
        opt.close()
    m = model()
    opt = Muon(m.named_parameters(), lr=0.02, model=m)
    s = L.OneCycleLR(opt, 0.05, total_steps=6)  # cycle_momentum=True
    m(*batch(0)).backward()
    opt.step()  # at max_momentum: 0.95, the AdamW group's beta1 too
    adamw = opt.param_groups[1]
    assert adamw["algo"] == "adamw" and adamw["betas"] == (0.95, 0.999), adamw["betas"]
    s.step()
    mu = adamw["momentum"]
    assert mu < 0.95
    m(*batch(1)).backward()
    opt.step()  # the cycled momentum is the AdamW group's beta1
    assert adamw["betas"] == (mu, 0.999) and adamw["momentum"] == mu, adamw["betas"]
    # both of its beta1 keys changed, to different values: which one is meant is unknown
    adamw["momentum"], adamw["betas"] = 0.8, (0.7, 0.999)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    refused(opt.step, ValueError, "(adamw): momentum changed from", "to 0.8 and betas[0] to 0.7",
            "nothing was stepped")
    # every group is checked before any steps: the Muon group (first) is not written either
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())
    adamw["betas"] = (mu, 0.999)  # as the last step left it: the momentum alone changed
    # a warmup loop over every group of a Muon + AdamW optimizer: the AdamW groups' beta1 too
    for g in opt.param_groups:
        g["momentum"] = 0.9
    opt.step()
    assert adamw["betas"] == (0.9, 0.999)
    opt.close()
    # only Muon groups: OneCycleLR cycles their momentum as torch.optim.Muon's, and each step
    # takes the momentum the group holds
    hidden = [p for p in m.parameters() if p.ndim == 2]
    opt = quiet(Muon, hidden, lr=0.02)
    ref = torch.optim.SGD([torch.zeros(1)], lr=0.02, momentum=0.95)
    s, rs = L.OneCycleLR(opt, 0.05, total_steps=6), L.OneCycleLR(ref, 0.05, total_steps=6)
    seen = []
    for k in range(4):
        m(*batch(k)).backward()
        mu = opt.param_groups[0]["momentum"]
        want = [mu * opt.state[p]["momentum"] + p.grad if p in opt.state else p.grad.clone()
                for p in hidden]
        opt.step()
        ref.step()
        worst = max(relative(opt.state[p]["momentum"], w) for p, w in zip(hidden, want))
        assert worst < 1e-6, (k, mu, worst)
        m.zero_grad()
        s.step()
        rs.step()
        assert opt.param_groups[0]["momentum"] == ref.param_groups[0]["momentum"]
        seen.append(mu)
    assert len(set(seen)) == 4, seen  # cycled
    opt.close()


def case_gradscaler_enabled_clip_and_closure():
    """GradScaler(enabled=True) on the CPU (unscale_ reads the gradients through
    param_groups), clip_grad_norm_ after unscale_, zero_grad(set_to_none=True): the same bits
    as the run without a scaler (a power-of-2 scale is exact in fp32). step(closure) with a
    closure that calls backward returns its loss. Step hooks run."""
    runs = []
    for enabled in (True, False):
        m = model()
        opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
        seen = []
        opt.register_step_pre_hook(lambda o, a, k: seen.append("pre"))
        opt.register_step_post_hook(lambda o, a, k: seen.append("post"))
        scaler = torch.amp.GradScaler("cpu", enabled=enabled)
        for k in range(3):
            opt.zero_grad(set_to_none=True)
            scaler.scale(m(*batch(k))).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
        assert seen == ["pre", "post"] * 3, seen
        if enabled:
            assert scaler.get_scale() > 1, scaler.get_scale()

        def closure():
            opt.zero_grad(set_to_none=True)
            loss = m(*batch(9))
            loss.backward()
            return loss

        loss = opt.step(closure)
        assert torch.is_tensor(loss) and loss.item() > 0, loss
        runs.append({n: p.detach().clone() for n, p in m.named_parameters()})
        opt.close()
    diff = [n for n in runs[0] if not torch.equal(runs[0][n], runs[1][n])]
    assert not diff, f"GradScaler(enabled=True) differs from no scaler in {diff}"


def case_state_by_parameter_as_torch_muon():
    """opt.state[p] as torch.optim has it: no entry before a parameter's first step;
    afterwards Muon's "momentum_buffer" is torch.optim.Muon's (same gradients, same momentum:
    torch's buffer is the library's M times (1 - momentum)) in the dtype the state is held in
    (bf16 with momentum_dtype bf16), AdamW's "exp_avg" / "exp_avg_sq" / "step". Lightning's
    move of the state to a device (v[k] = v[k].to(device)) writes the same values back;
    assigning a key writes the runtime's state, del opt.state[p] starts it afresh."""
    if not hasattr(torch.optim, "Muon"):
        print("  (torch.optim.Muon is not in this torch: the comparison is not run)")
    torch.manual_seed(2)
    w0 = torch.randn(12, 8)
    grads = [torch.randn(12, 8) for _ in range(3)]
    for mdtype, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ours = nn.Parameter(w0.clone())
        bias = nn.Parameter(torch.zeros(12))
        opt = Muon([("w", ours), ("b", bias)], lr=0.02, config={"momentum_dtype": mdtype})
        assert ours not in opt.state and len(opt.state) == 0, list(opt.state)
        assert opt.state[ours] == {}  # as torch's defaultdict before the first step
        ref = nn.Parameter(w0.clone())
        topt = torch.optim.Muon([ref], lr=0.02) if hasattr(torch.optim, "Muon") else None
        for g in grads:
            ours.grad, bias.grad = g.clone(), g[:, 0].clone()
            opt.step()
            if topt is not None:
                ref.grad = g.clone()
                topt.step()
        st = opt.state[ours]
        assert set(st) == {"momentum", "momentum_buffer", "step"}, set(st)
        assert st["momentum_buffer"].dtype == dtype and st["momentum_buffer"].shape == ours.shape
        assert float(st["step"]) == 3.0
        if topt is not None:
            tb = topt.state[ref]["momentum_buffer"]
            r = relative(st["momentum_buffer"].float(), tb)
            bound = 1e-6 if mdtype == "fp32" else 1e-2
            assert r < bound, (mdtype, r)
        assert set(opt.state[bias]) == {"exp_avg", "exp_avg_sq", "step"}, set(opt.state[bias])
        assert len(opt.state) == 2 and set(map(id, opt.state)) == {id(ours), id(bias)}
        before = opt.state_dict()
        for p, v in opt.state.items():  # Lightning's _optimizer_to_device(optimizer, "cpu")
            for k, val in v.items():
                if k != "step":
                    v[k] = val.to("cpu")
        after = opt.state_dict()
        for i in before["state"]:
            for k in before["state"][i]:
                assert torch.equal(before["state"][i][k], after["state"][i][k]), (mdtype, i, k)
        opt.state[ours]["momentum_buffer"] = torch.ones(12, 8) * 0.05  # (1 - 0.95) * 1
        assert torch.equal(opt.state_dict()["state"][0]["momentum"].float(),
                           torch.ones(12, 8)), mdtype
        del opt.state[bias]
        assert bias not in opt.state and len(opt.state) == 1
        assert float(opt.state_dict()["state"][1]["step"]) == 0.0
        refused(lambda: opt.state[ours].__setitem__("exp_avg", torch.zeros(12, 8)), KeyError,
                "momentum_buffer")
        opt.close()


def case_parameters_added_frozen_and_meta():
    """add_param_group after construction makes the group's runtimes and steps it; a tensor
    already in the optimizer is torch's error there (not a silent second registration). A
    parameter frozen at construction and unfrozen later has a gradient the optimizer cannot
    apply: refused at step() by name, nothing stepped (torch.optim would step it). Parameters
    on the meta device are refused at construction with the way out."""
    m = model()
    opt = quiet(Muon, [m.transformer.h[0][1].weight], lr=0.02)
    opt.add_param_group({"params": list(m.transformer.h[1].parameters()), "lr": 0.01})
    assert [(g["algo"], g["lr"]) for g in opt.param_groups] == \
        [("muon", 0.02), ("muon", 0.01), ("adamw", 0.01)], opt.param_groups
    m(*batch(0)).backward()
    before = m.transformer.h[1][3].bias.detach().clone()
    opt.step()
    assert not torch.equal(before, m.transformer.h[1][3].bias)
    refused(lambda: opt.add_param_group({"params": [m.transformer.h[0][1].weight]}), ValueError,
            "more than one parameter group")
    assert len(opt.param_groups) == 3
    opt.close()
    m = model()
    m.transformer.h[0][1].weight.requires_grad_(False)  # a frozen layer
    opt = Muon(m.named_parameters(), lr=0.02, model=m)
    m(*batch(0)).backward()
    opt.step()
    m.transformer.h[0][1].weight.requires_grad_(True)  # unfrozen, as fine-tuning does
    opt.zero_grad()
    m(*batch(1)).backward()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    refused(opt.step, ValueError, "transformer.h.0.1.weight", "requires_grad was False",
            "nothing was stepped")
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())
    again = Muon(m.named_parameters(), lr=0.02, model=m)  # the way out the message gives
    again.load_state_dict(opt.state_dict())
    again.step()
    assert not torch.equal(before["transformer.h.0.1.weight"], m.transformer.h[0][1].weight)
    opt.close()
    again.close()
    with torch.device("meta"):
        lin = nn.Linear(4, 4)
    refused(lambda: Muon(lin.named_parameters()), ValueError, "weight", "meta device",
            "to_empty")


def case_compiled_model_torch_muon_arguments_and_repr():
    """The eager optimizer on a torch.compile'd model (its parameters named _orig_mod.*, its
    modules found through model=): the same bits as on the plain model. torch.optim.Muon's
    own positional arguments are taken; its 1-D refusal is not ours: 1-D tensors go to AdamW
    (docs/python.md). repr names each group's algorithm."""
    runs = []
    for compiled in (False, True):
        m = model()
        net = torch.compile(m, backend="aot_eager") if compiled else m
        opt = Muon(net.named_parameters(), lr=0.02, adamw_lr=3e-3, model=net)
        algos = {id(p): g["algo"] for g in opt.param_groups for p in g["params"]}
        assert algos[id(m.transformer.wte.weight)] == "adamw"
        assert algos[id(m.transformer.h[0][1].weight)] == "muon"
        for k in range(2):
            net(*batch(k)).backward()
            opt.step()
            opt.zero_grad()
        runs.append({n: p.detach().clone() for n, p in m.named_parameters()})
        opt.close()
    diff = [n for n in runs[0] if not torch.allclose(runs[0][n], runs[1][n], rtol=0, atol=1e-6)]
    assert not diff, f"compiled model differs in {diff}"
    w, b = nn.Parameter(torch.randn(8, 6)), nn.Parameter(torch.zeros(8))
    opt = quiet(Muon, [w, b], 0.02, 0.1, 0.95, True, (3.4445, -4.775, 2.0315), 1e-7, 5,
                "match_rms_adamw")
    assert opt.algo(w) == "muon" and opt.algo(b) == "adamw"
    text = repr(opt)
    assert text.startswith("Muon (") and "algo: muon" in text and "algo: adamw" in text, text
    opt.close()


def case_conv_kernels_and_scalars():
    """A CNN's 4-D convolution kernels (torch.optim.Muon refuses them; CIFAR-10 Muon scripts
    flatten them by hand): each is one [out, in * kh * kw] matrix for Muon, the same bits as
    that matrix registered 2-D, updated in place; its state_dict and opt.state have its
    shape. A 0-D parameter steps as torch.optim.AdamW steps it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    opt = Muon(net.named_parameters(), lr=0.02)
    assert opt.algo(net[0].weight) == "muon" and opt.algo(net[0].bias) == "adamw"
    flat = nn.Parameter(net[0].weight.detach().reshape(8, 27).clone())
    ref = Muon([("w", flat)], lr=0.02)
    for k in range(2):
        net(torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(k))).sum().backward()
        flat.grad = net[0].weight.grad.reshape(8, 27).clone()
        opt.step()
        ref.step()
        opt.zero_grad()
    assert torch.equal(net[0].weight.detach().reshape(8, 27), flat.detach())
    assert opt.state[net[0].weight]["momentum_buffer"].shape == net[0].weight.shape
    assert opt.state_dict()["state"][0]["momentum"].shape == (8, 3, 3, 3)
    opt.close()
    ref.close()
    # a 0-D parameter (CLIP's logit_scale): AdamW's step of one element, as torch.optim.AdamW
    # steps it (the binding refuses 0-D Params: torch_params registers it as shape [1])
    scale, theirs = nn.Parameter(torch.tensor(2.0)), nn.Parameter(torch.tensor(2.0))
    w = nn.Parameter(torch.randn(4, 4))
    opt = Muon([("w", w), ("logit_scale", scale)], adamw_lr=0.01)
    ref = torch.optim.AdamW([theirs], lr=0.01)
    (w.sum() * scale).backward()
    theirs.grad = scale.grad.clone()
    opt.step()
    ref.step()
    assert abs(scale.item() - theirs.item()) < 1e-6, (scale.item(), theirs.item())
    assert scale.item() != 2.0 and opt.state[scale]["exp_avg"].shape == ()
    opt.close()


def case_group_keys_and_param_names():
    """A group's own keys (a "name" a script looks groups up by) go with both of its parts,
    Muon's and AdamW's; torch >= 2.6's named groups ({"params": [...], "param_names": [...]})
    are taken, each part keeping the names of its own tensors (and the names classify: an
    embedding named so goes to AdamW)."""
    m = model()
    named = [(n, p) for n, p in m.named_parameters()]
    opt = Muon([{"params": [p for _, p in named], "param_names": [n for n, _ in named],
                 "name": "all"}], lr=0.02)
    rows = [(g["algo"], g["name"], len(g["params"]), len(g["param_names"]))
            for g in opt.param_groups]
    assert [r[:2] for r in rows] == [("muon", "all"), ("adamw", "all")], rows
    assert all(r[2] == r[3] for r in rows), rows
    by_name = {n: g["algo"] for g in opt.param_groups for n in g["param_names"]}
    assert by_name["transformer.wte.weight"] == "adamw", by_name
    m(*batch(0)).backward()
    opt.step()
    opt.close()


if __name__ == "__main__":
    cases.run("test_torch_dropin", globals())
