"""The state of shardopt.torch.Muon: opt.state, each parameter's state read from its runtime
when accessed, keyed by parameter as torch.optim's; state_dict() and load_state_dict(); and the
conversions between the runtimes' flat state and torch tensors shaped like their parameters
(DTensors where those are). Its own module so that shardopt/torch.py keeps to the optimizer and
its step."""
from collections.abc import MutableMapping
import math

import torch

from shardopt._torch_config import _SWITCHES, _scalar
from shardopt._torch_edits import _Edits
from shardopt._torch_groups import _adamw_beta1, _adamw_sync, _pair_groups, _same
from shardopt._torch_ports import _DION_GROUP_KEYS, _dion_group

_KINDS = {"muon": ("momentum",), "adamw": ("exp_avg", "exp_avg_sq")}
_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _State(MutableMapping):
    """opt.state: each parameter's state as the runtimes hold it now, keyed by parameter as
    torch.optim's is. A parameter has an entry once it has taken a step (torch.optim makes its
    state at the first step with a gradient). Muon: "momentum_buffer" (torch.optim.Muon's
    name and scale: the library's M times (1 - momentum), which is torch's buffer while the
    momentum is constant), "momentum" (M itself, as state_dict() has it) and "step"; AdamW:
    "exp_avg", "exp_avg_sq", "step". Reading copies the state out (in the dtype it is held
    in); assigning a key (opt.state[p]["momentum_buffer"] = t, as Lightning's move to a
    device does) writes it into the runtime; del opt.state[p] (or clear()) zeroes the state
    and the step count, as a fresh torch.optim state would start. A returned tensor changed in
    place (ReLoRA's reset: state[key].mul_(mask)) is written back at the next step, state
    read or state_dict() (shardopt._torch_edits). Other keys (of tensors the optimizer does not
    step) are kept here as torch keeps them, and so are keys a wrapper adds to a stepped
    tensor's state (timm's Lookahead's lookahead_slow_buff): the same objects at every
    access, in state_dict() and restored by load_state_dict, as torch.optim keeps them."""

    def __init__(self, opt):
        self._opt = opt
        self._extra = {}
        self._edits = _Edits(_write)  # the copies handed out, changed in place or not
        self._keys = {}  # id(parameter) -> the keys a wrapper added to its state (_own_keys)

    def _own(self, p):
        """The dict of keys others added to p's state (made on first use)."""
        return self._keys.setdefault(id(p), {})

    def _find(self, p):
        _pair_groups(self._opt)
        for g, (rt, slots, _) in zip(self._opt.param_groups, self._opt._runtimes):
            sp = slots.get(id(p))
            if sp is not None and sp.source is p:
                return g, rt, sp
        return None

    def _stepped(self):
        _pair_groups(self._opt)
        for g, (rt, slots, _) in zip(self._opt.param_groups, self._opt._runtimes):
            for p in g["params"]:
                sp = slots.get(id(p))
                if sp is not None and (rt.get_step(sp) > 0 or self._keys.get(id(p))):
                    yield p

    def __getitem__(self, p):
        self._edits.flush()  # what was changed in place before, as this read would see it
        found = self._find(p) if isinstance(p, torch.Tensor) else None
        if found is None:  # torch.optim.Optimizer.state is a defaultdict(dict)
            return self._extra.setdefault(p, {})
        return _ParamState(*found, self._own(p), self._edits)

    def get(self, p, default=None):
        """As torch.optim's defaultdict.get: default where p has no state (a parameter not
        stepped yet, or a key never set), and nothing inserted. Mapping.get went through
        __getitem__, which gave an empty state (and made an entry for a key it did not hold,
        so len(opt.state) was 1 before any step): `opt.state.get(p) is None` never held."""
        self._edits.flush()
        found = self._find(p) if isinstance(p, torch.Tensor) else None
        if found is None:
            return self._extra.get(p, default)
        if found[1].get_step(found[2]) > 0 or self._keys.get(id(p)):
            return _ParamState(*found, self._own(p), self._edits)
        return default

    def __setitem__(self, p, value):
        found = self._find(p) if isinstance(p, torch.Tensor) else None
        if found is None:
            self._extra[p] = value
            return
        self._edits.flush()
        st = _ParamState(*found, self._own(p), self._edits)
        value = dict(value)
        if found[0]["algo"] == "muon" and "momentum" in value and "momentum_buffer" in value:
            # a whole state as state_dict() gives it (ZeroRedundancyOptimizer.load_state_dict
            # assigns each parameter's so): one of the two, as load_state_dict takes it
            # (_saved_momentum); both written, the buffer went last, through its scale
            # 1 / (1 - mu), and the resumed run was 1 ulp off the saved one
            _, scale = _saved_momentum(value, found[0]["momentum"])
            del value["momentum_buffer" if scale is None else "momentum"]
        for k, v in value.items():
            st[k] = v

    def __delitem__(self, p):
        found = self._find(p) if isinstance(p, torch.Tensor) else None
        if found is None:
            del self._extra[p]
            return
        g, rt, sp = found
        for kind in _KINDS[g["algo"]]:
            dt, n = rt.state_info(sp, kind)
            rt.set_state(sp, kind, torch.zeros(n, dtype=_TORCH[dt]))
        rt.set_step(sp, 0)
        self._keys.pop(id(p), None)
        self._edits.replaced(p)  # copies handed out before are not its state any more

    def __iter__(self):
        yield from self._stepped()
        yield from list(self._extra)

    def __len__(self):
        return sum(1 for _ in self._stepped()) + len(self._extra)

    def __contains__(self, p):
        found = self._find(p) if isinstance(p, torch.Tensor) else None
        if found is None:
            return p in self._extra
        return found[1].get_step(found[2]) > 0 or bool(self._keys.get(id(p)))

    def __repr__(self):
        return f"{type(self).__name__}({dict(self.items())!r})"


class _ParamState(dict):
    """One parameter's entry of opt.state: a copy of its state; assigning a key writes it
    into the runtime. own: the keys others added to this state (a wrapper's, as timm's
    Lookahead adds lookahead_slow_buff), kept as given: the same objects at every access."""

    def __init__(self, g, rt, sp, own, edits):
        super().__init__()
        self._g, self._rt, self._sp, self._own, self._edits = g, rt, sp, own, edits
        self._recs = {}  # key -> its record in edits (_torch_edits): the copies handed out
        dict.update(self, own)
        step = rt.get_step(sp)
        if step == 0:
            return  # no state yet, as torch.optim before the first step
        for kind in _KINDS[g["algo"]]:
            dict.__setitem__(self, kind, _like_param(_as_torch(rt.get_state(sp, kind)),
                                                     sp.source, getattr(sp, "_perm", None)))
        if g["algo"] == "muon":
            m = self["momentum"]
            dict.__setitem__(self, "momentum_buffer",
                             (m.float() * (1.0 - g["momentum"])).to(m.dtype))
        dict.__setitem__(self, "step", torch.tensor(float(step), dtype=torch.float32))
        self._recs = {k: edits.record(g, rt, sp, k, v) for k, v in self.items() if k not in own}
        edits.live[id(self)] = self

    def __del__(self):
        try:
            if self._recs:
                self._edits.left(self)
        except Exception:  # noqa: BLE001 - at interpreter exit the modules may be gone
            pass

    def __deepcopy__(self, memo):
        # a plain dict of copies, as copy.deepcopy of torch.optim's state[p] gives; it
        # deep-copied this entry's runtime too, which ctypes refused ("ctypes objects
        # containing pointers cannot be pickled")
        import copy
        return {k: copy.deepcopy(v, memo) for k, v in self.items()}

    def __setitem__(self, key, value):
        g, rt, sp = self._g, self._rt, self._sp
        kinds = _KINDS[g["algo"]]
        rec = self._recs.get(key)
        if rec is not None and value is dict.get(self, key):
            # the tensor handed out (v[k] = v[k].to(its device), or after an in-place
            # change): written only if changed, with no round trip through
            # momentum_buffer's scale, which is not exact
            if self._edits._one(rec, value):
                return
        if self._same(key, value):
            return  # equal values in another tensor: a copy of what was handed out
        if key == "step" or key in kinds or (key == "momentum_buffer" and g["algo"] == "muon"):
            _write(g, rt, sp, key, value)
            self._edits.replaced(sp.source, key)  # older copies of it are not the state now
            self._recs.pop(key, None)
            if isinstance(value, torch.Tensor) and not hasattr(value, "placements"):
                # torch.optim's state is now this tensor: changed in place, it is followed
                self._recs[key] = self._edits.record(g, rt, sp, key, value)
        elif key in _RESERVED:
            # another algorithm's key (exp_avg on a Muon tensor), or another optimizer's
            accepted = kinds + (("momentum_buffer",) if g["algo"] == "muon" else ()) + ("step",)
            raise KeyError(f"{sp.name}: state key {key!r}: a {g['algo']} parameter has "
                           f"{', '.join(accepted)}")
        else:
            # a key of a wrapper's own (timm's Lookahead keeps its slow weights in the base
            # optimizer's state[p] and updates them in place): kept as torch.optim keeps it
            self._own[key] = value
        dict.__setitem__(self, key, value)

    def __delitem__(self, key):
        self._own.pop(key, None)
        dict.__delitem__(self, key)


    def _same(self, key, value):
        """value holds what this entry handed out under key, in another tensor: a copy, or a
        move to another device (Lightning 1.x's opt.state[p] = {k: v.to(device) ...}, which
        writes every key of the dict back). Written, momentum_buffer went through its scale
        1 / (1 - mu) after momentum had been set: 1 ulp off in fp32, 1 bf16 ulp in bf16."""
        cur = dict.get(self, key)
        if not isinstance(cur, torch.Tensor) or not isinstance(value, torch.Tensor) or \
                hasattr(value, "placements") or value.shape != cur.shape or \
                value.dtype != cur.dtype:
            return False
        return torch.equal(value.detach().to("cpu"), cur)


def _write(g, rt, sp, key, value):
    """One key of a parameter's state (step, a kind of _KINDS[g["algo"]], or a Muon
    tensor's momentum_buffer) written into its runtime rt, as opt.state[p][key] = value."""
    if key == "step":
        rt.set_step(sp, int(float(value)))
        return
    kind = "momentum" if key == "momentum_buffer" else key
    dt, n = rt.state_info(sp, kind)
    v = value.to_local() if hasattr(value, "to_local") and hasattr(value, "placements") \
        else value
    # resolve_neg: a torch._neg_view's memory holds the values negated (the library reads
    # memory: a lazily negated state loaded with its sign flipped)
    v = _in_memory_order(v.detach(), sp).to("cpu", torch.float32).resolve_neg()
    v = v.resolve_conj().contiguous()
    v = v.reshape(-1)
    if key == "momentum_buffer":
        v = v / (1.0 - g["momentum"])
    if v.numel() != n:
        raise ValueError(f"{sp.name}.{key}: {v.numel()} elements, this rank holds {n}")
    rt.set_state(sp, kind, v.to(_TORCH[dt]))


def _like_param(local, p, perm=None):
    """local (this rank's part of p's state, p's local shape) as p is: a DTensor with p's mesh
    and placements when p is one, so that torch.distributed.checkpoint reshards it. perm: the
    registered order of p's dims (channels_last, shardopt._memory_order), in which the runtime
    holds the flat state: p's shape and strides back."""
    if perm is not None:
        inverse = sorted(range(len(perm)), key=perm.__getitem__)
        return local.reshape([p.shape[d] for d in perm]).permute(inverse)
    if hasattr(p, "placements") and hasattr(p, "to_local"):
        from torch.distributed.tensor import DTensor
        local = local.reshape(p.to_local().shape)
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                  shape=p.shape, stride=p.stride())
    return local.reshape(p.shape)


def _in_memory_order(v, sp):
    """A state tensor shaped like sp's parameter in the order the runtime holds it (sp._perm,
    channels_last); a flat one is taken as that order already."""
    perm = getattr(sp, "_perm", None)
    return v.permute(perm) if perm is not None and v.dim() == len(perm) else v


def _as_torch(arr):
    """A flat numpy array from Optimizer.get_state as a torch tensor of the state's dtype
    (uint16 holds bf16 bits)."""
    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if arr.dtype.itemsize == 2 else t


def _state_dict(opt):
    """Muon.state_dict() (its docstring says what it holds)."""
    _pair_groups(opt)
    for pre_hook in opt._optimizer_state_dict_pre_hooks.values():
        pre_hook(opt)
    opt.state._edits.flush()  # opt.state's copies changed in place: the state now
    # torch.optim.Muon's buffer is written once the optimizer has stepped (any tensor's step
    # count above 0, the same on every rank), for every Muon tensor: a fresh optimizer's
    # state_dict(), the template dcp.load fills, then asks only for what every checkpoint of
    # this class holds, those saved before the buffer was written included ('Missing key ...
    # momentum_buffer' before); a stepped one's has the same keys whichever tensors stepped
    stepped = any(rt.get_step(sp) > 0 for rt, slots, _ in opt._runtimes for sp in slots.values())
    state, groups, idx = {}, [], 0
    for gi, (g, (rt, slots, _)) in enumerate(zip(opt.param_groups, opt._runtimes)):
        if g["algo"] == "adamw":
            # a momentum the scheduler wrote since the last step goes into betas[0] now, as
            # the next step would take it, so that the saved group says which beta1 is next
            b1 = _adamw_beta1(gi, g, opt._beta1[rt])
            _adamw_sync(g, b1)
            opt._beta1[rt] = b1
        gs = {k: v for k, v in g.items() if k != "params"}
        gs["params"] = list(range(idx, idx + len(g["params"])))
        gs["shardopt_steps"] = rt.stats()["steps"]
        groups.append(gs)
        for i, p in enumerate(g["params"]):
            sp = slots.get(id(p))
            if sp is None:
                continue  # frozen: no state, as torch.optim
            st = {}
            for kind in _KINDS[g["algo"]]:
                local = _as_torch(rt.get_state(sp, kind))
                st[kind] = _like_param(local, p, getattr(sp, "_perm", None))
                if kind == "momentum" and stepped:
                    # torch.optim.Muon's key and scale too, so that its load_state_dict of
                    # this dict goes on with the momentum (without the key it started a
                    # zero buffer, silently); load_state_dict here takes "momentum", exact,
                    # unless the buffer was changed since (_saved_momentum)
                    st["momentum_buffer"] = _like_param(_buffer(local, g["momentum"]), p,
                                                        getattr(sp, "_perm", None))
            st["step"] = torch.tensor(float(rt.get_step(sp)), dtype=torch.float32)
            st.update(opt.state._keys.get(id(p), {}))  # a wrapper's keys, as torch.optim's
            state[idx + i] = st
        idx += len(g["params"])
    out = {"state": state, "param_groups": groups}
    for post_hook in opt._optimizer_state_dict_post_hooks.values():
        result = post_hook(opt, out)
        if result is not None:
            out = result
    return out


def _buffer(m, mu):
    """torch.optim.Muon's momentum_buffer of the library's M, in M's dtype: M times (1 - mu)
    (torch's buffer while mu was constant), as opt.state[p] and state_dict() give it."""
    return (m.float() * (1.0 - float(mu))).to(m.dtype)


def _saved_momentum(st, mu):
    """(value, scale) of a saved Muon state st: its "momentum" (M, exact) unless its
    "momentum_buffer" is not the one state_dict() wrote with it (_buffer of M at the saved
    group's momentum mu): then the buffer is newer, a state dict this class saved, loaded into
    torch.optim.Muon, stepped there and saved again (torch keeps the "momentum" it loaded
    unchanged and steps the buffer), or a buffer edited by hand, and it is M times (1 - mu).
    An all-zero buffer beside a momentum that is not is a template's: "momentum" is taken."""
    m, buf = st.get("momentum"), st.get("momentum_buffer")
    if buf is None:
        return m, None
    if m is not None:
        a, b = (t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t
                for t in (m, buf))
        a, b = a.detach().to("cpu"), b.detach().to("cpu")
        if a.shape == b.shape and torch.equal(_buffer(a, mu).to(b.dtype), b):
            return m, None
        if a.shape == b.shape and not b.any():
            # an all-zero buffer beside a momentum that is not (M (1 - mu) is zero only where
            # M is): the template's own, left by dcp.load(..., allow_partial_load=True) of a
            # checkpoint without the key (one saved before it was written) into a template
            # of an optimizer that had stepped with zero gradients (torch's
            # get_optimizer_state_dict makes one so); torch.optim.Muon's steps never leave it
            # all zero. Taken, it zeroed the loaded momentum, silently
            return m, None
    return buf, 1.0 - float(mu)


def _check_values(sp, kind, i, value):
    """The values the library's param_set_state refuses (NaN or Inf; a negative exp_avg_sq),
    refused here, with every tensor's, before any is set: the library's refusal came after the
    tensors before it were set, a state dict half loaded."""
    bad = ~torch.isfinite(value)
    if kind == "exp_avg_sq":
        bad |= value < 0
    if bool(bad.any()):
        at = int(bad.nonzero()[0, 0])
        raise ValueError(f"{sp.name}.{kind}: element {at} is {float(value[at])!r} in the state "
                         f"dict (state {i}, in this rank's part, as {value.dtype}): accepted "
                         + ("finite values >= 0" if kind == "exp_avg_sq" else "finite values")
                         + "; nothing was loaded")


# a state key of another torch.optim optimizer -> the optimizer it comes from
_FOREIGN = {"mu_product": "torch.optim.NAdam", "exp_inf": "torch.optim.Adamax",
            "max_exp_avg_sq": "torch.optim.Adam / AdamW with amsgrad=True",
            "sum": "torch.optim.Adagrad", "square_avg": "torch.optim.RMSprop / Adadelta",
            "acc_delta": "torch.optim.Adadelta", "ax": "torch.optim.ASGD",
            "eta": "torch.optim.ASGD", "mu": "torch.optim.ASGD", "prev": "torch.optim.Rprop",
            "step_size": "torch.optim.Rprop",
            "momentum_buffer": "torch.optim.SGD / Muon (a Muon group's state)"}


# the keys opt.state[p] refuses to hold as a wrapper's own: the state keys of either algorithm
# and of the other torch.optim optimizers (a mistake, not a wrapper's)
_RESERVED = frozenset(k for ks in _KINDS.values() for k in ks) | {"momentum_buffer", "step"} \
    | frozenset(_FOREIGN)


def _check_keys(sp, i, algo, st):
    """Refuses a state key of another optimizer (NAdam's mu_product, Adamax's exp_inf) or of
    the other algorithm: loaded, it was dropped, and the run went on as another optimizer with
    the moments it shares (exp_avg, exp_avg_sq), silently. Other keys are a wrapper's own
    (timm's Lookahead's lookahead_slow_buff), loaded as torch.optim loads them."""
    known = _KINDS[algo] + ("step",) + (("momentum_buffer",) if algo == "muon" else ())
    for k in st:
        if k not in known and k in _RESERVED:
            raise ValueError(f"{sp.name}: state key {k!r} in the state dict (state {i}), the "
                             f"state of {_FOREIGN.get(k, 'another optimizer')}: a {algo} "
                             f"parameter has {', '.join(known)}; nothing was loaded")


def _saved_step(sp, i, v):
    """A saved step count as an int: a whole number (a tensor of one, as torch.optim saves it),
    else ValueError. int(float(v)) took 2.5 as 2 and the text "3" as 3, and NaN raised
    Python's own conversion error."""
    v = _scalar(v)  # torch.optim saves a tensor; a numpy scalar from an edited state dict
    if isinstance(v, bool) or not isinstance(v, (int, float)) or \
            not (math.isfinite(v) and v == int(v) and 0 <= v < 1 << 53):
        # the library's range, checked here with the rest: its refusal of -3 or 2**60 came
        # after the tensors before it had been set
        raise ValueError(f"{sp.name}: step = {v!r} in the state dict (state {i}): accepted a "
                         "whole number in [0, 2^53) (or a 1-element tensor); nothing was "
                         "loaded")
    return int(v)


def _load_state_dict(opt, state_dict):
    """Muon.load_state_dict() (its docstring says what it takes)."""
    _pair_groups(opt)
    state_dict = dict(state_dict)  # shallow, as torch.optim's: hooks may replace it
    opt.state._edits.replaced()  # opt.state's copies handed out before are not the state now
    for pre_hook in opt._optimizer_load_state_dict_pre_hooks.values():
        result = pre_hook(opt, state_dict)
        if result is not None:
            state_dict = result
    # a state dict of dion's Muon names its group keys as dion does (mu, epsilon, beta1 /
    # beta2, adjust_lr): in this class's names, the saved momentum is restored and the fixed
    # keys compared, rather than the saved values kept under keys no step reads
    saved = [{k: v for k, v in _dion_group(sg, gi).items()
              if not k.startswith("adamw_") and k != "_algorithm"}
             if _DION_GROUP_KEYS & set(sg) else sg
             for gi, sg in enumerate(state_dict["param_groups"])]
    empty = [g for g in opt.param_groups if not g["params"]]
    if empty and len(saved) + len(empty) == len(opt.param_groups):
        # a state dict saved before empty groups were kept (they were dropped, so it has none
        # of them): each takes its group's own keys, which numbered no state
        it = iter(saved)
        saved = [next(it) if g["params"] else {k: v for k, v in g.items()}
                 for g in opt.param_groups]
    if len(saved) != len(opt.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(saved, opt.param_groups)):
        raise ValueError("loaded state dict has a different number of parameter groups or "
                         "parameters per group than this optimizer (its groups are split by "
                         "algorithm: make it from the same parameters and groups)")
    for gi, (g, sg, (rt, slots, fixed)) in enumerate(zip(opt.param_groups, saved,
                                                        opt._runtimes)):
        if sg.get("algo", g["algo"]) != g["algo"]:
            raise ValueError(f"param group {gi}: saved as {sg.get('algo')}, here {g['algo']}")
        for k in _SWITCHES:
            if sg.get(k):
                # torch.optim.AdamW(amsgrad=True)'s state dict: restored as it is, the run
                # would go on without amsgrad (or maximize), silently another optimizer; a
                # capturable / differentiable one was refused as a fixed key 'made with
                # another value', which no optimizer of this class can be
                raise ValueError(f"param group {gi}: {k} = {sg[k]!r} in the state dict: "
                                 f"shardopt.torch.Muon has no {k} (only False); resume it with "
                                 "torch.optim")
        if sg.get("decoupled_weight_decay") is False and g["algo"] == "adamw" and \
                sg.get("weight_decay", 0) != 0:
            # torch.optim.Adam's / RAdam's / NAdam's group (decoupled_weight_decay False): its
            # weight decay is added to the gradient (L2); this class decays decoupled, as
            # AdamW, so the run would go on as another optimizer
            raise ValueError(f"param group {gi}: decoupled_weight_decay = False with "
                             f"weight_decay = {sg['weight_decay']!r} in the state dict (a "
                             "torch.optim.Adam / RAdam / NAdam group: L2 decay): "
                             "shardopt.torch.Muon's AdamW decays decoupled; resume it with "
                             "torch.optim")
        for k, v in fixed.items():
            w = sg.get(k, v)
            if not _same(w, v):
                raise ValueError(f"param group {gi}: {k} = {w!r} in the state dict, {v!r} "
                                 "here: it is fixed when the optimizer is made; make it "
                                 "with the saved value")
    # everything converted and checked first: a refusal leaves every runtime as it was
    todo, owns = [], []
    for g, sg, (rt, slots, _) in zip(opt.param_groups, saved, opt._runtimes):
        for p, i in zip(g["params"], sg["params"]):
            st = state_dict["state"].get(i)
            sp = slots.get(id(p))
            if sp is None:
                continue
            known = _KINDS[g["algo"]] + ("step", "momentum_buffer")
            # a wrapper's keys (checked below), as torch.optim's load casts them: floating
            # tensors to the parameter's dtype and device, others to its device
            owns.append((p, {k: (v.to(p.device, p.dtype) if v.is_floating_point() else
                                 v.to(p.device)) if isinstance(v, torch.Tensor) else v
                             for k, v in (st or {}).items() if k not in known
                             and k not in _RESERVED}))
            if st is None:
                # no state saved for it (torch.optim saves none for a tensor that never had a
                # gradient): torch.optim's load replaces the whole state, so it starts afresh
                # at its next step; kept, it went on with this optimizer's moments and count
                for kind in _KINDS[g["algo"]]:
                    dt, n = rt.state_info(sp, kind)
                    todo.append((rt, sp, kind, torch.zeros(n, dtype=_TORCH[dt])))
                todo.append((rt, sp, None, 0))
                continue
            _check_keys(sp, i, g["algo"], st)
            for kind in _KINDS[g["algo"]]:
                value, scale = st.get(kind), None
                if kind == "momentum":
                    # torch.optim.Muon's state dict: its buffer is the library's M times
                    # (1 - mu), mu the saved group's momentum (exact while it was constant)
                    value, scale = _saved_momentum(st, sg.get("momentum", g["momentum"]))
                if value is None:
                    raise ValueError(f"{sp.name}: state {i} has no {kind!r}"
                                     + (" (nor torch.optim.Muon's 'momentum_buffer')"
                                        if kind == "momentum" else ""))
                dt, n = rt.state_info(sp, kind)
                shape = list(value.shape)
                if value.dim() > 1 and shape not in (list(p.shape), list(sp.shape)):
                    # the same element count in another shape (another model's state dict, or
                    # its parameters in another order): torch.optim fails at the step on it
                    raise ValueError(f"{sp.name}.{kind}: shape {shape} in the state dict (state "
                                     f"{i}), the parameter's is {list(p.shape)}: a state dict of "
                                     "another model, or of its parameters in another order?")
                if hasattr(value, "to_local") and hasattr(value, "placements"):
                    value = value.to_local()
                # resolve_neg: a torch._neg_view's memory holds the values negated, and the
                # library reads memory (it loaded -m where torch reads m, silently)
                value = _in_memory_order(value.detach(), sp).to("cpu").resolve_neg()
                if scale is not None:
                    value = value.float() / scale
                value = value.to(_TORCH[dt]).contiguous().reshape(-1)
                if value.numel() != n:
                    raise ValueError(f"{sp.name}.{kind}: {value.numel()} elements in the "
                                     f"state dict, this rank holds {n}; load it through "
                                     "torch.distributed.checkpoint to reshard")
                _check_values(sp, kind, i, value)
                todo.append((rt, sp, kind, value))
            if "step" in st:
                todo.append((rt, sp, None, _saved_step(sp, i, st["step"])))
            else:  # torch.optim.Muon counts no steps: a loaded state is one of a stepped tensor
                todo.append((rt, sp, None, max(rt.get_step(sp), 1)))
    for rt, sp, kind, value in todo:
        if kind is None:
            rt.set_step(sp, value)
        else:
            rt.set_state(sp, kind, value)
    for p, own in owns:  # torch.optim's load replaces the whole state: these keys too
        opt.state._keys[id(p)] = own
    for g, sg, (rt, _, _) in zip(opt.param_groups, saved, opt._runtimes):
        for k, v in sg.items():
            if k not in ("params", "shardopt_steps") and \
                    (g["algo"], k) != ("adamw", "momentum"):
                g[k] = tuple(v) if k == "betas" else v
        if g["algo"] == "adamw":
            # the saved betas and eps, read at the next step; its momentum key is the saved
            # beta1 (a state saved before momentum was beta1 holds Muon's default there)
            g["momentum"] = opt._beta1[rt] = g["betas"][0]
    for post_hook in opt._optimizer_load_state_dict_post_hooks.values():
        post_hook(opt)
