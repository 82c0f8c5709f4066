"""shardopt.torch.Muon's construction of its groups: the tensors a group gives, named (from
model= or as param.<i>) and deduplicated against the groups so far, and the group split into one
group per algorithm (a Muon and an AdamW part, each with the keys its algorithm reads). Apart
from torch.py, which holds the optimizer and its step."""
import warnings

import torch

from shardopt._torch_classify import _algo, _memory
from shardopt._torch_config import _check_ordered


def _named(opt, items, warn=True):
    """(name, tensor) pairs from tensors or pairs; unnamed tensors take the model's name
    where model= is given, else param.<i> (a warning, unless warn is False: the group
    fixes their algorithm)."""
    out = []
    for x in items:
        if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], str):
            out.append((x[0], x[1]))
        elif isinstance(x, torch.Tensor):
            name = opt._model_names.get(id(x))
            if name is None:
                name = f"param.{opt._unnamed}"
                if warn and not opt._warned_unnamed and not opt._by_model and \
                        x.ndim == 2:
                    opt._warned_unnamed = True
                    warnings.warn("shardopt.torch.Muon: parameters without names and no "
                                  "model=: every 2-D tensor goes to Muon, embeddings and "
                                  "the output head included; pass model.named_parameters()"
                                  " or model=model", stacklevel=4)
            opt._unnamed += 1
            out.append((name, x))
        else:
            raise TypeError(f"{type(x).__name__}: a parameter is a torch tensor or a "
                            "(name, tensor) pair")
    return out


def _tagged(name, p, fixed):
    """The algorithm a parameter's own use_muon attribute gives (None where it has none):
    DeepSpeed's convention (its engine and its Muon tests tag each parameter, p.use_muon = True
    for the hidden matrices, False for the rest, and group by the tag), which a script ported
    from it keeps. Before, ignored: a 2-D tensor tagged False (a router, a head of another
    name) went to Muon by its shape, silently. A tag that is no bool, or one that disagrees
    with the group's own algo / use_muon, is refused by name."""
    tag = getattr(p, "use_muon", None)
    if tag is None:
        return None
    if not isinstance(tag, bool):
        raise ValueError(f"{name}: use_muon = {tag!r} (the parameter's attribute, DeepSpeed's "
                         "tag of its algorithm): accepted True or False")
    algo = "muon" if tag else "adamw"
    if fixed not in (None, algo):
        raise ValueError(f"{name}: its use_muon attribute is {tag} but its group's algo is "
                         f"{fixed!r}: they disagree; set one")
    return algo


# Keller Jordan's Muon's group key (_torch_ports._jordan): the AdamW part's lr multiplier
_RATIO = "adamw_lr_ratio"


def _initial_lr(group, lr, defaults):
    """The initial_lr of a group's AdamW part whose lr is not the group's (adamw_lr given): the
    group's initial_lr is its Muon lr's schedule base (torch's schedulers made with last_epoch
    >= 0 read it as base_lrs; a resuming script puts it in the group it gives), so the AdamW
    part's is its own lr at the same point of the schedule, initial_lr * (its lr / the group's
    lr), or its own lr where the group's is 0. Kept as given, a LambdaLR(opt, f,
    last_epoch=N) moved the AdamW tensors at the Muon lr (0.02 where adamw_lr was 1e-3),
    silently."""
    def number(v):
        return float(v) if isinstance(v, torch.Tensor) and v.numel() == 1 else v

    base, here, own = (number(v) for v in (group["initial_lr"],
                                           group.get("lr", defaults["lr"]), lr))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in (base, here, own)):
        return group["initial_lr"]  # not numbers: the checks of lr name them
    return own * (base / here) if here > 0 else own


def _split(opt, group, defaults):
    """A user's group as one group per algorithm (empty parts dropped), its tensors
    deduplicated against every group so far (a tensor object listed again: registered
    once, warned; distinct tensors over the same memory are two parameters, as in
    torch.optim)."""
    group = dict(group)
    items = group.pop("params")
    _check_ordered(items, "a param group's 'params'")
    items = [items] if isinstance(items, torch.Tensor) else list(items)
    # torch >= 2.6's named groups: {"params": [...], "param_names": [...]}; each part keeps
    # the names of its own tensors
    given_names = group.pop("param_names", None)
    if given_names is not None:
        if len(given_names) != len(items):
            raise ValueError(f"param_names has {len(given_names)} names for {len(items)} "
                             "parameters")
        items = list(zip(given_names, items))
    fixed = group.pop("algo", None)
    # dion's "algorithm" key (_torch_ports._dion_group), which its scripts read back from
    # opt.param_groups (prime-rl's tests do): the groups made hold it again
    algorithm = group.pop("_algorithm", None)
    if algorithm is not None:
        group["algorithm"] = algorithm
    if "use_muon" in group:
        # Keller Jordan's MuonWithAuxAdam groups (dict(params=..., use_muon=True, ...)):
        # the group's algorithm, as "algo" says it (the key stays for the script to read)
        use = "muon" if group["use_muon"] else "adamw"
        if fixed not in (None, use):
            raise ValueError(f"a group with algo {fixed!r} and use_muon = "
                             f"{group['use_muon']!r}: they disagree; give one")
        fixed = use
    parts, here = {"muon": [], "adamw": []}, set()
    for name, p in _named(opt, items, warn=fixed is None):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{name}: {type(p).__name__} is not a torch tensor")
        key = id(p)
        if key in opt._seen and key not in here:  # torch.optim's error (was: a warning,
            # the later group's lr and weight_decay never applied to it)
            raise ValueError(f"some parameters appear in more than one parameter group ("
                             f"{name} is {opt._seen[key]} of an earlier group)")
        here.add(key)
        if key in opt._seen:
            warnings.warn(f"shardopt: {name} is the same tensor as {opt._seen[key]} "
                          f"(a tied weight listed twice): registered once, as "
                          f"{opt._seen[key]}", stacklevel=4)
            continue
        opt._seen[key] = name
        mem = _memory(p)
        if mem is not None and mem in opt._mem:
            # torch.optim steps both, one after the other; the library updates each memory
            # once per step (its step refuses data that overlaps, since its passes over
            # parameters may run together), so a tie through .data is refused by name here
            raise ValueError(
                f"{name} and {opt._mem[mem]} are two tensors over the same memory (tied "
                f"through .data?): shardopt updates a memory once per step; tie them as one "
                f"Parameter (e.g. model.lm_head.weight = model.wte.weight), so that autograd "
                f"sums their gradients")
        if mem is not None:
            opt._mem[mem] = name
        algo = _tagged(name, p, fixed) or fixed or _algo(name, p, opt._by_model, opt._patterns)
        if algo not in parts:
            raise ValueError(f"{name}: algo {algo!r}: accepted 'muon' or 'adamw'")
        parts[algo].append((name, p))
    out = []
    # an empty group (the no-decay group of a model without biases or norms, made by a name
    # filter) is kept, as torch.optim keeps it, with the algorithm it names (the defaults',
    # Muon's, where none): dropped, param_groups was shorter than the script's list of groups,
    # and a list per group (LambdaLR(opt, [f, g])) was refused, zip(opt.param_groups, ...)
    # paired wrongly, silently. Its runtime has no parameter
    keep = {a for a in parts if parts[a]} or {fixed or "muon"}
    if "muon" in keep:
        g = {k: v for k, v in group.items() if not k.startswith("adamw_")}
        g.update(params=[p for _, p in parts["muon"]], algo="muon",
                 _names=[n for n, _ in parts["muon"]])
        if given_names is not None:
            g["param_names"] = [n for n, _ in parts["muon"]]
        out.append(g)
    if "adamw" in keep:
        lr = group.get("adamw_lr", opt._adamw["lr"])
        if fixed == "adamw" and "lr" in group and "adamw_lr" not in group:
            # a group made AdamW's ("algo": "adamw", use_muon False, dion's algorithm) holds
            # its own lr, which beats the constructor's adamw_lr as any group's key beats the
            # constructor's in torch.optim: it was replaced by adamw_lr, silently (the
            # embeddings' 0.3 of modded-nanogpt's groups stepped at 3e-4)
            lr = group["lr"]
        own_lr = lr is not None and lr is not group.get("lr")  # its initial_lr made to match
        if lr is None:
            lr = group.get("lr", defaults["lr"])
            if isinstance(lr, torch.Tensor) and "muon" in keep:
                # the Muon part holds that tensor: a scheduler writes a tensor lr in place
                # (fill_), so one shared by both parts would give both the last one written
                lr = lr.clone()
        # the user's own keys (a group "name" a script looks up, initial_lr) go with it;
        # Muon's hyperparameters do not
        g = {k: v for k, v in group.items()
             if (not k.startswith("adamw_") or k == _RATIO) and k not in (
            "lr", "weight_decay", "betas", "eps", "momentum", "nesterov", "ns_coefficients",
            "ns_steps", "adjust_lr_fn")}
        # a group's own weight_decay / betas cover its AdamW tensors too (nanoGPT's
        # {"params": ..., "weight_decay": 0.0} group of biases and norms)
        wd = group.get("adamw_weight_decay",
                       group.get("weight_decay", opt._adamw["weight_decay"]))
        g.update(params=[p for _, p in parts["adamw"]], algo="adamw", lr=lr,
                 weight_decay=wd,
                 betas=tuple(group.get("adamw_betas",
                                       group.get("betas", opt._adamw["betas"]))),
                 # an AdamW-only group's own eps is AdamW's (MuonWithAuxAdam's eps=1e-10
                 # group); elsewhere a group's eps is Muon's (torch.optim.Muon's key)
                 eps=group.get("adamw_eps", group["eps"] if fixed == "adamw" and "eps"
                               in group else opt._adamw["eps"]),
                 _names=[n for n, _ in parts["adamw"]])
        if "initial_lr" in group and own_lr:
            g["initial_lr"] = _initial_lr(group, lr, defaults)
        if given_names is not None:
            g["param_names"] = [n for n, _ in parts["adamw"]]
        if opt._lr_ratio is not None:
            g.setdefault(_RATIO, opt._lr_ratio)  # Keller Jordan's Muon, ported
        out.append(g)
    return out
