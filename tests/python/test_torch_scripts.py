"""shardopt.torch.Muon under more of the habits of training scripts written by others (the
second round after test_torch_dropin.py, whose models and helpers it reuses): what torch.optim
does with each, compared step by step. One process.

    test_torch_scripts.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable.

One file, over 600 lines: one suite, every case a function on the same small models, run by
one process in order (CTest runs it once), as test_torch_optim.py."""
import contextlib
import gc
import inspect
import io
import weakref

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch
import torch.nn as nn

from test_torch_dropin import batch, model, refused, relative
from test_torch_optim import python_path

import shardopt
from shardopt.torch import Muon

torch.set_num_threads(1)


def snapshot(m):
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def changed(a, b):
    return [n for n in a if not torch.equal(a[n], b[n])]


def case_group_params_list_edited():
    """A group's "params" list edited by hand after the group was made (a tensor appended, as
    progressive-unfreezing code does, one removed, one replaced in place): torch.optim steps
    the list as it is, the runtime holds the tensors the group was made with, so the step
    would leave the new one unstepped and step the removed one. Refused by name at step(),
    nothing stepped in any group; put back, the run goes on. The same tensors in another order
    step as before (bit for bit as an optimizer whose list was left alone)."""
    m, ref = model(), model()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
    ropt = Muon(ref.named_parameters(), lr=0.02, adamw_lr=3e-3, model=ref)
    m(*batch(0)).backward()
    ref(*batch(0)).backward()
    opt.step()
    ropt.step()
    extra = nn.Parameter(torch.randn(5, 5))
    extra.grad = torch.randn(5, 5)
    muon = opt.param_groups[0]["params"]
    for what, edit, undo, words in (
            ("appended", lambda: muon.append(extra), muon.pop, ("1 tensor(s) not registered",)),
            ("removed", lambda: muon.pop(0), lambda p: muon.insert(0, p),
             ("1 registered one(s) no longer listed",)),
            ("replaced", lambda: muon.__setitem__(1, extra), None, ("not registered",))):
        kept = muon[1]
        out = edit()
        before = snapshot(m)
        refused(opt.step, ValueError, "param group 0 (muon)", "'params' list was edited",
                "add_param_group", "nothing was stepped", *words)
        assert not changed(before, snapshot(m)), what
        if undo is None:
            muon[1] = kept
        elif out is None:
            undo()
        else:
            undo(out)
    muon.reverse()  # the same tensors, another order
    opt.param_groups[1]["params"] = list(opt.param_groups[1]["params"])  # a new list, the same
    for k in (1, 2):
        for mm, o in ((m, opt), (ref, ropt)):
            o.zero_grad()
            mm(*batch(k)).backward()
            o.step()
    assert not changed(snapshot(m), snapshot(ref)), changed(snapshot(m), snapshot(ref))
    opt.close()
    ropt.close()


def case_torch_optim_state_dicts():
    """A checkpoint of torch.optim.Muon (its state dict through torch.save / torch.load)
    resumes in shardopt.torch.Muon: its "momentum_buffer" is taken as the library's M times
    (1 - mu), so opt.state[p]["momentum_buffer"] is torch's after the load, and after each
    further step from the same gradients (torch's lerp and M = mu M + g agree while mu is
    constant), and the updates are torch.optim.Muon's (fp32 Newton-Schulz on both sides).
    Before, the load raised (no "momentum"). A torch.optim.AdamW checkpoint loads into AdamW
    groups and resumes as torch.optim.AdamW goes on; one saved with amsgrad=True (or
    maximize=True) is refused by name, nothing loaded, where it was taken and the run went on
    without amsgrad."""
    if not hasattr(torch.optim, "Muon"):
        print("  (torch.optim.Muon is not in this torch: case not run)")
        return
    import torch.optim._muon as tm
    from test_torch_optim import _fp32_newton_schulz
    torch.manual_seed(6)
    w0 = [torch.randn(s) * 0.1 for s in ((12, 8), (8, 20))]
    grads = [[torch.randn(w.shape) for w in w0] for _ in range(5)]
    theirs = [nn.Parameter(w.clone()) for w in w0]
    topt = torch.optim.Muon(theirs, lr=0.02, momentum=0.9)
    orig = tm._zeropower_via_newtonschulz
    tm._zeropower_via_newtonschulz = _fp32_newton_schulz
    try:
        for k in range(3):
            for p, g in zip(theirs, grads[k]):
                p.grad = g.clone()
            topt.step()
        buf = io.BytesIO()
        torch.save(topt.state_dict(), buf)
        ours = [nn.Parameter(p.detach().clone()) for p in theirs]
        opt = Muon([(f"w{i}", p) for i, p in enumerate(ours)], lr=0.02, momentum=0.9,
                   config={"ns_compute": "fp32", "comm_dtype": "fp32"})
        opt.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
        for k in range(3, 5):
            for p, q in zip(theirs, ours):
                b = topt.state[p]["momentum_buffer"]
                r = relative(opt.state[q]["momentum_buffer"], b)
                assert r < 1e-6, (k, r)
            before = [p.detach().clone() for p in theirs]
            for p, q, g in zip(theirs, ours, grads[k]):
                p.grad, q.grad = g.clone(), g.clone()
            topt.step()
            opt.step()
            worst = max(relative(q.detach() - w, p.detach() - w)
                        for p, q, w in zip(theirs, ours, before))
            print(f"  after the torch.optim.Muon checkpoint, step {k}: update within {worst:.1e}")
            assert worst < 1e-5, (k, worst)
            for p, q in zip(theirs, ours):
                q.data.copy_(p.data)  # the next step from the same point
        opt.close()
    finally:
        tm._zeropower_via_newtonschulz = orig
    # torch.optim.AdamW's checkpoint into AdamW groups; amsgrad / maximize refused
    torch.manual_seed(7)
    a, b = nn.Linear(6, 5), nn.Linear(6, 5)
    b.load_state_dict(a.state_dict())
    ta = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    for amsgrad in (False, True):
        tb = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1, amsgrad=amsgrad)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
        b(x).square().sum().backward()
        tb.step()
        tb.zero_grad()
        sd = tb.state_dict()
        opt = Muon([{"params": list(a.named_parameters()), "algo": "adamw"}], lr=1e-2,
                   weight_decay=0.1)
        if amsgrad:
            refused(lambda: opt.load_state_dict(sd), ValueError, "amsgrad = True",
                    "resume it with torch.optim")
            assert len(opt.state) == 0
            opt.close()
            continue
        a.load_state_dict(b.state_dict())
        opt.load_state_dict(sd)
        for k in (1, 2):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(k))
            for net, o in ((a, opt), (b, tb)):
                net(x).square().sum().backward()
                o.step()
                o.zero_grad()
        worst = max(relative(p.detach(), q.detach()) for p, q in zip(a.parameters(),
                                                                    b.parameters()))
        assert worst < 1e-6, worst
        opt.close()


def case_gradscaler_skips_inf_steps():
    """torch.amp.GradScaler: scale(loss).backward(), unscale_, clip_grad_norm_, step, update.
    A step whose gradients hold an inf is skipped by the scaler (opt.step is not called):
    nothing changes, parameters or state, and the scale halves; the steps around it go on. The
    fp16 path: autocast to float16 with float32 parameters (float16 parameters are refused at
    construction, docs/python.md)."""
    m = model()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    w = m.transformer.h[0][1].weight
    for k in range(4):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = m(*batch(k))
        scaler.scale(loss).backward()
        if k == 2:
            w.grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        before, state = snapshot(m), opt.state_dict()["state"]
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        moved = changed(before, snapshot(m))
        if k == 2:
            assert not moved and scaler.get_scale() == scale / 2, (moved, scaler.get_scale())
            after = opt.state_dict()["state"]
            assert all(torch.equal(state[i][key], after[i][key])
                       for i in state for key in state[i]), "state changed on a skipped step"
        else:
            assert len(moved) == len(before), (k, sorted(set(before) - set(moved)))
    opt.close()


def case_gradient_accumulation_as_torch_adamw():
    """Gradient accumulation over micro-batches with zero_grad(set_to_none=False) or True,
    called on the optimizer or on the model, and experts without tokens on some steps (.grad
    None: skipped, their step count held): AdamW groups step as torch.optim.AdamW (fp32
    rounding of the same arithmetic)."""
    for set_to_none in (False, True):
        for on in ("optimizer", "model"):
            torch.manual_seed(1)
            a = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])
            b = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])
            b.load_state_dict(a.state_dict())
            ours = Muon([{"params": list(a.named_parameters()), "algo": "adamw"}], lr=1e-2,
                        weight_decay=0.1)
            theirs = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
            for step, used in enumerate(([0, 1], [0], [2], [0, 1, 2])):
                for micro in range(3):
                    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * step
                                                                                  + micro))
                    for net in (a, b):
                        (sum(net[i](x).square().sum() for i in used) / 3).backward()
                ours.step()
                theirs.step()
                for o, net in ((ours, a), (theirs, b)):
                    (o if on == "optimizer" else net).zero_grad(set_to_none=set_to_none)
            worst = max(relative(p.detach(), q.detach())
                        for p, q in zip(a.parameters(), b.parameters()))
            assert worst < 1e-6, (set_to_none, on, worst)
            steps = [float(ours.state[p]["step"]) for p in a.parameters()]
            want = [float(theirs.state[p]["step"]) for p in b.parameters()]
            assert steps == want, (set_to_none, on, steps, want)
            ours.close()


def case_checkpoint_into_new_objects():
    """A run checkpointed mid-way (model, optimizer and a SequentialLR of LinearLR and
    CosineAnnealingWarmRestarts: their state dicts through torch.save / torch.load) resumes
    into a model, optimizer and scheduler made anew, the optimizer loaded before the model's
    weights and before model.to(...), and gives the bits of the run that went on. An
    add_param_group made before the checkpoint is made again before the load. The lr and
    weight_decay of a state dict edited by hand are those the resumed steps use."""
    L = torch.optim.lr_scheduler

    def make():
        m = model()
        opt = Muon([(n, p) for n, p in m.named_parameters() if not n.startswith(
            "transformer.h.1")], lr=0.02, adamw_lr=3e-3, model=m)
        opt.add_param_group({"params": list(m.transformer.h[1].named_parameters()),
                             "lr": 0.01})
        s = L.SequentialLR(opt, [L.LinearLR(opt, 0.1, 1.0, 2),
                                 L.CosineAnnealingWarmRestarts(opt, 3)], milestones=[2])
        return m, opt, s

    def train(m, opt, s, steps):
        for k in steps:
            m(*batch(k)).backward()
            opt.step()
            s.step()
            opt.zero_grad()

    m, opt, s = make()
    train(m, opt, s, range(7))
    full = snapshot(m)
    opt.close()
    m, opt, s = make()
    train(m, opt, s, range(3))
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "sched": s.state_dict()}, buf)
    opt.close()
    ck = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    m, opt, s = make()
    opt.load_state_dict(ck["opt"])
    m.load_state_dict(ck["model"])
    m.to("cpu")
    s.load_state_dict(ck["sched"])
    train(m, opt, s, range(3, 7))
    assert not changed(full, snapshot(m)), changed(full, snapshot(m))
    opt.close()
    # hyperparameters edited in the saved groups: taken by the resumed steps
    ck = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    for g in ck["opt"]["param_groups"]:
        g["lr"], g["weight_decay"] = 0.0, 0.5
    m, opt, s = make()
    opt.load_state_dict(ck["opt"])
    assert all((g["lr"], g["weight_decay"]) == (0.0, 0.5) for g in opt.param_groups)
    before = snapshot(m)
    m(*batch(3)).backward()
    opt.step()  # lr 0: nothing moves, whatever the decay
    assert not changed(before, snapshot(m))
    opt.close()


def case_compiled_training_step():
    """opt.step() inside a torch.compile'd function: dynamo breaks the graph at the step,
    which runs eagerly and gives the bits of the eager step, lr changed at each step. With
    fullgraph=True the error says why (step and zero_grad are torch.compiler.disable'd with the
    reason), where dynamo failed inside on an unrelated torch call."""
    m, ref = model(), model()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
    ropt = Muon(ref.named_parameters(), lr=0.02, adamw_lr=3e-3, model=ref)

    @torch.compile(backend="eager")
    def step_and_zero():
        opt.step()
        opt.zero_grad()

    for k in range(3):
        for g in opt.param_groups + ropt.param_groups:
            g["lr"] = 0.02 / (k + 1)
        m(*batch(k)).backward()
        step_and_zero()
        ref(*batch(k)).backward()
        ropt.step()
        ropt.zero_grad()
        assert not changed(snapshot(m), snapshot(ref)), (k, changed(snapshot(m), snapshot(ref)))
    for call in (opt.step, opt.zero_grad):
        if "reason" not in inspect.signature(torch.compiler.disable).parameters:
            break  # torch < 2.7: dynamo's message cannot carry the reason

        @torch.compile(backend="eager", fullgraph=True)
        def whole():
            call()

        refused(whole, Exception, "libshardopt through ctypes", "run eagerly")
    opt.close()
    ropt.close()


def case_model_zero_grad_lets_gradients_go():
    """model.zero_grad() instead of the optimizer's (HF's Trainer, modded-nanogpt): the
    gradients it drops are freed at once, as with a torch.optim optimizer, not held by the
    binding through the next forward and backward (twice the gradients' memory at the peak).
    Through the C helper, the Python path and the full check of every buffer, each giving the
    bits of the run that calls opt.zero_grad()."""
    runs = {}
    for path in ("C helper", "Python path", "full check", "opt.zero_grad()"):
        with python_path() if path == "Python path" else contextlib.nullcontext():
            m = model()
            opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
        for k in range(3):
            m(*batch(k)).backward()
            if path == "full check":
                for rt, _, _ in opt._runtimes:
                    rt._fast = None
            opt.step()
            held = [weakref.ref(p.grad) for p in m.parameters()]
            (opt if path == "opt.zero_grad()" else m).zero_grad()
            gc.collect()
            alive = sum(r() is not None for r in held)
            assert alive == 0, f"{path}, step {k}: {alive} of {len(held)} gradients still held"
        runs[path] = snapshot(m)
        opt.close()
    for path, got in runs.items():
        assert not changed(got, runs["opt.zero_grad()"]), path


def case_state_dict_of_another_shape():
    """A state dict whose tensors have the element counts of this optimizer's parameters but
    other shapes (two matrices [8, 4] and [4, 8] listed the other way round, or another model's
    state dict): refused by name before anything is loaded, where the state went in flat and
    the run went on silently (torch.optim fails at its step on the shape). The same optimizer's
    own state dict, and flat tensors, load."""
    a, b = nn.Parameter(torch.randn(8, 4)), nn.Parameter(torch.randn(4, 8))
    opt = Muon([("a", a), ("b", b)], lr=0.02)
    a.grad, b.grad = torch.randn(8, 4), torch.randn(4, 8)
    opt.step()
    sd = opt.state_dict()
    c, d = nn.Parameter(torch.randn(4, 8)), nn.Parameter(torch.randn(8, 4))
    other = Muon([("c", c), ("d", d)], lr=0.02)
    refused(lambda: other.load_state_dict(sd), ValueError, "c.momentum: shape [8, 4]",
            "the parameter's is [4, 8]", "another order")
    assert len(other.state) == 0, "a refused load set some state"
    same = Muon([("a", nn.Parameter(torch.randn(8, 4))), ("b", nn.Parameter(torch.randn(4, 8)))],
                lr=0.02)
    same.load_state_dict(sd)
    flat = {"state": {i: {k: v.reshape(-1) if v.dim() else v for k, v in st.items()}
                      for i, st in sd["state"].items()}, "param_groups": sd["param_groups"]}
    same.load_state_dict(flat)
    for o in (opt, other, same):
        o.close()


def case_muon_with_aux_adam_groups():
    """Keller Jordan's MuonWithAuxAdam groups, the optimizer swapped: dict(params=hidden
    weights, use_muon=True, lr=0.02, weight_decay=0.01) and dict(params=gains, biases,
    embeddings, use_muon=False, lr=3e-4, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.01).
    use_muon is the group's algorithm (the embeddings, unnamed 2-D tensors, go to AdamW with no
    warning), and an AdamW-only group's eps is AdamW's: its tensors step as
    torch.optim.AdamW(lr=3e-4, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.01) (gradients of
    1e-9, where eps 1e-10 against the default 1e-8 changes the update tenfold). Before, the
    embeddings went to Muon and eps was 1e-8, silently."""
    import warnings
    m, ref = model(), model()
    hidden = [p for p in m.transformer.h.parameters() if p.ndim >= 2]
    gains = [p for p in m.transformer.h.parameters() if p.ndim < 2]
    rest = [*m.transformer.wte.parameters(), *m.transformer.wpe.parameters(),
            *m.transformer.ln_f.parameters()]  # lm_head is tied to wte
    groups = [dict(params=hidden, use_muon=True, lr=0.02, weight_decay=0.01),
              dict(params=gains + rest, use_muon=False, lr=3e-4, betas=(0.9, 0.95), eps=1e-10,
                   weight_decay=0.01)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = Muon(groups)
    rows = [(g["algo"], len(g["params"]), g["lr"], g["eps"], g["use_muon"])
            for g in opt.param_groups]
    assert rows == [("muon", len(hidden), 0.02, 1e-7, True),
                    ("adamw", len(gains + rest), 3e-4, 1e-10, False)], rows
    ref_rest = [*ref.transformer.h.parameters(), *ref.transformer.wte.parameters(),
                *ref.transformer.wpe.parameters(), *ref.transformer.ln_f.parameters()]
    ref_rest = [p for p in ref_rest if p.ndim < 2 or not any(p is q for q in
                                                               ref.transformer.h.parameters())]
    radam = torch.optim.AdamW(ref_rest, lr=3e-4, betas=(0.9, 0.95), eps=1e-10,
                              weight_decay=0.01)
    gen = torch.Generator().manual_seed(3)
    for p, q in zip(gains + rest, ref_rest):
        assert p.shape == q.shape
        p.grad = torch.randn(p.shape, generator=gen) * 1e-9
        q.grad = p.grad.clone()
    before = [p.detach().clone() for p in gains + rest]
    opt.step()
    radam.step()
    worst = max(relative(p.detach() - b, q.detach() - b)
                for p, q, b in zip(gains + rest, ref_rest, before))
    assert worst < 1e-5, f"AdamW group against torch.optim.AdamW(eps=1e-10): {worst:.2e}"
    refused(lambda: Muon([dict(params=hidden, use_muon=True, algo="adamw")]), ValueError,
            "use_muon", "disagree")
    opt.close()


def case_weights_tied_through_data():
    """Two parameters over one memory, tied through .data before the optimizer is made
    (lm_head.weight.data = wte.weight.data: two Parameter objects, two gradients). torch.optim
    steps each with its own gradient, one after the other; the library updates a memory once per
    step (its step refuses overlapping data: its passes over parameters may run together), so
    the constructor refuses the pair by name, for either algorithm, instead of the step failing
    later (or, as first, dropping the second's gradient with a warning: 6e-2 to 1.3e-1 from
    torch.optim.Muon in 3 steps). Tied as one Parameter, the pair is one parameter whose
    gradient autograd sums, which works (python_torch_optim / embeddings_to_adamw_and_tied_...)."""
    torch.manual_seed(0)
    w0 = torch.randn(12, 8) * 0.1
    for algo in ("adamw", "muon"):
        a, a2 = nn.Parameter(w0.clone()), nn.Parameter(torch.empty(0))
        a2.data = a.data
        refused(lambda: Muon([{"params": [("wte.weight", a), ("lm_head.weight", a2)],
                               "algo": algo}], lr=0.02), ValueError,
                "lm_head.weight and wte.weight are two tensors over the same memory")
        # disjoint views of one storage are distinct memories: accepted
        big = nn.Parameter(torch.randn(24, 8))
        v1, v2 = nn.Parameter(big.data[:12]), nn.Parameter(big.data[12:])
        ok = Muon([{"params": [("q.weight", v1), ("k.weight", v2)], "algo": algo}], lr=0.02)
        v1.grad, v2.grad = torch.randn(12, 8), torch.randn(12, 8)
        ok.step()
        ok.close()


def case_channels_last_cnn():
    """A CNN in channels_last (model.to(memory_format=torch.channels_last), torchvision's and
    timm's --channels-last): its 4-D kernels are not contiguous, but dense in the order [out,
    kh, kw, in], and are registered so (Muon's matrix is [out, kh kw in], the columns of [out,
    in kh kw] permuted, which Newton-Schulz commutes with). The steps give the contiguous
    model's (fp32 Newton-Schulz, the same gradients: within 1e-5), opt.state and state_dict()
    hold the kernel's state in its own shape, and a state dict moves between the two layouts.
    Before, construction raised (the local shard is not contiguous), where torch.optim takes
    any layout."""
    torch.manual_seed(0)
    cfg = {"ns_compute": "fp32", "comm_dtype": "fp32"}

    def cnn():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten(),
                             nn.Linear(4 * 4 * 4, 10))

    cl, ref = cnn().to(memory_format=torch.channels_last), cnn()
    assert not cl[0].weight.is_contiguous()
    opt, ropt = Muon(cl.named_parameters(), lr=0.02, config=cfg), \
        Muon(ref.named_parameters(), lr=0.02, config=cfg)
    start = snapshot(ref)
    for k in range(3):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(k))
        cl(x.to(memory_format=torch.channels_last)).sum().backward()
        for p, q in zip(cl.parameters(), ref.parameters()):
            q.grad = p.grad.contiguous()  # the same gradients: the layouts' sums differ
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
    assert cl[0].weight.is_contiguous(memory_format=torch.channels_last)
    mine, theirs = snapshot(cl), snapshot(ref)
    worst = max(relative(mine[n] - start[n], theirs[n] - start[n]) for n in mine)
    assert worst < 1e-5, worst
    for w, rw in ((cl[0].weight, ref[0].weight), (cl[2].weight, ref[2].weight)):
        r = relative(opt.state[w]["momentum_buffer"], ropt.state[rw]["momentum_buffer"])
        assert r < 1e-6 and opt.state[w]["momentum_buffer"].shape == w.shape, r
    sd, rsd = opt.state_dict(), ropt.state_dict()
    assert all(relative(sd["state"][i]["momentum"], rsd["state"][i]["momentum"]) < 1e-6
               for i in (0, 2)), "state_dict() of the channels_last kernels"
    opt.load_state_dict(rsd)  # the contiguous model's state into the channels_last one
    assert all(torch.equal(opt.state_dict()["state"][i]["momentum"], rsd["state"][i]["momentum"])
               for i in (0, 2))
    ropt.load_state_dict(sd)
    opt.close()
    ropt.close()


def case_transposed_matrices():
    """A matrix parameter stored transposed (nn.Parameter(w.t()), or p.data = w.t() before the
    optimizer is made, as checkpoint converters write it): registered as the [in, out] matrix
    it is in memory with the library's `transposed` flag, so Muon's lr scale and Newton-Schulz
    use its true [out, in] shape: the bits of the same matrix stored [out, in], within 1e-5 of
    torch.optim.Muon (fp32 Newton-Schulz), its state in the parameter's shape; a gradient
    assigned by hand in the other layout is read from a copy (the same bits); AdamW steps it
    as torch.optim.AdamW. Before, construction raised (not contiguous)."""
    if not hasattr(torch.optim, "Muon"):
        print("  (torch.optim.Muon is not in this torch: case not run)")
        return
    import torch.optim._muon as tm
    from test_torch_optim import _fp32_newton_schulz
    cfg = {"ns_compute": "fp32", "comm_dtype": "fp32"}
    torch.manual_seed(0)
    w0 = torch.randn(24, 16) * 0.1
    t = nn.Parameter(w0.t().contiguous().t())  # [24, 16], stored [16, 24]
    c, r = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    assert not t.is_contiguous()
    ot, oc = Muon([("t", t)], lr=0.02, config=cfg), Muon([("c", c)], lr=0.02, config=cfg)
    ref = torch.optim.Muon([r], lr=0.02)
    orig, tm._zeropower_via_newtonschulz = tm._zeropower_via_newtonschulz, _fp32_newton_schulz
    try:
        for k in range(4):
            g = torch.randn(24, 16, generator=torch.Generator().manual_seed(k))
            # autograd's layout (the parameter's) on even steps, by hand contiguous on odd ones
            t.grad = g.t().contiguous().t() if k % 2 == 0 else g.clone()
            c.grad, r.grad = g.clone(), g.clone()
            ot.step()
            oc.step()
            ref.step()
            assert torch.equal(t.detach(), c.detach()), k
            assert relative(t.detach() - w0, r.detach() - w0) < 1e-5, k
    finally:
        tm._zeropower_via_newtonschulz = orig
    buf = ot.state[t]["momentum_buffer"]
    assert buf.shape == t.shape and relative(buf, ref.state[r]["momentum_buffer"]) < 1e-6
    x = nn.Parameter(torch.randn(16, 24).t())
    y = nn.Parameter(x.detach().clone())
    ox = Muon([{"params": [("x", x)], "algo": "adamw"}], lr=0.01)
    oy = torch.optim.AdamW([y], lr=0.01)
    for k in range(3):
        g = torch.randn(24, 16, generator=torch.Generator().manual_seed(10 + k))
        x.grad, y.grad = g.t().contiguous().t(), g.clone()
        ox.step()
        oy.step()
    assert relative(x.detach(), y.detach()) < 1e-6
    for o in (ot, oc, ox):
        o.close()


def case_non_contiguous_gradients():
    """A gradient assigned by hand that is not in its parameter's memory order (g.t() of a
    product computed [in, out], an expand() of a broadcast value, a strided slice): torch.optim
    steps it. Read from a contiguous copy, held through the step: the bits of the same
    gradients made contiguous, through the C helper and the Python path, the bias as
    torch.optim.AdamW's, and the script's .grad left as it gave it. Before, step() raised
    (`the torch tensor must be strided and contiguous`)."""
    from test_torch_optim import step_paths
    for path, ctx in step_paths():
        with ctx():
            torch.manual_seed(0)
            m, r, a = nn.Linear(8, 6), nn.Linear(8, 6), nn.Linear(8, 6)
            r.load_state_dict(m.state_dict())
            a.load_state_dict(m.state_dict())
            opt = Muon(m.named_parameters(), lr=0.02)
            ropt = Muon(r.named_parameters(), lr=0.02)
            aopt = torch.optim.AdamW([a.bias], lr=0.02)  # Muon's AdamW defaults
            for k in range(4):
                gen = torch.Generator().manual_seed(k)
                gw = (torch.randn(8, 6, generator=gen).t() if k % 2 == 0
                      else torch.randn(6, 1, generator=gen).expand(6, 8))
                gb = torch.randn(6, 2, generator=gen)[:, 0]
                assert not gw.is_contiguous() and not gb.is_contiguous()
                m.weight.grad, m.bias.grad = gw, gb
                r.weight.grad, r.bias.grad = gw.contiguous(), gb.contiguous()
                a.bias.grad = gb.contiguous()
                opt.step()
                ropt.step()
                aopt.step()
                assert torch.equal(m.weight, r.weight), (path, k)
                assert torch.equal(m.bias, r.bias), (path, k)
                assert relative(m.bias.detach(), a.bias.detach()) < 1e-6, (path, k)
                assert m.weight.grad is gw and m.bias.grad is gb, (path, k)
            # contiguous gradients again: the comparison takes them as before
            m.weight.grad, r.weight.grad = torch.ones(6, 8), torch.ones(6, 8)
            m.bias.grad, r.bias.grad = torch.ones(6), torch.ones(6)
            opt.step()
            ropt.step()
            assert torch.equal(m.weight, r.weight) and torch.equal(m.bias, r.bias), path
            opt.close()
            ropt.close()


def case_model_dtype_changed_after_construction():
    """model.to(torch.bfloat16) / .half() / .double() after the optimizer was made: torch.optim
    follows it (its state is made at the first step); the runtime holds kernels and state for
    the dtype it registered, so the step refuses, naming the parameter, the dtype now and then,
    the likely cause and the way out; nothing is written. That way out (a new optimizer after
    the cast, the old state loaded into it) then steps. Before, bf16 said `48 bf16 elements;
    it was registered with 48 fp32` and float16 / float64 only that the dtype is not float32
    or bfloat16, as if the parameter had been given so."""
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        torch.manual_seed(0)
        m = nn.Linear(8, 6)
        opt = Muon(m.named_parameters(), lr=0.02)
        m(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        m.to(dt)
        m(torch.randn(2, 8, dtype=dt)).sum().backward()
        before = snapshot(m)
        refused(opt.step, ValueError, "weight.data is now " + str(dt), "registered as fp32",
                "after the optimizer was made", "load_state_dict(old.state_dict())")
        assert not changed(before, snapshot(m)), dt
        if dt is torch.bfloat16:
            new = Muon(m.named_parameters(), lr=0.02)
            new.load_state_dict(opt.state_dict())
            new.step()
            assert changed(before, snapshot(m)) == ["weight", "bias"], dt
            assert new.state[m.weight]["step"] == 2
            new.close()
        opt.close()


def case_mixed_groups_and_per_group_lists():
    """HF's grouping (decay: every matrix and the embeddings; no_decay: biases and norms) gives
    a group holding both Muon and AdamW tensors, split in two: param_groups is longer than the
    script's list, so torch's schedulers refuse a list per group of the script's length
    (LambdaLR(opt, [f, g]), OneCycleLR(max_lr=[a, b])) and zip(opt.param_groups, ...) pairs
    them wrongly, silently. The constructor (and add_param_group) warns which group given went
    to which param_groups entries and what to do; a list of len(opt.param_groups) then works,
    as do separate groups by algorithm (no warning; the lrs a torch optimizer with those groups
    gets). Groups of one algorithm, and model.named_parameters(), do not warn. Before: no word
    until torch's "Expected 3 lr_lambdas, but got 2"."""
    import warnings
    m = model()
    nd = ("bias", "ln_", "LayerNorm.weight", "norm")
    decay = [p for n, p in m.named_parameters() if not any(k in n for k in nd)]
    no_decay = [p for n, p in m.named_parameters() if any(k in n for k in nd)]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt = Muon(groups, lr=1e-3, model=m)
    said = [str(x.message) for x in w if "split by algorithm" in str(x.message)]
    assert len(said) == 1 and "0 -> [0, 1], 1 -> [2]" in said[0], [str(x.message) for x in w]
    assert "needs one entry per opt.param_groups entry" in said[0] and \
        "separate groups" in said[0] and w[0].filename == __file__, said
    assert [g["algo"] for g in opt.param_groups] == ["muon", "adamw", "adamw"]
    f, g = (lambda s: 1.0), (lambda s: 0.5)
    refused(lambda: torch.optim.lr_scheduler.LambdaLR(opt, [f, g]), ValueError, "Expected 3")
    sch = torch.optim.lr_scheduler.LambdaLR(opt, [f, f, g])  # as the warning says
    assert sch.get_last_lr() == [1e-3, 1e-3, 5e-4], sch.get_last_lr()
    extra = nn.Parameter(torch.randn(4, 4))
    bias = nn.Parameter(torch.randn(4))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.add_param_group({"params": [("extra", extra), ("extra_bias", bias)]})
    assert any("0 -> [3, 4]" in str(x.message) for x in w), [str(x.message) for x in w]
    opt.close()
    # separate groups by algorithm: the script's list as given, against torch.optim.AdamW
    mats = [p for p in decay if p.ndim == 2 and p is not m.transformer.wte.weight
            and p is not m.transformer.wpe.weight]
    emb = [m.transformer.wte.weight, m.transformer.wpe.weight]
    sep = [{"params": mats, "algo": "muon"}, {"params": emb, "algo": "adamw"},
           {"params": no_decay, "algo": "adamw", "weight_decay": 0.0}]
    # the torch optimizer's lrs only: its own tensors, without gradients (its step writes none)
    ref = torch.optim.AdamW([{"params": [nn.Parameter(torch.zeros(1))]} for _ in sep], lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = Muon(sep, lr=1e-3)
        Muon(m.named_parameters(), lr=1e-3, model=m).close()
    scheds = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=[1e-2, 3e-3, 3e-3], total_steps=10,
                                                  cycle_momentum=False) for o in (opt, ref)]
    for k in range(3):
        opt.zero_grad()
        m(*batch(k)).backward()
        opt.step()
        ref.step()
        for s in scheds:
            s.step()
        assert scheds[0].get_last_lr() == scheds[1].get_last_lr(), k
    opt.close()


def case_distributed_state_dict_one_process():
    """torchtitan's and torchtune's checkpoint calls on one process:
    torch.distributed.checkpoint.state_dict.get_state_dict(model, opt) (FQN-keyed state, with
    and without flatten_optimizer_state_dict, as torchtitan sets it), through torch.save and
    torch.load(weights_only=True), set_state_dict into a new model and optimizer (whose
    _init_optim_state runs one step at lr 0 with zero gradients first), a layer frozen at
    construction: the resumed steps are the uninterrupted run's bits."""
    import torch.distributed.checkpoint.state_dict as dsd

    def run(m, opt, first, n):
        for k in range(first, first + n):
            m(*batch(k)).backward()
            opt.step()
            opt.zero_grad()

    def make():
        m = model()
        for p in m.transformer.h[0].parameters():
            p.requires_grad_(False)
        return m, Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)

    for flat in (False, True):
        options = dsd.StateDictOptions(flatten_optimizer_state_dict=flat)
        m, opt = make()
        run(m, opt, 0, 3)
        msd, osd = dsd.get_state_dict(m, opt, options=options)
        assert ("state.transformer.h.1.1.weight.momentum" in osd if flat else
                set(osd["state"]["transformer.h.1.1.weight"]) == {"momentum", "momentum_buffer",
                                                                  "step"}), flat
        buf = io.BytesIO()
        torch.save({"model": msd, "optim": osd}, buf)
        run(m, opt, 3, 2)
        m2, opt2 = make()
        ck = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
        dsd.set_state_dict(m2, opt2, model_state_dict=ck["model"], optim_state_dict=ck["optim"],
                           options=options)
        run(m2, opt2, 3, 2)
        assert not changed(snapshot(m), snapshot(m2)), flat
        assert opt2.state[m2.transformer.h[1][1].weight]["step"] == 5, flat
        opt.close()
        opt2.close()


def case_param_groups_reordered_or_reassigned():
    """opt.param_groups reordered in place, or assigned again (accelerate's wrapper forwards
    its param_groups setter: `self.optimizer.param_groups = value`; here also new dicts over
    the same tensors): torch.optim reads the list afresh at every step. Each group is stepped by
    the runtime holding its tensors, with its own lr: the bits of an optimizer whose list was
    left alone, its state and state_dict() too. A list that drops a group, or a group made by
    hand, is refused by name, nothing stepped; put back, the run goes on. Before, the runtimes
    were paired by position: a reordered list was refused as "eps changed" or "its 'params'
    list was edited"."""
    m, ref = model(), model()

    def groups(mm):
        h = [p for p in mm.transformer.h.parameters() if p.ndim == 2]
        rest = [p for p in mm.parameters() if p.ndim < 2 or p is mm.transformer.wte.weight
                or p is mm.transformer.wpe.weight]
        return [{"params": h[:2], "algo": "muon", "lr": 0.02},
                {"params": h[2:], "algo": "muon", "lr": 0.005},
                {"params": rest, "algo": "adamw", "lr": 3e-3}]

    opt, ropt = Muon(groups(m)), Muon(groups(ref))

    def step(k):
        for mm, o in ((m, opt), (ref, ropt)):
            o.zero_grad()
            mm(*batch(k)).backward()
            o.step()
        assert not changed(snapshot(m), snapshot(ref)), k

    step(0)
    opt.param_groups.reverse()  # in place
    step(1)
    opt.param_groups = [dict(g) for g in opt.param_groups[1:] + opt.param_groups[:1]]
    step(2)
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        a, b = opt.state[p], ropt.state[q]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), n
    rsd = ropt.state_dict()
    by_lr = {g["lr"]: g for g in opt.state_dict()["param_groups"]}
    assert all(by_lr[g["lr"]]["algo"] == g["algo"] for g in rsd["param_groups"])
    kept = list(opt.param_groups)
    before = snapshot(m)
    for bad, words in ((kept[:2], "cannot be dropped"),
                       (kept[:2] + [{"params": [nn.Parameter(torch.ones(2))], "lr": 1.0}],
                        "opt.param_groups[2] is not one of this optimizer's groups")):
        opt.param_groups = bad
        m.zero_grad()
        m(*batch(3)).backward()
        refused(opt.step, ValueError, words, "load_state_dict(old.state_dict())")
        assert not changed(before, snapshot(m))
    opt.param_groups = kept
    ropt.zero_grad()
    ref(*batch(3)).backward()
    opt.step()
    ropt.step()
    assert not changed(snapshot(m), snapshot(ref))
    opt.close()
    ropt.close()


def case_cyclic_lr_momentum():
    """CyclicLR, whose cycle_momentum=True is its default as OneCycleLR's: it writes every
    group's momentum, a Muon group's read at each step and an AdamW group's taken as its beta1
    (betas[0] follows it at the step; before, the step refused it, naming CyclicLR and
    cycle_momentum=False). With it or without, on Muon + AdamW groups or Muon groups only, the
    lrs and momenta are a torch optimizer's with the same groups."""
    L = torch.optim.lr_scheduler
    for muon_only, cycle in ((False, True), (False, False), (True, True)):
        m = model()
        if muon_only:
            mats = [p for p in m.transformer.h.parameters() if p.ndim == 2]
            opt = Muon([{"params": mats, "algo": "muon"}], lr=0.02)
            ref = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.02, momentum=0.95)
        else:
            opt = Muon(m.named_parameters(), lr=0.02, model=m)
            ref = torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(1))]} for _ in range(2)],
                                  lr=0.02, momentum=0.95)
        kw = dict(step_size_up=2, cycle_momentum=cycle)
        scheds = [L.CyclicLR(o, 1e-3, 1e-2, **kw) for o in (opt, ref)]
        for k in range(4):
            opt.zero_grad()
            m(*batch(k)).backward()
            opt.step()
            ref.step()
            for g in opt.param_groups:
                if g["algo"] == "adamw":  # its beta1, as the step took it
                    assert g["betas"][0] == g["momentum"], (cycle, k, g["betas"])
            for sc in scheds:
                sc.step()
            assert scheds[0].get_last_lr() == scheds[1].get_last_lr(), (muon_only, k)
            if muon_only or cycle:
                assert [g["momentum"] for g in opt.param_groups] == \
                    [g["momentum"] for g in ref.param_groups], (muon_only, k)
        opt.close()


class _AcceleratedOptimizer(torch.optim.Optimizer):
    """accelerate's AcceleratedOptimizer as it calls the optimizer it wraps (no
    super().__init__: every attribute forwarded, param_groups with its setter), its
    GradientState reduced to sync_gradients."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.sync_gradients = True
        self._is_overflow = False
        # device_placement: the state dict moved to the device and loaded back at once
        state_dict = self.optimizer.state_dict()
        state_dict = {k: v for k, v in state_dict.items()}
        self.optimizer.load_state_dict(state_dict)

    state = property(lambda self: self.optimizer.state,
                     lambda self, v: setattr(self.optimizer, "state", v))
    param_groups = property(lambda self: self.optimizer.param_groups,
                            lambda self, v: setattr(self.optimizer, "param_groups", v))
    defaults = property(lambda self: self.optimizer.defaults,
                        lambda self, v: setattr(self.optimizer, "defaults", v))

    def add_param_group(self, param_group):
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self):
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none=None):
        if self.sync_gradients:
            if "set_to_none" in inspect.signature(self.optimizer.zero_grad).parameters:
                self.optimizer.zero_grad(set_to_none=True if set_to_none is None
                                         else set_to_none)
            else:
                self.optimizer.zero_grad()

    def train(self):
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()

    def eval(self):
        if hasattr(self.optimizer, "eval") and callable(self.optimizer.eval):
            self.optimizer.eval()

    def step(self, closure=None):
        if self.sync_gradients:
            self.optimizer.step(closure)

    def _switch_parameters(self, parameters_map):
        for param_group in self.optimizer.param_groups:
            param_group["params"] = [parameters_map.get(p, p) for p in param_group["params"]]

    @property
    def step_was_skipped(self):
        return self._is_overflow


def case_accelerate_wrapped_optimizer():
    """accelerate's prepare(): the optimizer wrapped in AcceleratedOptimizer (state dict
    loaded back at wrap time, param_groups / state / defaults forwarded with setters,
    zero_grad and step only at accumulation boundaries, train() / eval(), _switch_parameters
    rebuilding each group's list), the scheduler built on the raw optimizer and stepped by
    AcceleratedScheduler's rule (not on skipped steps or between boundaries), gradient
    accumulation over 2 micro-batches with clip_grad_norm_, a checkpoint through the wrapper:
    the bits of the same loop on the bare optimizer, and no torch warning about the order of
    optimizer.step() and lr_scheduler.step()."""
    import warnings
    accum = 2

    def run(wrap):
        m = model()
        opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
        o = _AcceleratedOptimizer(opt) if wrap else opt
        if wrap:
            o.param_groups = o.param_groups
            o._switch_parameters({})
            o.train()
        for k in range(3 * accum):
            boundary = (k + 1) % accum == 0
            if wrap:
                o.sync_gradients = boundary
            (m(*batch(k)) / accum).backward()
            if boundary:
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            if wrap or boundary:
                o.step()
                if boundary and not getattr(o, "step_was_skipped", False):
                    sched.step()
                o.zero_grad()
        if wrap:
            o.eval()
        sd = o.state_dict()
        o.load_state_dict(sd)
        return m, opt, [g["lr"] for g in o.param_groups]

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m, opt, lrs = run(True)
    said = [str(x.message) for x in w if "lr_scheduler" in str(x.message)]
    assert not said, said
    r, ropt, rlrs = run(False)
    assert lrs == rlrs and not changed(snapshot(m), snapshot(r)), (lrs, rlrs)
    opt.close()
    ropt.close()


def case_memory_format_changed_after_construction():
    """model.to(memory_format=torch.channels_last) after the optimizer was made (and back):
    torch.optim follows it; the runtime holds its state in the memory order it registered, so
    the step refuses, naming the parameter, its strides now and the way out, nothing written.
    That way out (a new optimizer after the change, the old state loaded into it) then steps
    within 1e-5 of the model left contiguous (fp32 Newton-Schulz). Before: `0.weight.data: the
    torch tensor must be strided and contiguous`, as if given so."""
    cfg = {"ns_compute": "fp32", "comm_dtype": "fp32"}
    cl = torch.channels_last

    def cnn():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(),
                             nn.Linear(8 * 4 * 4, 5))

    def loss(m, k, fmt=torch.contiguous_format):
        g = torch.Generator().manual_seed(k)
        return m(torch.randn(4, 3, 8, 8, generator=g).to(memory_format=fmt)).square().mean()

    for there, back in ((cl, torch.contiguous_format), (torch.contiguous_format, cl)):
        m, r = cnn().to(memory_format=there), cnn().to(memory_format=there)
        opt = Muon(m.named_parameters(), lr=0.02, config=cfg)
        ropt = Muon(r.named_parameters(), lr=0.02, config=cfg)
        for o, mm in ((opt, m), (ropt, r)):
            loss(mm, 0, there).backward()
            o.step()
            o.zero_grad()
        m.to(memory_format=back)
        loss(m, 1, back).backward()
        before = snapshot(m)
        refused(opt.step, ValueError, "0.weight.data is not contiguous in the memory order it "
                "was registered in", "now strides", "model.to(memory_format=...)",
                "load_state_dict(old.state_dict())")
        assert not changed(before, snapshot(m)), there
        new = Muon(m.named_parameters(), lr=0.02, config=cfg)
        new.load_state_dict(opt.state_dict())
        new.step()
        loss(r, 1, there).backward()
        ropt.step()
        for (n, a), b in zip(m.named_parameters(), r.parameters()):
            assert relative(a.detach(), b.detach()) < 1e-5, (there, n)
        for o in (opt, ropt, new):
            o.close()


class _LightningOptimizer:
    """Lightning's LightningOptimizer as it wraps a torch optimizer: a copy of the optimizer's
    __dict__ (the same lists and dicts, not copies), a class made on the fly deriving from both
    (isinstance checks pass), step() forwarded to the optimizer with the closure."""

    def __init__(self, optimizer):
        self.__dict__ = {k: v for k, v in optimizer.__dict__.items() if k not in ("step",
                                                                                  "__del__")}
        self._optimizer = optimizer
        self.__class__ = type("Lightning" + optimizer.__class__.__name__,
                              (self.__class__, optimizer.__class__), {})

    def step(self, closure=None, **kwargs):
        return self._optimizer.step(closure=closure or (lambda: None), **kwargs)


def case_lightning_optimizer_wrapper():
    """Lightning's automatic optimization: the optimizer wrapped in LightningOptimizer (its
    __dict__ shared, its class derived on the fly), zero_grad() and the closure's backward
    inside step(closure=...), a StepLR on the raw optimizer, state_dict() / load_state_dict()
    and param_groups reordered through the wrapper: the bits of the bare optimizer's loop."""
    m, r = model(), model()
    raw = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
    ref = Muon(r.named_parameters(), lr=0.02, adamw_lr=3e-3, model=r)
    lo = _LightningOptimizer(raw)
    assert isinstance(lo, Muon) and type(lo).__name__ == "LightningMuon"
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, 0.5) for o in (raw, ref)]
    for k in range(4):
        if k == 2:
            lo.load_state_dict(lo.state_dict())
            lo.param_groups.reverse()

        def closure():
            loss = m(*batch(k))
            lo.zero_grad()
            loss.backward()
            return loss

        assert lo.step(closure=closure) is not None
        ref.zero_grad()
        r(*batch(k)).backward()
        ref.step()
        for sc in scheds:
            sc.step()
        assert not changed(snapshot(m), snapshot(r)), k
    assert len(lo.state_dict()["state"]) == len(ref.state_dict()["state"])
    raw.close()
    ref.close()


def case_wrapped_model_names():
    """A model's named_parameters() through the wrappers scripts put around it: DDP's and
    DataParallel's module., torch.compile's _orig_mod., FSDP1's _fsdp_wrapped_module. and
    activation checkpointing's _checkpoint_wrapped_module. components. Each tensor gets the
    algorithm it gets under the bare model's names: llama's head (output.weight, the exact
    pattern =output.weight) goes to AdamW, where before under module.output.weight it went to
    Muon, silently; a hidden matrix whose name holds "output" elsewhere stays Muon's."""
    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(16, 8)
            self.layers = nn.ModuleList([nn.ModuleDict({"output": nn.Linear(8, 8)})])
            self.norm = nn.LayerNorm(8)
            self.output = nn.Linear(8, 16, bias=False)

    m = Llama()
    bare = Muon(m.named_parameters(), lr=0.02)
    want = [bare.algo(p) for p in m.parameters()]
    assert want == ["adamw", "muon", "adamw", "adamw", "adamw", "adamw"], want
    bare.close()
    fsdp1 = [(n.replace("layers.0.", "layers.0._fsdp_wrapped_module."
                        "_checkpoint_wrapped_module.").replace("output.weight", "_fsdp_wrapped"
                                                               "_module.output.weight"), p)
             for n, p in m.named_parameters()]
    for what, named in (("torch.compile", torch.compile(m).named_parameters()),
                        ("DataParallel", nn.DataParallel(m).named_parameters()),
                        ("compiled DDP names", [("_orig_mod.module." + n, p)
                                                for n, p in m.named_parameters()]),
                        ("FSDP1 and checkpoint wrappers", fsdp1)):
        named = list(named)
        assert any(n != b for (n, _), (b, _) in zip(named, m.named_parameters())), what
        opt = Muon(named, lr=0.02)
        got = [opt.algo(p) for p in m.parameters()]
        assert got == want, (what, got)
        opt.close()


if __name__ == "__main__":
    cases.run("test_torch_scripts", globals())
