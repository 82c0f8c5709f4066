"""shardopt.torch.Muon's param groups as the script sees them against the runtimes that step
them: the warning where a group given is split by algorithm, the pairing of opt.param_groups
with the runtimes when the script reorders or replaces that list, and an AdamW group's betas,
eps and momentum as each step reads them, which groups a failed step had stepped, the checks
of a group's fixed keys and of tensors unfrozen since, and an add_param_group undone where it
failed. Apart from torch.py, which holds the optimizer and its step."""
import math
import operator
import sys
import warnings

import shardopt
from shardopt._torch_config import EPS_MIN, _check_switches


def _warn_split(parts, first):
    """Warns where a group the script gave holds both kinds of tensors (parts[i] > 1: split in
    a Muon and an AdamW group), so that param_groups is longer than the script's list of
    groups: torch's schedulers then refuse a list per group of the script's length
    (LambdaLR(opt, [f, g]), OneCycleLR(max_lr=[a, b]): "Expected 3 lr_lambdas, but got 2"),
    and zip(opt.param_groups, per_group) pairs them wrongly, silently."""
    if all(n <= 1 for n in parts):
        return
    at, where = first, []
    for i, n in enumerate(parts):
        where.append(f"{i} -> {list(range(at, at + n))}")
        at += n
    warnings.warn(f"shardopt.torch.Muon: {sum(n > 1 for n in parts)} of the {len(parts)} param "
                  "group(s) given hold both Muon and AdamW tensors and are split by algorithm "
                  f"(group given -> opt.param_groups: {', '.join(where)}; g['algo'] says "
                  "which): a list per group (LambdaLR(opt, [f, g]), OneCycleLR(max_lr=[...]), "
                  "zip(opt.param_groups, ...)) needs one entry per opt.param_groups entry; to "
                  "keep your groups as given, put the Muon and AdamW tensors in separate groups "
                  "({'params': ..., 'algo': 'muon'} / 'adamw')", stacklevel=3)


def _refuse_split_under_zero(parts):
    """torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class=Muon) makes
    this class from its own groups and then copies their keys one to one into the local
    optimizer's param_groups, asserting they are as many: a group holding both kinds of
    tensors, split in two here, failed in it with 'AssertionError: Mismatch between number of
    source and destination parameter groups', naming neither class nor the way out. Refused
    here, before any runtime is made, when ZeroRedundancyOptimizer is the caller (a few
    frames up); groups given by algorithm are taken."""
    if all(n <= 1 for n in parts):
        return
    f = sys._getframe(2)
    for _ in range(6):
        if f is None:
            return
        me = f.f_locals.get("self")
        if type(me).__module__.startswith("torch.distributed.optim.zero_redundancy"):
            break
        f = f.f_back
    else:
        return
    raise ValueError(
        "shardopt.torch.Muon under torch.distributed.optim.ZeroRedundancyOptimizer: "
        f"{sum(n > 1 for n in parts)} of its {len(parts)} param group(s) hold both Muon and "
        "AdamW tensors, which this class splits in two, and ZeroRedundancyOptimizer needs "
        "its groups one to one with the local optimizer's: give it groups by algorithm "
        "([{'params': matrices, 'algo': 'muon'}, {'params': others, 'algo': 'adamw'}])")


def _pair_groups(opt):
    """Pairs opt._runtimes and opt._frozen (per group, in group order) with opt.param_groups as
    the list is now. torch.optim reads param_groups afresh at every step, so a script may
    reorder it, or assign a new list (accelerate's wrapper sets `optimizer.param_groups =
    ...`); the runtimes were paired with the groups by position, so a reordered list gave
    each group another group's runtime (a misleading refusal, "eps changed", or, between
    groups of equal keys, its params refused as edited). Each group is matched to the runtime
    registered with its tensors, whatever its position or dict; a list that is not the
    optimizer's groups (one dropped, one made by hand) raises ValueError saying so, nothing
    changed. Cheap where nothing moved: one identity comparison per group."""
    groups, paired = opt.param_groups, opt._paired
    if len(groups) == len(paired) and all(map(operator.is_, groups, paired)):
        return
    owner = {}
    for i, (_, slots, _) in enumerate(opt._runtimes):
        for key in list(slots) + [id(p) for _, p in opt._frozen[i]]:
            owner[key] = i
    order = []
    # an empty group's runtime (one per empty group, _torch_split) has no tensor to match:
    # empty groups are paired with those runtimes in their order
    empty = [i for i, (_, slots, _) in enumerate(opt._runtimes)
             if not slots and not opt._frozen[i]]
    for gi, g in enumerate(groups):
        hit = {owner.get(id(p)) for p in g["params"]} if isinstance(g, dict) and \
            "params" in g else {None}
        if not hit and empty:
            hit = {empty.pop(0)}
        i = hit.pop() if len(hit) == 1 else None
        if i is None or i in order:
            raise ValueError(
                f"opt.param_groups[{gi}] is not one of this optimizer's groups (its tensors "
                "are not those of one group registered with the library): param_groups may "
                "be reordered or assigned the same groups again, not changed; add a group "
                "with add_param_group, or make a new optimizer with the groups wanted and "
                "load_state_dict(old.state_dict()) into it")
        order.append(i)
    if len(order) != len(opt._runtimes):
        gone = sorted(set(range(len(opt._runtimes))) - set(order))
        raise ValueError(
            f"opt.param_groups has {len(groups)} groups; this optimizer has "
            f"{len(opt._runtimes)} (registered group(s) {gone} left out): each group's "
            "tensors are registered with the library when the group is made, so a group "
            "cannot be dropped from the list; make a new optimizer with the groups wanted and "
            "load_state_dict(old.state_dict()) into it")
    opt._runtimes = [opt._runtimes[i] for i in order]
    opt._frozen = [opt._frozen[i] for i in order]
    opt._paired = list(groups)
    opt._plan = None


def _adamw_beta1(gi, g, last):
    """An AdamW group's beta1 for this step. Its "momentum" key is beta1 too: OneCycleLR and
    CyclicLR with cycle_momentum=True (their default) write every group's "momentum" where the
    optimizer's defaults have no "betas" (this optimizer's are torch.optim.Muon's, so that they
    cycle the Muon groups' momentum), and torch's Adam-family optimizers take that cycled
    momentum as beta1. last is the beta1 both keys held after the last step (or construction,
    or load_state_dict): whichever of the two changed since is the new beta1 (the caller
    writes it into the other, _adamw_sync); both changed to different values is refused, since
    which one the script meant cannot be told."""
    mu, b1 = g["momentum"], g["betas"][0]
    if mu is not last and mu != last:
        if b1 is not last and b1 != last and b1 != mu:
            raise ValueError(
                f"param group {gi} (adamw): momentum changed from {last!r} to {mu!r} and "
                f"betas[0] to {b1!r} since the last step: an AdamW group's momentum is its "
                "beta1 (what OneCycleLR / CyclicLR with cycle_momentum=True write), so one "
                "of the two may change between steps, or both to the same value; nothing was "
                "stepped")
        return mu
    return b1


def _adamw_hparams(gi, g, last):
    """(beta1, beta2, eps) of an AdamW group for this step (_adamw_beta1 for beta1), as
    floats, checked against torch.optim.AdamW's ranges before any group steps: ValueError
    naming the group, the key and the value, nothing stepped."""
    betas, eps = g["betas"], g["eps"]
    # the common case first: neither beta1 key changed since the last step (the same float
    # object both hold, _adamw_sync), plain floats in range; a third of the time of the full
    # path below, which anything else (a scheduler's new momentum, a tensor, NaN) takes
    if type(betas) is tuple and len(betas) == 2 and betas[0] is last and \
            g["momentum"] is last and type(last) is float and type(betas[1]) is float and \
            type(eps) is float and 0.0 <= last < 1.0 and 0.0 <= betas[1] < 1.0 and \
            EPS_MIN <= eps <= 1.0:
        return last, betas[1], eps
    b1 = _adamw_beta1(gi, g, last)
    try:
        if len(betas) != 2 or any(isinstance(v, (str, bytes)) for v in (b1, *betas, eps)):
            raise ValueError  # text ("0.9") too, which float() took as a number
        b1, b2, e = float(b1), float(betas[1]), float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"param group {gi} (adamw): betas = {betas!r}, eps = {eps!r}: "
                         "betas is a pair of numbers and eps a number; nothing was "
                         "stepped") from None
    for k, v in (("beta1 (betas[0], or the momentum key, which is beta1)", b1),
                 ("beta2 (betas[1])", b2)):
        if not 0.0 <= v < 1.0:  # NaN too
            raise ValueError(f"param group {gi} (adamw): {k} = {v!r}: accepted [0, 1); "
                             "nothing was stepped")
    if not (EPS_MIN <= e <= 1.0 and math.isfinite(e)):
        raise ValueError(f"param group {gi} (adamw): eps = {e!r}: accepted (0, 1], at least "
                         f"{EPS_MIN!r} (the library's range for adamw_eps); nothing was stepped")
    return b1, b2, e


def _step_hparams(gi, g):
    """(lr, weight_decay, momentum) of a group for this step as floats (momentum -1.0, "the
    config's", for an AdamW group, whose beta1 _adamw_hparams gives), checked before any group
    steps. The library reads a negative weight_decay or momentum as "the config's" and lr = -1
    as "not set": a group's weight_decay = -0.5 written after construction stepped with the
    value given at construction, silently. A negative value is refused here (ValueError naming
    the group, the key and the value, nothing stepped); so are NaN, Inf and values past the
    library's bounds, and values float() cannot take (a 2-element tensor, 10**400, None), here
    before any group steps: the library refused them in the group's own step, after the groups
    ahead of it had stepped, and float()'s own error named no group or key."""
    lr, wd = g["lr"], g["weight_decay"]
    if g["algo"] == "muon":
        mu = g["momentum"]
        # plain floats in range (NaN and Inf are not): a third of the time of the full path below
        if type(lr) is float and type(wd) is float and type(mu) is float and \
                0 <= lr <= 1e6 and 0 <= wd <= 1e6 and 0 <= mu < 1:
            return lr, wd, mu
    elif type(lr) is float and type(wd) is float and 0 <= lr <= 1e6 and 0 <= wd <= 1e6 and \
            "adamw_lr_ratio" not in g:
        return lr, wd, -1.0
    for k in ("lr", "weight_decay") + (("momentum",) if g["algo"] == "muon" else ()):
        if isinstance(g[k], (str, bytes)):
            # float("0.1") took the text as a number; torch.optim fails on it at the step
            raise ValueError(f"param group {gi} ({g['algo']}): {k} = {g[k]!r}: a number (or a "
                            "1-element tensor) is accepted, not text; nothing was stepped")
    def num(k):
        try:
            return float(g[k])  # a 1-element tensor lr, as torch takes
        except (TypeError, ValueError, OverflowError, RuntimeError) as e:
            v = repr(g[k])
            v = v if len(v) <= 60 else f"{v[:40]}... ({len(v)} characters)"
            raise ValueError(f"param group {gi} ({g['algo']}): {k} = {v}: a number (or a "
                             f"1-element tensor) is accepted ({e}); nothing was stepped") from None
    lr, wd = num("lr"), num("weight_decay")
    mu = num("momentum") if g["algo"] == "muon" else -1.0
    ratio = g.get("adamw_lr_ratio") if g["algo"] == "adamw" else None
    if ratio is not None:
        # Keller Jordan's Muon (_torch_ports._jordan): its AdamW lr is adamw_lr / lr times the
        # group's lr, so the lr a schedule or a hand-written loop puts here is the Muon one
        r = ratio if isinstance(ratio, (str, bytes)) else float(ratio)
        if isinstance(r, (str, bytes)) or not 0 < r < float("inf"):
            raise ValueError(f"param group {gi} (adamw): adamw_lr_ratio = {ratio!r}: accepted a "
                             "finite number > 0 (this group's lr is multiplied by it); nothing "
                             "was stepped")
        lr *= r
    for k, v in (("lr", lr), ("weight_decay", wd)) + ((("momentum", mu),)
                                                       if g["algo"] == "muon" else ()):
        if not (0 <= v < 1 if k == "momentum" else 0 <= v <= 1e6):  # NaN fails both
            why = (" (a negative value would be read as the library's default)" if v < 0
                   else "")
            raise ValueError(f"param group {gi} ({g['algo']}): {k} = {v!r}: accepted "
                             f"{'[0, 1)' if k == 'momentum' else '[0, 1e6]'}{why}; nothing was "
                             "stepped")
    return lr, wd, mu


def _adamw_sync(g, b1):
    """Both of an AdamW group's beta1 keys hold b1 (this step's), where one does not: the
    momentum a scheduler wrote goes into betas[0], as torch.optim.AdamW's group would hold it,
    and a betas[0] written by hand into momentum."""
    if g["momentum"] != b1:
        g["momentum"] = b1
    betas = g["betas"]
    if betas[0] != b1:
        g["betas"] = (b1, *tuple(betas)[1:])


def _let_prepared_go(rts, checked, start):
    """After a step() that stopped before the groups from `start` stepped: the gradients their
    _prepare held (held through the step only: shardopt.Optimizer._let_grads_go) let go."""
    for rt, chk in zip(rts[start:], checked[start:]):
        if chk is not None:
            rt._let_grads_go(chk[0])


def _partial(e, groups, done):
    """A group's failed step (e: shardopt.Error, or the binding's ValueError refusing one of
    its buffers) as raised to the script: where groups before it had stepped (each group is its
    own runtime, stepped in turn), the library's "nothing was updated" is true of this group
    only, so the message says which ones were. A ValueError said nothing of them: a gradient of
    another shape in group 1 read as if no group had stepped, where group 0 had."""
    if done == 0 or not isinstance(e, (shardopt.Error, ValueError)):
        return e
    stepped = ", ".join(f"{i} ({g['algo']})" for i, g in enumerate(groups[:done]))
    what = e.message if isinstance(e, shardopt.Error) else str(e)
    text = (f"param group {done} ({groups[done]['algo']}): {what}; param group(s) {stepped} "
            "had already stepped")
    out = shardopt.Error("step", e.status, text) if isinstance(e, shardopt.Error) else \
        ValueError(text)
    out.__cause__ = e
    return out


def _peer_spans(opt_ref, rt):
    """The data spans [(lo, hi, name)] of the parameters of opt's param groups other than rt's
    (shardopt.Optimizer._peers): a plain tensor's memory as it is now (a group not yet checked
    this step may have moved), another kind's as its runtime registered it."""
    import torch
    opt = opt_ref()
    out = []
    for other, params, _ in opt._runtimes if opt is not None else ():
        if other is rt:
            continue
        for sp in params.values():
            t = sp.source
            if type(t) in (torch.Tensor, torch.nn.Parameter):
                lo, n = t.data_ptr(), t.numel() * t.element_size()
            else:
                s = other._slots.get(id(sp))
                lo, n = (s.data_addr or 0, s.count * (2 if s.dtype == "bf16" else 4)) \
                    if s is not None else (0, 0)
            if lo and n:
                out.append((lo, lo + n, sp.name))
    return out


# other optimizers' names of the keys this class reads under its own (dion's mu, epsilon,
# beta1 / beta2, adjust_lr, which _torch_ports translates when a group is made; Emerging-
# Optimizers' earlier momentum_beta and use_nesterov; Moonlight's wd): in a group, no step
# would read them
_THEIR_NAMES = {"mu": "momentum", "momentum_beta": "momentum", "beta1": "betas",
                "beta2": "betas", "epsilon": "eps", "adjust_lr": "adjust_lr_fn",
                "use_nesterov": "nesterov", "wd": "weight_decay"}


class _Group(dict):
    """A param group: a dict whose other optimizers' names of a key this class reads
    (_THEIR_NAMES: Emerging-Optimizers' g["momentum_beta"], dion's g["mu"], ...) read as that
    key, as their optimizer's group would give it (a script logging or scheduling from
    g["momentum_beta"] got a KeyError). Only reads: such a key is not in the group (not in
    `in`, len, items or state_dict()), and writing one is refused at the next step
    (_their_names), since no step would read it."""
    __slots__ = ()

    def __missing__(self, k):
        # dion's adjust_lr values are not torch's adjust_lr_fn's ("rms_norm", "original")
        ours = _THEIR_NAMES.get(k) if k != "adjust_lr" else None
        if ours is None or ours not in self:
            raise KeyError(k)
        v = self[ours]
        return v[("beta1", "beta2").index(k)] if ours == "betas" else v

    def get(self, k, default=None):
        try:
            return self[k]
        except KeyError:
            return default


def _their_names(gi, g):
    """Refuses a group holding another optimizer's name of a key this class reads (written by
    a script ported from it: a dion momentum warmup's g["mu"] = ..., given in a group this
    class does not translate), which no step would read: before, kept and ignored, the run
    going on with the old value, silently. ValueError naming the group, the key and this
    class's name; nothing stepped."""
    hit = sorted(_THEIR_NAMES.keys() & g.keys())
    if hit:
        k = hit[0]
        raise ValueError(f"param group {gi} ({g.get('algo', '?')}): {k} = {g[k]!r} is another "
                         f"optimizer's name for {_THEIR_NAMES[k]!r}, which this class reads "
                         f"instead (lr, weight_decay, momentum, betas and eps at every step, "
                         f"the others fixed when the group is made): set g[{_THEIR_NAMES[k]!r}];"
                         " nothing was stepped")


def _same(w, v):
    """w, a fixed key's value as a script or a state dict gives it, is v, the value the
    runtime was made with: equal, or equal once lists are tuples (betas given again as a list;
    a table of ns_coefficients, a tuple of (a, b, c) triples, back from JSON as lists of
    lists, which tuple(w) left unequal)."""
    def tup(x):
        return tuple(map(tup, x)) if isinstance(x, (tuple, list)) else x
    if w is v or w == v:
        return True
    if not isinstance(v, tuple):
        return False
    try:  # a tensor of betas: tuple() of it, as before
        return bool(tup(w) == v if isinstance(w, (tuple, list)) else tuple(w) == v)
    except (TypeError, RuntimeError):
        return False


def _check_fixed(gi, g, fixed):
    """Refuses a change to a key fixed at construction (_FIXED); passes a value equal to
    the old one (_same)."""
    for k, v in fixed.items():
        w = g[k]
        if not _same(w, v):
            _check_switches(gi, g)  # maximize / amsgrad / ... set True: not supported
            raise ValueError(
                f"param group {gi} ({g['algo']}): {k} changed from {v!r} to {w!r}: "
                "a Muon group's lr, weight_decay and momentum are read at each step (an "
                "AdamW group's lr, weight_decay, betas, eps and momentum, its beta1); the "
                "others are fixed when the group is made; nothing was stepped")


def _refuse_thawed(opt):
    """A parameter with requires_grad False at construction was never registered: with a
    gradient now (requires_grad_(True) later, as when unfreezing a backbone) torch.optim
    would step it, this optimizer cannot. Raises naming the parameters; Muon._step first makes
    the first group's step with a learning rate the library refuses, so that it fails on
    every rank (the others naming this one), nothing written anywhere."""
    thawed = [n for fr in opt._frozen for n, p in fr if p.grad is not None and p.numel()]
    if not thawed:
        return
    raise ValueError(f"{', '.join(thawed)}: requires_grad was False when the optimizer was "
                     "made, so it is not registered, but it has a gradient now (unfrozen "
                     "later?): make the optimizer again after unfreezing and "
                     "load_state_dict(old.state_dict()) into it; nothing was stepped")


def _undo_add(opt, n, seen, mem):
    """Puts opt back as it was before an add_param_group that failed: its first n groups, the
    tensors it had seen. torch.optim's add_param_group checks before it appends; here a group is
    split and each part appended before its own checks and its runtime, so a refused group
    (eps = 0, amsgrad = True, a meta tensor, the library's refusal) stayed in param_groups with
    no runtime, and its tensors counted as held: the same group given again, corrected, was
    refused as 'already in this optimizer', and the next step failed on the half-made group."""
    for rt, _, _ in opt._runtimes[n:]:
        opt._beta1.pop(rt, None)
        rt.close()
    del opt.param_groups[n:], opt._runtimes[n:], opt._frozen[n:], opt._paired[n:]
    opt._seen, opt._mem, opt._plan = seen, mem, None
