"""shardopt as a torch.optim optimizer: `from shardopt.torch import Muon`.

    opt = Muon(model.named_parameters(), lr=0.02, adamw_lr=3e-4, model=model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / 100))
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()

A torch.optim.Optimizer subclass over shardopt runtimes (the ctypes binding in shardopt). Its
defaults are torch.optim.Muon's for the matrices and torch.optim.AdamW's for the rest, so that
switching the import gives the same run to within bf16 rounding (docs/python.md says what still
differs, and why). Each param group is one runtime holding one algorithm: groups are split into
a Muon and an AdamW part at construction, so that every lr_scheduler, and every loop over
param_groups, sets each group's lr and weight_decay, which step() reads every time."""
import functools
import operator
import sys
import weakref

import torch

import shardopt as _so
from shardopt._torch_classify import _classify_by_model, _conv_kernels, _flat_3d, _warn_stack
from shardopt import _torch_ports as _ports
from shardopt._torch_config import (_SWITCHES, _check_eps, _check_hp, _check_mesh_size,
                                    _check_ordered, _check_switches, _dion_defaults, _muon_config,
                                    _param_mults)
from shardopt._torch_groups import (_adamw_hparams, _adamw_sync, _check_fixed, _let_prepared_go,
                                    _pair_groups, _partial, _peer_spans, _refuse_thawed,
                                    _step_hparams, _their_names, _undo_add, _warn_split, _Group,
                                    _refuse_split_under_zero)
from shardopt._torch_split import _split
from shardopt._torch_state import _State, _load_state_dict, _state_dict

__all__ = ["Muon"]

# group keys fixed when the group's runtime is made: a scheduler that cycles them is refused
# (lr, weight_decay and a Muon group's momentum are read at every step, and an AdamW group's
# betas, eps and momentum, its beta1: _torch_groups._adamw_hparams)
_FIXED = {"muon": ("nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn"),
          "adamw": _SWITCHES}
_UNSET = _ports._UNSET


def _nothing(g):  # the fixed keys' getter of a group that has none (itemgetter needs one)
    return ()

# torch.optim's registries of the global step hooks (register_optimizer_step_pre_hook / post):
# where a torch version has them elsewhere, every step goes through torch's wrapper (Muon.step)
_OPTIM = sys.modules.get("torch.optim.optimizer")
_GLOBAL_PRE_HOOKS = getattr(_OPTIM, "_global_optimizer_pre_hooks", None)
_GLOBAL_POST_HOOKS = getattr(_OPTIM, "_global_optimizer_post_hooks", None)
_ALWAYS_TRACE = (not isinstance(_GLOBAL_PRE_HOOKS, dict)
                 or not isinstance(_GLOBAL_POST_HOOKS, dict)
                 or not hasattr(torch.optim.Optimizer, "profile_hook_step"))
# read once: step() calls them every time, and the attribute chains cost more than the calls
_profiler_enabled = torch.autograd._profiler_enabled
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


def _eager(fn):
    """fn as torch.compile sees it: never traced (a graph break, fn run eagerly), and with
    fullgraph=True an error that says why. Its work is ctypes calls into libshardopt, which
    dynamo cannot trace: let in, it broke the graph somewhere inside, and fullgraph=True failed
    on an unrelated torch call."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:  # torch < 2.1: no torch.compiler
        return fn
    reason = ("shardopt.torch.Muon's step and zero_grad call libshardopt through ctypes: they "
              "run eagerly, outside any compiled graph (docs/python.md)")
    try:
        return disable(fn, reason=reason)
    except TypeError:  # torch < 2.7: no reason
        return disable(fn)


class Muon(torch.optim.Optimizer):
    """Muon for the hidden matrices and AdamW for the rest, stepped by libshardopt.

    params: an iterable of tensors, of (name, tensor) pairs (model.named_parameters()) or of
    param-group dicts ({"params": ..., "lr": ...}; "algo": "muon" | "adamw" fixes a group's
    algorithm; adamw_lr / adamw_weight_decay / adamw_betas / adamw_eps set its AdamW part).
    The keywords are torch.optim.Muon's (lr, weight_decay, momentum, nesterov, ns_coefficients,
    eps, ns_steps, adjust_lr_fn) and the AdamW side's (adamw_lr: None = lr, adamw_betas,
    adamw_eps, adamw_weight_decay; a weight_decay given covers the AdamW tensors too unless
    adamw_weight_decay is given); torch.optim.AdamW's betas= is adamw_betas (and an eps=
    beside it is adamw_eps), foreach= and fused= are taken and ignored, maximize /
    amsgrad / capturable / differentiable refused unless False. A Muon group's momentum is
    read at every step (a warmup takes effect), as lr and weight_decay are, and an AdamW
    group's betas and eps, as torch.optim.AdamW reads them; an AdamW group's momentum key is
    its beta1 (what OneCycleLR / CyclicLR cycle).
    comm: an mpi4py communicator (None: this process alone, no mpi4py needed). config: any
    other key of docs/config.md, and "preset": "dion" for the library's own defaults. model:
    classify by module (nn.Embedding and the output head to AdamW) instead of by name.
    expert(name): which tensors are [E, out, in] expert stacks (with config ep > 1, plain
    tensors it names are this rank's [E / ep, out, in] share; DTensors on an 'ep' mesh dim are
    found without it: shardopt.torch_params). Moonlight's (muon_params=, adamw_params=, wd=),
    dion's (mu=, epsilon=, adjust_lr=, distributed_mesh=, groups with "algorithm"), Keller
    Jordan's earlier Muon's (muon_params first, adamw_lr=, adamw_wd=), NVIDIA
    Emerging-Optimizers' (num_ns_steps=, coefficient_type=, scale_mode=, ...) and
    MuonWithAuxAdam's
    spellings are taken with their projects' defaults, or refused where
    they mean something else (shardopt._torch_ports)."""

    def __init__(self, params=_UNSET, lr=_UNSET, weight_decay=_UNSET, momentum=_UNSET,
                 nesterov=_UNSET, ns_coefficients=_UNSET, eps=_UNSET, ns_steps=_UNSET,
                 adjust_lr_fn=_UNSET,
                 adamw_lr=_UNSET, adamw_betas=_UNSET, adamw_eps=_UNSET,
                 adamw_weight_decay=_UNSET, *, betas=_UNSET, comm=None, config=None, model=None,
                 expert=None, foreach=None, fused=None, maximize=False, amsgrad=False,
                 capturable=False, differentiable=False, **ported):
        # torch.optim's implementation switches: foreach / fused pick how torch's own loops
        # run (the library's kernels are fused whatever they say), so they are taken and
        # change nothing; the others would change the arithmetic, which the library does not do
        for k, v in (("foreach", foreach), ("fused", fused)):
            if v not in (None, True, False):
                raise ValueError(f"{k} = {v!r}: accepted None, True or False (ignored: the "
                                 "library's step is fused either way)")
        for k, v in (("maximize", maximize), ("amsgrad", amsgrad), ("capturable", capturable),
                     ("differentiable", differentiable)):
            if v:
                raise ValueError(f"{k} = {v!r}: not supported by shardopt.torch.Muon (only "
                                 f"False is accepted); use torch.optim for {k}")
        if betas is not _UNSET:  # torch.optim.AdamW's name, as an AdamW trainer passes it
            if adamw_betas is not _UNSET:
                raise ValueError("betas and adamw_betas both given: they are the same setting "
                                 "(the AdamW tensors' betas); give one")
            adamw_betas = betas
            if eps is not _UNSET and adamw_eps is _UNSET:
                # the call is torch.optim.AdamW's (torchtitan's build_optimizers passes lr,
                # betas, eps, weight_decay, fused, foreach to whatever class it is given): its
                # eps is the AdamW tensors', and the Muon norm keeps torch.optim.Muon's.
                # Before, it went to the Muon norm and the AdamW tensors kept 1e-8, silently
                adamw_eps, eps = eps, _UNSET
        config = dict(config or {})
        preset = config.pop("preset", "torch")
        if preset not in ("torch", "dion"):
            raise ValueError(f"config preset = {preset!r}: accepted 'torch' (torch.optim.Muon's "
                             "defaults, the default) or 'dion' (the library's)")
        given = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                     ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                     adjust_lr_fn=adjust_lr_fn, adamw_lr=adamw_lr, adamw_betas=adamw_betas,
                     adamw_eps=adamw_eps, adamw_weight_decay=adamw_weight_decay)
        # Moonlight's, dion's and MuonWithAuxAdam's spellings as this class's, with their
        # defaults for what the call leaves unset (shardopt._torch_ports)
        if isinstance(params, torch.nn.Module):
            # the model itself, as HF's Trainer passes it when optimizer_cls_and_kwargs' kwargs
            # hold "model" (and Keller Jordan's Muon of April 2025 took it): its named
            # parameters, classified by module (torch.optim refuses a module as params)
            if model is not None and model is not params:
                raise ValueError("params is a module and model= another one: give one")
            model, params = params, list(params.named_parameters())
        _check_ordered(params, "params")
        params, given, base, self._flatten = _ports.port(params, given, ported, comm)
        self._given = given  # the keywords given, which add_param_group's groups see too
        # Moonlight's Muon (and Keller Jordan's before it) flattens every tensor of more than 2
        # dims to [out, rest]
        self._moon = any(k in ported for k in _ports._MOONLIGHT_KEYWORDS
                         + _ports._JORDAN_KEYWORDS)
        if params is _UNSET:
            raise TypeError("shardopt.torch.Muon: no parameters: give params (or Moonlight's "
                            "muon_params / adamw_params)")
        # Keller Jordan's Muon: every AdamW group's lr is this times its lr (_torch_split)
        self._lr_ratio = base.get("adamw_lr_ratio")
        # Emerging-Optimizers' scale_mode / extra_scale_factor: the library's scale times this,
        # through each Muon tensor's lr_mult (its wd_mult divides it out: the decay stays lr·wd)
        self._scale_mult = base.get("muon_scale_mult", 1.0)
        if preset == "dion":
            base = _dion_defaults()
        hp = {k: (base[k] if v is _UNSET else v) for k, v in given.items()}
        if given["weight_decay"] is not _UNSET and given["adamw_weight_decay"] is _UNSET:
            # a weight decay given is the decay of every tensor it covers, as for any torch
            # optimizer; left unset, each side keeps its torch default (Muon 0.1, AdamW 0.01)
            hp["adamw_weight_decay"] = given["weight_decay"]
        mapped = {"momentum", "nesterov", "weight_decay", "ns_coeffs", "ns_custom_coeffs",
                  "ns_steps", "ns_eps", "lr_scale", "adamw_beta1", "adamw_beta2", "adamw_eps",
                  "adamw_weight_decay"}
        clash = sorted(mapped & set(config))
        if clash:
            raise ValueError(f"config {clash}: set through Muon's keywords (momentum, nesterov, "
                             "weight_decay, ns_coefficients, ns_steps, eps, adjust_lr_fn, "
                             "adamw_betas, adamw_eps, adamw_weight_decay)")
        _check_hp(hp)
        if preset == "torch":
            # torch.optim.AdamW decays every tensor of its group, norms and biases included; the
            # library leaves 1-D tensors alone by default (docs/config.md, weight_decay_1d)
            config.setdefault("weight_decay_1d", True)
        # a NaN/Inf gradient: torch.optim writes NaN into that parameter; the library's default
        # (skip) skips the whole step of that group's runtime only, each group being one
        # runtime, so a NaN in one matrix left every Muon tensor as it was while the AdamW
        # tensors stepped, with only a line on stderr. An error names the tensor instead
        config.setdefault("nonfinite", "error")
        self._comm, self._config, self._expert = comm, config, expert
        self._patterns = config.pop("adamw_patterns", None)
        if isinstance(self._patterns, str):
            self._patterns = self._patterns.split(",")
        self._by_model = _classify_by_model(model) if model is not None else {}
        self._convs = _conv_kernels(model) if model is not None else set()
        self._warned_3d = False
        self._model_names = ({id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
                             if model is not None else {})
        self._runtimes = []  # per param group: (its shardopt.Optimizer, [Param] in group order)
        self._beta1 = {}     # AdamW runtime -> the beta1 of its group's last step (_adamw_beta1)
        self._frozen = []    # per param group: (name, tensor) left out for requires_grad False
        self._plan = None    # what step() reads of the above, made again after add_param_group
        self._paired = []    # the group dicts the runtimes are paired with, in order
        self._seen = {}      # id(tensor) -> name: a tensor is registered once in all groups
        self._mem = {}       # (device, address) -> name: distinct tensors over one memory
        self._unnamed = 0
        self._warned_unnamed = False
        defaults = dict(lr=hp["lr"], weight_decay=hp["weight_decay"], momentum=hp["momentum"],
                        nesterov=hp["nesterov"], ns_coefficients=hp["ns_coefficients"],
                        eps=hp["eps"], ns_steps=hp["ns_steps"], adjust_lr_fn=hp["adjust_lr_fn"],
                        algo="muon")  # no betas: torch.optim.Muon's keys, so OneCycleLR cycles
        # "momentum" as it does for torch.optim.Muon (with "betas" it would cycle those)
        self._adamw = dict(lr=hp["adamw_lr"], weight_decay=hp["adamw_weight_decay"],
                           betas=tuple(hp["adamw_betas"]), eps=hp["adamw_eps"])
        groups = list(params) if not isinstance(params, torch.Tensor) else [params]
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        given_groups = isinstance(groups[0], dict)
        if not given_groups:
            groups = [{"params": groups}]
        split, parts = [], []
        for g in groups:
            split.extend(_split(self, g, defaults))
            parts.append(len(split) - sum(parts))
        _refuse_split_under_zero(parts)  # its AssertionError named neither class
        if given_groups:
            _warn_split(parts, 0)
        super().__init__(split, defaults)
        self.state = _State(self)
        # a subclass that defines its own step: torch.optim.Optimizer.__init__ wrapped it in
        # profile_hook_step (hooks, profiler record), so this class's step, reached through
        # super().step(), leaves them to that wrapper
        self._wrapped_outside = type(self).step is not Muon.step

    @property
    def state(self):
        """The state by parameter, read from the runtimes (shardopt._torch_state._State)."""
        return self._state_view

    @state.setter
    def state(self, value):
        # torch.optim.Optimizer.__init__ assigns a defaultdict before the runtimes exist;
        # __init__ then assigns the view. A script that resets its optimizer
        # (`opt.state = collections.defaultdict(dict)`, as torch.optim starts every tensor
        # afresh at its next step then) replaced the view: the runtimes kept their state,
        # silently, and the next step failed on the defaultdict. Now the runtimes' state is
        # what value holds: every tensor's cleared (zero, step count 0), then value's entries
        # assigned as opt.state[p] = ... is
        view = self.__dict__.get("_state_view")
        if isinstance(value, _State) or view is None:
            if isinstance(value, _State):
                self.__dict__["_state_view"] = value
            return
        items = list(value.items())  # before clearing: value may be read from the view
        view.clear()
        for p, st in items:
            view[p] = st

    # ---- construction -----------------------------------------------------------------

    def add_param_group(self, param_group):
        """torch.optim's add_param_group, and the group's runtime (collective over comm)."""
        if "algo" not in param_group or "_names" not in param_group:
            _check_ordered(param_group.get("params"), "add_param_group's 'params'")
            # dion's and MuonWithAuxAdam's group keys, as the constructor takes them
            param_group = _ports.port_group(param_group, len(self.param_groups), self._given)
            if self._runtimes:  # after construction: a tensor listed again is torch's error
                items = param_group["params"]
                items = [items] if isinstance(items, torch.Tensor) else list(items)
                param_group = dict(param_group, params=items)
                have = {id(p) for g in self.param_groups for p in g["params"]}
                for x in items:
                    p = x[1] if isinstance(x, (tuple, list)) else x
                    if id(p) in have or id(p) in self._seen:
                        raise ValueError("some parameters appear in more than one parameter "
                                         "group (add_param_group: "
                                         f"{x[0] if isinstance(x, (tuple, list)) else 'a tensor'}"
                                         " is already in this optimizer)")
            # a refusal (a check below, or the library's) leaves the optimizer as it was
            undo = (len(self.param_groups), dict(self._seen), dict(self._mem))
            try:
                split = _split(self, param_group, self.defaults)
                _warn_split([len(split)], len(self.param_groups))
                for g in split:
                    self.add_param_group(g)
            except BaseException:
                _undo_add(self, *undo)
                raise
            return
        names = param_group.pop("_names")
        _their_names(len(self.param_groups), param_group)
        # other optimizers' names of its keys read as its keys (Emerging-Optimizers'
        # g["momentum_beta"]: a KeyError before)
        super().add_param_group(_Group(param_group))
        g = self.param_groups[-1]
        g["params"] = list(g["params"])
        _check_hp({k: g[k] for k in ("lr", "weight_decay")})
        cfg = dict(self._config)
        _check_eps(len(self.param_groups) - 1, g)
        _check_switches(len(self.param_groups) - 1, g)
        if g["algo"] == "muon":
            cfg.update(_muon_config(g))
        else:
            b1, b2 = g["betas"]
            cfg.update(adamw_beta1=b1, adamw_beta2=b2, adamw_eps=g["eps"],
                       adamw_weight_decay=g["weight_decay"])
            g["momentum"] = b1  # not the defaults' (Muon's): beta1, which OneCycleLR cycles
        # an empty tensor (a [1, 0, d] register token when there are none) has nothing to
        # step, and the library refuses a dim of 0: kept with the frozen ones, unregistered
        named = [(n, p) for n, p in zip(names, g["params"]) if p.requires_grad and p.numel()]
        # frozen now, unfrozen later (requires_grad_(True)): never registered, so a gradient
        # on one is refused at step() rather than left unapplied
        frozen = [(n, p) for n, p in zip(names, g["params"])
                  if not p.requires_grad or not p.numel()]
        for n, p in named:
            if p.is_meta:
                raise ValueError(f"{n}: is on the meta device (deferred initialisation): the "
                                 "library updates the parameters' memory in place, so make the "
                                 "optimizer after model.to_empty(device=...) and the weights' "
                                 "initialisation")
        _check_mesh_size(named, self._comm)
        ep = self._config.get("ep")
        flatten = g.get("flatten", self._flatten)  # dion's (_torch_ports); None: not given
        mats = _flat_3d(g["algo"], flatten, self._moon, named, self._expert, self._convs)
        sparams = _so.torch_params(named, expert=self._expert,
                                   ep=int(ep) if ep is not None else None, matrices=mats)
        for sp in sparams:
            sp.algo = g["algo"]
            sp.lr_mult, sp.wd_mult = _param_mults(sp.name, sp.source)
            if g["algo"] == "muon" and self._scale_mult != 1.0:
                sp.lr_mult *= self._scale_mult
                sp.wd_mult /= self._scale_mult
            if g["algo"] == "muon" and flatten is None and not self._moon and \
                    not self._warned_3d:
                self._warned_3d = _warn_stack(sp)
        if flatten is not None and g["algo"] == "muon":  # dion's spelling (_torch_ports)
            _ports.check_flatten(flatten, [(sp.name, sp.source, len(sp.shape) == 3)
                                           for sp in sparams], len(self.param_groups) - 1)
        rt = _so.Optimizer(sparams, comm=self._comm, config=cfg)
        # its full check refuses data that another group's runtime steps too (a weak
        # reference: no cycle between the optimizer and its runtimes)
        rt._peers = functools.partial(_peer_spans, weakref.ref(self), rt)
        self._runtimes.append((rt, {id(sp.source): sp for sp in sparams},
                               {k: g[k] for k in _FIXED[g["algo"]]}))
        if g["algo"] == "adamw":
            self._beta1[rt] = b1
        self._frozen.append(frozen)
        self._paired.append(g)
        self._plan = None

    # ---- the step -----------------------------------------------------------------------

    def step(self, closure=None):
        """One step of every param group (collective over comm), with each group's lr,
        weight_decay and momentum (an AdamW group's: its beta1, _adamw_beta1), betas and eps
        as they are now. A parameter whose .grad is None on every rank is skipped
        as torch.optim skips it: its values, state and step count stay as they are. None on
        some ranks only fails that group's step on every rank (shardopt.Error, status -4,
        naming the parameter and a rank without its gradient), nothing written. Step hooks
        (register_step_pre_hook / post_hook, and the global ones) run and the profiler sees
        Optimizer.step#<class>.step, as for every torch.optim optimizer."""
        # torch.optim wraps each optimizer class's step in profile_hook_step (a profiler record
        # and the hook loops): about 10 us a step with no hook and no profiler, a third of the
        # whole Python side on a small model. This class marks its step hooked so that torch
        # leaves it alone, and goes through that same wrapper whenever it has work to do.
        # a subclass's own step (a script's `def step(self, closure=None): ...; return
        # super().step(closure)`) is wrapped by torch at construction, hooks and profiler
        # record included: here they ran a second time (each pre / post hook twice a step)
        if not self._wrapped_outside and (
                _ALWAYS_TRACE or self._optimizer_step_pre_hooks
                or self._optimizer_step_post_hooks or _GLOBAL_PRE_HOOKS or _GLOBAL_POST_HOOKS
                or _profiler_enabled()):
            # the hooks see the arguments as given, as torch's own wrapper passes them
            return self._traced_step() if closure is None else self._traced_step(closure)
        return self._step(closure)

    step = _eager(step)
    step.hooked = True  # torch.optim.Optimizer._patch_step_function: already wrapped

    def _make_plan(self):
        """What _step reads at every step, made once per set of groups: the frozen tensors in
        one tuple, and per group a getter of its fixed keys with their values at construction,
        so that checking a group is one call and one tuple comparison (equal unless a value
        changed, or was given again as an equal value of another type: then _check_fixed
        decides, as the check always did)."""
        for gi, g in enumerate(self.param_groups):
            self._check_params(gi, g)  # the lists compared at each step are the registered ones
            _their_names(gi, g)  # keys written before the first step (then: their count)
        frozen = tuple(p for fr in self._frozen for _, p in fr if p.numel())
        fixed = [(operator.itemgetter(*f) if f else _nothing, tuple(f.values()), f)
                 for _, _, f in self._runtimes]
        self._plan = (frozen, fixed, [rt for rt, _, _ in self._runtimes],
                      [list(g["params"]) for g in self.param_groups],
                      [len(g) for g in self.param_groups])
        return self._plan

    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        _pair_groups(self)  # param_groups reordered or assigned again: each its own runtime
        # torch.no_grad() as torch.optim's steps have it, without its decorator's cost (a few
        # microseconds a step, a tenth of the whole Python side on a small model)
        prev = _grad_enabled()
        _set_grad_enabled(False)
        checked = [None]  # per group: _prepare's outcome (group 0: its step checks its own)
        try:
            try:
                # opt.state's copies changed in place since they were read (ReLoRA's reset)
                # are the state this step starts from, as in torch.optim
                self._state_view._edits.flush(stepping=True)
                plan = self._plan or self._make_plan()
                for p in plan[0]:
                    if p.grad is not None:
                        _refuse_thawed(self)
                groups, hps, nums = self.param_groups, [], []
                # every group checked before any is stepped: a refusal writes nothing
                for gi, (g, (get, values, fixed), had, rt) in enumerate(zip(groups, plan[1],
                                                                              plan[3], plan[2])):
                    if get(g) != values:
                        _check_fixed(gi, g, fixed)
                    if len(g) != plan[4][gi]:  # a key added or removed since the last step
                        _their_names(gi, g)
                        plan[4][gi] = len(g)
                    ps = g["params"]
                    if len(ps) != len(had) or not all(map(operator.is_, ps, had)):
                        self._check_params(gi, g)
                    # an AdamW group's betas and eps as torch.optim.AdamW reads them, each step
                    adamw = g["algo"] == "adamw"
                    hps.append(_adamw_hparams(gi, g, self._beta1[rt]) if adamw else None)
                    # a 1-element tensor lr, as torch.optim takes; a Muon group's momentum
                    # warmup (modded-nanogpt writes g["momentum"] every step) takes effect now;
                    # a negative value refused (the library would read it as "the config's")
                    nums.append(_step_hparams(gi, g))
                # every later group's buffers checked too before any group steps (group 0's
                # step checks its own before it writes anything): a refusal in group 1 left
                # group 0 stepped, a state no step() of torch.optim leaves
                for gi, rt in enumerate(plan[2][1:], 1):
                    checked.append(rt._prepare(True))
                    if checked[-1][1]:
                        raise ValueError(f"param group {gi} ({groups[gi]['algo']}): " +
                                         "; ".join(m for _, m in checked[-1][1]) +
                                         "; nothing was stepped")
            except Exception:
                # the step is collective: a refusal of this rank alone (a group's key changed
                # here only, a frozen tensor with a gradient, an lr that is no number) still
                # makes the first group's step, with a learning rate the library refuses on
                # every rank (the others name this rank and stop there, as after a failed
                # step), nothing written anywhere; then this rank raises its own reason
                try:
                    self._runtimes[0][0].step(float("nan"), -1.0, -1.0, 0.0, None, True)
                except _so.Error:
                    pass
                finally:
                    if len(checked) > 1:  # later groups' _prepare ran (so plan is made)
                        _let_prepared_go(plan[2], checked, 1)
                raise
            done = 0  # groups stepped so far: a failure after them says so
            for g, rt, hp, (lr, wd, mu), chk in zip(groups, plan[2], hps, nums, checked):
                # the library skips a parameter without a gradient on every rank exactly (values,
                # state and step count), and fails the step on every rank where some ranks have
                # one
                try:
                    if hp is None:
                        rt.step(lr, lr, wd, 0.0, None, True, mu, _checked=chk)
                    else:
                        _adamw_sync(g, hp[0])
                        self._beta1[rt] = hp[0]
                        rt.step(lr, lr, wd, 0.0, None, True, -1.0, hp[:2], hp[2], _checked=chk)
                except (_so.Error, ValueError) as e:
                    _let_prepared_go(plan[2], checked, done + 1)
                    raise _partial(e, groups, done)
                done += 1
        finally:
            _set_grad_enabled(prev)
        return loss

    def _check_params(self, gi, g):
        """A group's "params" list edited since it was made (a tensor appended, removed or
        replaced in place): its runtime holds the tensors it was made with, so the step would
        leave a new one unstepped and step a removed one, where torch.optim steps the list as it
        is now. Refused, nothing stepped; the same tensors in another order are taken."""
        slots = self._runtimes[gi][1]
        had = set(slots) | {id(p) for _, p in self._frozen[gi]}
        now = [id(p) for p in g["params"]]
        if len(now) == len(had) and set(now) == had:
            self._plan = None  # reordered: the next step compares with this order
            return
        added, gone = sum(i not in had for i in now), len(had - set(now))
        raise ValueError(f"param group {gi} ({g['algo']}): its 'params' list was edited since the "
                         f"group was made ({added} tensor(s) not registered in it, {gone} "
                         "registered one(s) no longer listed): each group's tensors are "
                         "registered with the library when the group is made; add tensors with "
                         "add_param_group, or make a new optimizer and "
                         "load_state_dict(old.state_dict()) into it; nothing was stepped")

    _traced_step = torch.optim.Optimizer.profile_hook_step(_step)

    @_eager
    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=set_to_none)
        if set_to_none:  # the binding's references to the old gradients go too
            for rt, _, _ in self._runtimes:
                rt.zero_grad(set_to_none=True)

    def algo(self, p):
        """The algorithm p's group steps it with: "muon" or "adamw"."""
        for g in self.param_groups:
            if any(q is p for q in g["params"]):
                return g["algo"]
        raise ValueError("not a parameter of this optimizer")

    def stats(self):
        """Each group's runtime stats (shardopt.Optimizer.stats), in group order."""
        _pair_groups(self)
        return [rt.stats() for rt, _, _ in self._runtimes]

    def close(self):
        for rt, _, _ in self._runtimes:
            rt.close()

    # ---- state --------------------------------------------------------------------------

    def state_dict(self):
        """torch's layout: {"state": {index: {...}}, "param_groups": [...]}, parameters indexed
        in group order. Muon: "momentum" (the library's M = sum of mu^k g) and
        "momentum_buffer" (torch.optim.Muon's: M (1 - mu), so that torch.optim.Muon resumes
        from it; load_state_dict takes "momentum" unless the buffer changed since; only once
        the optimizer has stepped); AdamW: "exp_avg", "exp_avg_sq"; both "step". Tensors keep
        the dtype the state is held in (bf16 momentum stays bf16) and are DTensors sharded like
        their parameters when those are. Not collective: each rank copies its own shards out of
        its runtimes (shardopt_param_get_state). torch.optim's state_dict hooks run as for
        any torch optimizer."""
        return _state_dict(self)

    def load_state_dict(self, state_dict):
        """The state of state_dict() (this class's, from torch.load or
        torch.distributed.checkpoint, on any number of ranks) into the runtimes, tensors
        converted to the dtype the runtime holds (round to nearest where that is bf16). Group
        hyperparameters are restored; those fixed at construction must be equal. Not collective
        (shardopt_param_set_state): every rank loads its own shards, and every rank must load
        (replicas take the same values)."""
        _load_state_dict(self, state_dict)

    def __getstate__(self):
        raise TypeError("shardopt.torch.Muon cannot be pickled or deep-copied: its state lives "
                        "in libshardopt runtimes. Save opt.state_dict() (torch.save, or "
                        "torch.distributed.checkpoint) and load_state_dict() into a new Muon")

    def __deepcopy__(self, memo):
        self.__getstate__()

    def __reduce_ex__(self, protocol):
        self.__getstate__()
