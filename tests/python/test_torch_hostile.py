"""shardopt.torch.Muon given hostile values a script can reach after construction: a group's
hyperparameters set to what the library reads as "the config's", a gradient of another shape
assigned through .data, a state dict whose values the library refuses. Each must be refused by
name with nothing stepped or loaded. One process.

    test_torch_hostile.py [CASE ...]     every case when none is named

Exit 77 (skip) only where torch is not importable."""
import warnings

import cases

cases.need_torch()  # exit 77 (skip) where torch is not importable
import torch

from test_torch_dropin import refused
from test_torch_optim import step_paths

from shardopt.torch import Muon

torch.set_num_threads(1)


def two(seed=0, **kw):
    """A Muon matrix and an AdamW vector, one step taken (so the state exists)."""
    torch.manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(4, 8))
    b = torch.nn.Parameter(torch.randn(4))
    opt = Muon([("w", w), ("b", b)], lr=0.02, **kw)
    w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
    opt.step()
    return w, b, opt


def values(*ts):
    return [t.detach().clone() for t in ts]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def state(opt):
    return {k: {kk: vv.clone() for kk, vv in v.items()}
            for k, v in opt.state_dict()["state"].items()}


def same_state(a, b):
    return a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys() and all(torch.equal(a[k][kk], b[k][kk]) for kk in a[k])
        for k in a)


def case_group_values_the_library_reads_as_unset_are_refused():
    """A group's weight_decay or (Muon) momentum written below 0 after construction, or lr
    = -1: the library reads a negative weight_decay or momentum as "the config's" and lr = -1
    as "not set", so -0.5 stepped with the values given at construction, silently, and an
    AdamW group's lr = -1 was called "not set" after the Muon group had stepped. Each is refused
    before any group steps, naming the group, the key and the value; put back, the step goes
    on."""
    for algo, key, v in (("muon", "weight_decay", -0.5), ("adamw", "weight_decay", -1e-9),
                         ("muon", "momentum", -0.5), ("muon", "lr", -1.0),
                         ("adamw", "lr", -1.0)):
        written_refused(algo, key, v, f"({algo}): {key} = {v!r}: accepted")


def written_refused(algo, key, v, *words):
    """Writes v into the (algo) group's key after a step: the next step is refused with words
    and "nothing was stepped", nothing stepped; with the old value back, it steps."""
    w, b, opt = two()
    g = next(g for g in opt.param_groups if g["algo"] == algo)
    old = g[key]
    g[key] = v
    w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
    before = values(w, b)
    refused(opt.step, ValueError, *words, "nothing was stepped")
    assert same(before, values(w, b)), (algo, key, "stepped")
    g[key] = old
    opt.step()
    assert not torch.equal(before[0], w.detach()) and not torch.equal(before[1], b.detach())


def case_gradient_of_another_shape_is_refused():
    """param.grad.data = g of the parameter's element count in another shape ([8, 4] for a
    [4, 8] matrix): torch's .grad setter refuses it, .data does not. The binding read it as the
    parameter's matrix, a silently wrong update, on the first step and on every later one
    through the comparison (C helper and Python path alike); torch.optim fails on the shapes.
    Refused naming both shapes, nothing written."""
    for path, ctx in step_paths():
        for first in (True, False):
            with ctx():
                w, b, opt = two()
                if not first:
                    w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
                    opt.step()  # the comparison now holds these tensors
                w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
                w.grad.data = torch.randn(8, 4)
                before = values(w, b)
                refused(opt.step, ValueError, "w.grad has shape [8, 4]", "is [4, 8]")
                assert same(before, values(w, b)), (path, first)
                w.grad = torch.randn(4, 8)
                opt.step()
                assert not torch.equal(before[0], w.detach()), (path, first)


def case_load_state_dict_refuses_values_before_setting_any():
    """A state dict holding values the library's param_set_state refuses (NaN or Inf, a
    negative exp_avg_sq), or a step count that is not a whole number (2.5 was taken as 2, the
    text "3" as 3) or past the library's [0, 2^53): refused naming the tensor, the element and
    the value, before any tensor is set. Before: the refusal came from the library after the tensors before it had been set,
    so the optimizer was left with the new momentum and step of w and the old state of b."""
    def put(i, k, f):
        return lambda sd: sd["state"][i].__setitem__(k, f(sd["state"][i][k]))
    bad = [(put(1, "exp_avg_sq", lambda t: t * float("nan")), "b.exp_avg_sq: element 0 is nan"),
           (put(1, "exp_avg_sq", lambda t: -t - 1), "b.exp_avg_sq: element 0 is -"),
           (put(1, "exp_avg", lambda t: t.index_fill(0, torch.tensor([2]), -float("inf"))),
            "b.exp_avg: element 2 is -inf"),
           (put(1, "step", lambda t: torch.tensor(2.5)), "b: step = 2.5"),
           (put(1, "step", lambda t: "3"), "b: step = '3'"),
           (put(1, "step", lambda t: torch.tensor(float("nan"))), "b: step = nan"),
           (put(1, "step", lambda t: -3), "b: step = -3"),
           (put(1, "step", lambda t: 1 << 60), f"b: step = {1 << 60}")]
    for mutate, words in bad:
        w, b, opt = two()
        _, _, other = two(seed=1)
        for _ in range(2):
            other.step()
        sd = other.state_dict()
        mutate(sd)
        before = state(opt)
        refused(lambda: opt.load_state_dict(sd), ValueError, words, "nothing was loaded")
        assert same_state(before, state(opt)), (words, "half loaded")
    w, b, opt = two()
    _, _, other = two(seed=1)
    opt.load_state_dict(other.state_dict())  # the clean state dict loads
    assert same_state(state(other), state(opt))


def case_a_tensor_in_two_groups_is_refused():
    """The same tensor in two param groups given to the constructor (the second with its own
    lr): torch.optim's ValueError, as add_param_group already gave. Before: a warning calling it
    a tied weight, the tensor registered in the first group only and the second group's lr and
    weight_decay never applied to it. A tensor listed twice in one group (a tied weight under
    named_parameters(remove_duplicate=False)) is still registered once, with a warning."""
    w, b = torch.nn.Parameter(torch.randn(4, 8)), torch.nn.Parameter(torch.randn(4))
    refused(lambda: Muon([{"params": [("w", w)]}, {"params": [("w2", w), ("b", b)], "lr": 0.1}],
                         lr=0.02),
            ValueError, "some parameters appear in more than one parameter group",
            "w2 is w of an earlier group")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt = Muon([("w", w), ("w2", w), ("b", b)], lr=0.02)
    assert any("tied weight listed twice" in str(x.message) for x in seen)
    assert sum(len(g["params"]) for g in opt.param_groups) == 2


def case_text_hyperparameters_are_refused():
    """A group's lr, weight_decay, (Muon) momentum, (AdamW) betas or eps given as text ("0.1",
    as from a config file read without conversion): float() took it as the number, where
    torch.optim fails on it at the step. Refused naming the group and the key, nothing
    stepped; put back, the step goes on."""
    for algo, key, v in (("muon", "lr", "0.1"), ("adamw", "lr", "0.1"),
                         ("muon", "weight_decay", "0"), ("adamw", "weight_decay", b"0"),
                         ("muon", "momentum", "0.9"), ("adamw", "betas", ("0.9", 0.95)),
                         ("adamw", "eps", "1e-8")):
        # two()'s groups: 0 the Muon matrix, 1 the AdamW vector
        written_refused(algo, key, v, f"param group {int(algo == 'adamw')} ({algo})",
                        f"{key} = {v!r}")


def case_state_dicts_of_other_adam_family_optimizers():
    """torch.optim.NAdam's state dict (its mu_product) or Adamax's (exp_inf) into an AdamW
    group: the keys this class does not step were dropped and the run went on as AdamW with
    the moments it shares, silently. Refused naming the key, the parameter and the optimizer it
    comes from, nothing loaded. torch.optim.Adam's (and RAdam's, NAdam's) group with weight decay
    decays L2, not decoupled: refused naming decoupled_weight_decay. Adam's and RAdam's without
    weight decay hold AdamW's state and arithmetic's moments, and load (as torch.optim.AdamW
    loads them)."""
    def foreign(cls, **kw):
        torch.manual_seed(3)
        p = torch.nn.Parameter(torch.randn(4))
        o = cls([p], lr=1e-2, **kw)
        p.grad = torch.randn(4)
        o.step()
        return o.state_dict()

    def into():
        b = torch.nn.Parameter(torch.randn(4))
        opt = Muon([{"params": [("b", b)], "algo": "adamw"}], lr=1e-2, weight_decay=0.0)
        b.grad = torch.randn(4)
        opt.step()
        return b, opt

    for cls, kw, words in ((torch.optim.NAdam, {}, ("b: state key 'mu_product'", "state 0",
                                                    "torch.optim.NAdam")),
                           (torch.optim.Adamax, {}, ("b: state key 'exp_inf'",
                                                     "torch.optim.Adamax")),
                           (torch.optim.Adam, {"weight_decay": 0.1},
                            ("param group 0: decoupled_weight_decay = False",
                             "weight_decay = 0.1"))):
        b, opt = into()
        before = state(opt)
        refused(lambda: opt.load_state_dict(foreign(cls, **kw)), ValueError, *words)
        assert same_state(before, state(opt)), (cls.__name__, "half loaded")
    for cls in (torch.optim.Adam, torch.optim.RAdam):
        sd = foreign(cls)
        b, opt = into()
        opt.load_state_dict(sd)
        got = opt.state_dict()["state"][0]
        assert all(torch.equal(got[k], sd["state"][0][k]) for k in ("exp_avg", "exp_avg_sq"))
        b.grad = torch.randn(4)
        opt.step()
    # a text lr in a loaded group: loaded as the group's key, refused at the step
    sd = foreign(torch.optim.AdamW, weight_decay=0.0)
    sd["param_groups"][0]["lr"] = "0.1"
    b, opt = into()
    opt.load_state_dict(sd)
    b.grad = torch.randn(4)
    before = values(b)
    refused(opt.step, ValueError, "param group 0 (adamw): lr = '0.1'", "nothing was stepped")
    assert same(before, values(b))


def case_lazily_negated_tensors_are_refused():
    """A gradient or a parameter that is torch's lazy negation (torch._neg_view: the negative
    bit, memory m read as -m): the binding handed the library data_ptr(), m itself, so a
    negated gradient stepped with its sign dropped (the update of +g where torch.optim steps
    with -g) and a negated parameter was updated as the wrong weights, silently, on the first
    step and on every later one through the comparison (C helper and Python path alike).
    Refused naming the tensor and resolve_neg(), nothing written; resolved, the step is the one
    of the plain negated tensor, bit for bit."""
    neg = torch._neg_view
    for path, ctx in step_paths():
        for first in (True, False):
            for how in ("new grad", "grad.data", "param.data"):
                with ctx():
                    w, b, opt = two()
                    w2, b2, ref = two()
                    if not first:  # the comparison now holds these tensors
                        for x, y, s in ((w, w2, (4, 8)), (b, b2, (4,))):
                            x.grad = torch.randn(s)
                            y.grad = x.grad.clone()
                        opt.step()
                        ref.step()
                    g = torch.randn(4, 8)
                    if how == "new grad":
                        w.grad = neg(g.clone())
                    elif how == "grad.data":
                        w.grad.data = neg(w.grad.data)
                        g = -w.grad.resolve_neg()  # what neg() of it reads as, negated back
                    else:
                        w.grad = g.clone()
                        w.data = neg(w.data)
                    b.grad = torch.randn(4)
                    what = "w.data" if how == "param.data" else "w.grad"
                    before = values(w, b)
                    refused(opt.step, ValueError, f"{what}: a lazily negated", "resolve_neg()")
                    assert same(before, values(w, b)), (path, first, how, "stepped")
                    if how == "param.data":
                        w.data = w.data.resolve_neg()
                        w2.data = -w2.data
                        w2.grad = g.clone()
                    else:
                        w.grad = w.grad.resolve_neg()
                        w2.grad = -g
                    b2.grad = b.grad.clone()
                    opt.step()
                    ref.step()
                    assert same(values(w, b), values(w2, b2)), (path, first, how)
    # a negated parameter given to the constructor: refused there, naming it
    w = torch.nn.Parameter(neg(torch.randn(4, 8)))
    refused(lambda: Muon([("w", w)], lr=0.02), ValueError, "a lazily negated", "resolve_neg()")


def case_tensors_without_memory_are_refused():
    """A gradient that is a ZeroTensor (torch._efficientzerotensor: zeros with no memory,
    data_ptr() 0) or a FakeTensor, or a parameter whose storage was resized to 0 (as FSDP frees
    it between uses): the binding passed address 0 on, which the library takes as no gradient,
    so the parameter was left out of the step, silently, where torch.optim steps it with zeros
    (its momentum and weight decay); the freed parameter was refused by param_set_pointers, naming a
    NULL it was never given. Each refused at the step naming the tensor and data_ptr() 0,
    nothing stepped (C helper and Python path, first step and later ones); given zeros, the step
    is the one with zeros, bit for bit."""
    for path, ctx in step_paths():
        for first in (True, False):
            with ctx():
                w, b, opt = two()
                w2, b2, ref = two()
                if not first:
                    for x, y, s in ((w, w2, (4, 8)), (b, b2, (4,))):
                        x.grad = torch.randn(s)
                        y.grad = x.grad.clone()
                    opt.step()
                    ref.step()
                w.grad, b.grad = torch._efficientzerotensor(4, 8), torch.randn(4)
                before = values(w, b)
                refused(opt.step, ValueError, "w.grad: data_ptr() is 0 for 32 elements",
                        "ZeroTensor")
                assert same(before, values(w, b)), (path, first, "stepped")
                w.grad, w2.grad, b2.grad = torch.zeros(4, 8), torch.zeros(4, 8), b.grad.clone()
                opt.step()
                ref.step()
                assert same(values(w, b), values(w2, b2)), (path, first)
                w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
                keep = w.detach().clone()
                w.untyped_storage().resize_(0)
                refused(opt.step, ValueError, "w.data: data_ptr() is 0 for 32 elements",
                        "resize_(0)")
                w.untyped_storage().resize_(keep.numel() * 4)
                w.data.copy_(keep)
                opt.step()  # with memory again, the step goes on
    # a FakeTensor gradient (shapes only): data_ptr() 0 too, named as such
    from torch._subclasses.fake_tensor import FakeTensorMode
    w, b, opt = two()
    with FakeTensorMode():
        g = torch.empty(4, 8)
    w.grad = g
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own about data_ptr() of a FakeTensor
        refused(opt.step, ValueError, "w.grad: data_ptr() is 0", "a FakeTensor")


def case_memory_shared_across_param_groups_is_refused():
    """Two parameters of different param groups (two runtimes: a Muon matrix and an AdamW
    vector, or two Muon groups with their own lr) made to share memory after construction
    (b.data = w.data.view(-1)[:4]): each runtime compares only its own buffers, so both
    stepped that memory, silently (the constructor refuses it; within one group the library
    does). Refused at the full check naming both tensors, through either step path, with
    nothing stepped: every later group's buffers are checked before any group steps (before,
    at a later step group 0 followed and stepped, then group 1's check refused: a state no
    torch.optim step leaves; the message said group 0 had stepped). The same for any refusal of
    a later group's buffer (a gradient of another shape in group 1): nothing stepped, group 0's
    values and state as they were, and the next step with fit buffers steps both."""
    for path, ctx in step_paths():
        with ctx():
            w, b, opt = two()  # two(): w in group 0 (muon), b in group 1 (adamw), one step
            keep = b.detach().clone()
            b.data = w.data.view(-1)[:4]
            w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
            before, sd = values(w, keep), state(opt)
            refused(opt.step, ValueError, "param group 1 (adamw): b.data [0x", "w.data [0x",
                    "share memory", "another param group", "nothing was stepped")
            assert same(before, values(w, keep)) and same_state(sd, state(opt)), path
            b.data = keep
            w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
            before = values(w, b)
            opt.step()  # given its own memory again, both step
            assert not torch.equal(before[0], w.detach()) and \
                not torch.equal(before[1], b.detach()), path
            w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
            b.grad.data = torch.randn(2, 2)
            before, sd = values(w, b), state(opt)
            refused(opt.step, ValueError, "param group 1 (adamw): b.grad has shape [2, 2]",
                    "nothing was stepped")
            assert same(before, values(w, b)) and same_state(sd, state(opt)), path
            b.grad = torch.randn(4)
            opt.step()  # fit again: both groups step
            assert not torch.equal(before[0], w.detach()) and \
                not torch.equal(before[1], b.detach()), path
        # at the first step: two Muon groups with their own lr, v over w2's memory
        with ctx():
            w2, v = torch.nn.Parameter(torch.randn(4, 8)), torch.nn.Parameter(torch.randn(8, 4))
            opt = Muon([{"params": [("w2", w2)]}, {"params": [("v", v)], "lr": 0.1}], lr=0.02)
            v.data = w2.data.view(8, 4)
            w2.grad, v.grad = torch.randn(4, 8), torch.randn(8, 4)
            before = values(w2)
            refused(opt.step, ValueError, "w2.data", "v.data", "share memory")
            assert same(before, values(w2)), path

def case_a_later_groups_nonfinite_gradient_leaves_the_earlier_groups_stepped():
    """What a failure the library finds inside a later group's step leaves (each param group is
    its own runtime, stepped in turn; the binding's checks of every group come before any
    steps, but a NaN/Inf gradient is found by the library's pre-pass of that group's own step):
    with nonfinite = error (this class's default), a NaN in group 1's gradient raises
    shardopt.Error naming the tensor and saying which groups had stepped; group 0's values,
    momentum and step count are those of its step, group 1's are as they were (values, exp_avg,
    exp_avg_sq, step). With nonfinite = skip, the same step returns with group 1 skipped and
    group 0 stepped. Pinned here so that a change of either is seen."""
    for path, ctx in step_paths():
        with ctx():
            w, b, opt = two()
            sd = state(opt)
            wb, bb = values(w, b)
            w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
            b.grad[1] = float("nan")
            refused(opt.step, Exception, "param group 1 (adamw)", "NaN/Inf",
                    "param group(s) 0 (muon) had already stepped")
            after = state(opt)
            assert not torch.equal(wb, w.detach()) and torch.equal(bb, b.detach()), path
            kw, kb = sorted(after)  # w's entry, then b's (registration order)
            assert not torch.equal(after[kw]["momentum_buffer"], sd[kw]["momentum_buffer"])
            assert same_state({kb: after[kb]}, {kb: sd[kb]}), (path, "group 1 changed")


def case_group_numbers_out_of_range_are_refused_before_any_group_steps():
    """A group's lr, weight_decay or (Muon) momentum that is NaN, Inf, past the library's bound
    (lr 1e7), or no number float() takes (a 2-element tensor, 10**400, None), written into a
    group after construction (a scheduler gone wrong, a hand edit): the library refused NaN and
    Inf in that group's own step, after the groups ahead of it had stepped (`param group(s) 0
    (muon) had already stepped`), and float() raised its own TypeError / OverflowError naming
    no group or key. Refused before any group steps, naming the group, the key and the value,
    nothing stepped; the value put back, both groups step. Through either step path."""
    cases = [(1, "lr", float("nan")), (1, "lr", torch.tensor(float("inf"))), (1, "lr", 1e7),
             (1, "weight_decay", float("inf")), (0, "momentum", float("nan")),
             (0, "lr", torch.tensor([0.1, 0.2])), (1, "lr", 10**400), (1, "weight_decay", None)]
    for path, ctx in step_paths():
        for gi, key, bad in cases:
            with ctx():
                w, b, opt = two()
                before, sd = values(w, b), state(opt)
                good = opt.param_groups[gi][key]
                opt.param_groups[gi][key] = bad
                w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
                refused(opt.step, ValueError, f"param group {gi} (", f"{key} = ",
                        "nothing was stepped")
                opt.param_groups[gi][key] = good  # (state_dict() reads a Muon group's momentum)
                assert same(before, values(w, b)) and same_state(sd, state(opt)), \
                    (path, gi, key, bad)
                opt.step()
                assert not same(before[:1], values(w)) and not same(before[1:], values(b))


def case_storages_shorter_than_their_tensor_are_refused():
    """A parameter or gradient whose storage was resized smaller after the tensor was made
    (untyped_storage().resize_(8) under a [4, 8] float32 tensor): torch refuses to read such a
    tensor, but data_ptr() answers, and the library wrote the parameter's 128 bytes past the
    storage's 8 (heap memory overwritten; with a [64, 64] parameter the process died of
    SIGSEGV at a later call) and read a gradient past its end. Refused at the full check naming
    the tensor and both sizes, nothing stepped, through either step path: a resize moves the
    memory, so the comparison with the last step takes a parameter resized since to the full
    check; a gradient at an optimizer's first step is measured by the full check, and a new
    gradient at a later step (new w.grad, after a step: backward after zero_grad()) by the
    comparison with the last step, which sent it on unmeasured (the library read past its
    storage, the step OK) and now measures it (about 0.15 us a new gradient) and takes a short
    one to the full check. A new gradient that is a view into a larger buffer (a flat gradient
    buffer, storage_offset > 0) is measured from its offset: whole, it is followed; cut, refused."""
    for path, ctx in step_paths():
        for what in ("w.data", "first w.grad", "new w.grad"):
            with ctx():
                if what == "first w.grad":  # no step yet: the first one checks every buffer
                    w, b = torch.nn.Parameter(torch.randn(4, 8)), torch.nn.Parameter(torch.randn(4))
                    opt = Muon([("w", w), ("b", b)], lr=0.02)
                else:
                    w, b, opt = two()
                w.grad, b.grad = torch.randn(4, 8), torch.randn(4)
                before = values(w, b)
                keep = w.detach().clone()
                t = w if what == "w.data" else w.grad
                t.untyped_storage().resize_(8)
                refused(opt.step, ValueError, f"{what[-6:]}: its storage holds 8 bytes, "
                        "but the tensor spans 128", "resize_()")
                t.untyped_storage().resize_(128)
                if what == "w.data":
                    w.data.copy_(keep)
                else:
                    t.normal_()
                assert same(before, values(w, b)), (path, what, "stepped")
                opt.step()  # with its whole storage back, the step goes on
        # new gradients that are views into one flat buffer, w's at offset 4 (after b's)
        with ctx():
            w, b, opt = two()
            for cut in (False, True):
                flat = torch.randn(4 + 32)
                b.grad, w.grad = flat[:4], flat[4:].view(4, 8)
                before = values(w, b)
                if cut:  # 36 elements' storage cut to 20: w.grad's last 16 elements gone
                    flat.untyped_storage().resize_(80)
                    refused(opt.step, ValueError, "w.grad: its storage holds 80 bytes, but the "
                            "tensor spans 144 (storage_offset 4 + 32 elements of 4 bytes)")
                    assert same(before, values(w, b)), (path, "flat cut", "stepped")
                else:
                    opt.step()
                    assert not same(before[:1], values(w)), (path, "flat whole", "not stepped")

def case_state_dicts_holding_negated_views_load_their_values():
    """A state dict whose tensors are lazily negated views (torch._neg_view of -m, which torch
    reads as m: a state dict a script transformed lazily), given to load_state_dict or written
    through opt.state[p][key]: the library was handed their memory, -m, so every moment loaded
    with its sign flipped, silently (since the binding refuses negated buffers, the refusal came
    from param_set_state after other tensors had been set: half loaded). Now resolved first:
    the state loaded is the values torch reads, as torch.optim loads them."""
    w, b, opt = two()
    _, _, other = two(seed=1)
    sd = other.state_dict()
    want = {k: {kk: vv.clone() for kk, vv in v.items()} for k, v in sd["state"].items()}
    for v in sd["state"].values():
        for kk, vv in list(v.items()):
            if vv.is_floating_point() and vv.dim() > 0:
                v[kk] = torch._neg_view(-vv)  # reads as vv; its memory holds -vv
    opt.load_state_dict(sd)
    assert same_state(state(opt), want)
    m = opt.state[w]["momentum"].clone()
    opt.state[w]["momentum"] = torch._neg_view(-(m + 1))
    assert torch.equal(opt.state[w]["momentum"], m + 1)


if __name__ == "__main__":
    cases.run("test_torch_hostile", globals())
