"""shardopt.torch.Muon's hyperparameters as the library's config: the two sets of defaults
(torch.optim.Muon's and the library's own, dion's), their checks, and a Muon group's keys as
config keys (docs/python.md, switching from torch.optim.Muon). Apart from torch.py, which holds
the optimizer's behaviour."""
import math

import torch

_JORDAN = (3.4445, -4.775, 2.0315)  # torch.optim.Muon's default, the library's `jordan` table


def _dion_defaults():
    """The library's own defaults (docs/config.md: dion's Muon), as this class's keywords."""
    return dict(lr=1e-3, weight_decay=0.01, momentum=0.95, nesterov=False,
                ns_coefficients="quintic", eps=1e-8, ns_steps=5, adjust_lr_fn="match_rms_adamw",
                adamw_lr=None, adamw_betas=(0.9, 0.95), adamw_eps=1e-8, adamw_weight_decay=0.01)


def _torch_defaults():
    """torch.optim.Muon's defaults; the AdamW side torch.optim.AdamW's."""
    return dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                ns_coefficients=_JORDAN, eps=1e-7, ns_steps=5, adjust_lr_fn=None,
                adamw_lr=None, adamw_betas=(0.9, 0.999), adamw_eps=1e-8,
                adamw_weight_decay=0.01)


def _scalar(v):
    """A 1-element tensor (a tensor lr, as torch.optim takes) or a 0-d numpy value (np.float32
    from a config or a sweep's array, which torch.optim takes: it is no Python float, and was
    refused as not a number) as its Python number; anything else as it is, for the caller to
    check."""
    if (isinstance(v, torch.Tensor) and v.numel() == 1) or \
            (type(v).__module__ == "numpy" and getattr(v, "shape", None) == ()):
        return v.item()
    return v


def _check_hp(hp):
    # None too (a config file's null): torch.optim refuses it, and here it reached float()
    # (lr: "float() argument must be ... not 'NoneType'", naming nothing) or the library's
    # config key (weight_decay, momentum); adamw_lr None is "the group's lr"
    for k in ("lr", "weight_decay", "adamw_weight_decay", "adamw_lr", "momentum"):
        if k not in hp or (k == "adamw_lr" and hp[k] is None):
            continue
        v = _scalar(hp[k])
        if k == "momentum":
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1):
                raise ValueError(f"momentum = {v!r}: a number in [0, 1) (or a 1-element "
                                 "tensor)")
            continue
        if not (isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v) and v >= 0):
            # torch.optim.AdamW(params, lr, betas, ...) swapped for this class positionally:
            # its betas land on torch.optim.Muon's third argument, weight_decay
            hint = (" (torch.optim.AdamW's betas given by position? this class's positional "
                    "arguments are torch.optim.Muon's: params, lr, weight_decay, momentum, "
                    "nesterov, ...; give betas=(b1, b2), eps= and weight_decay= by name)"
                    if k == "weight_decay" and isinstance(v, (tuple, list)) and len(v) == 2
                    else "")
            raise ValueError(f"{k} = {v!r}: a finite number >= 0 (or a 1-element tensor){hint}")


# The library's smallest ns_eps / adamw_eps: FLT_MIN, the smallest normal fp32 (the kernels take
# them as fp32; 1e-300 was 0 there, and a zero gradient stepped every weight to NaN)
EPS_MIN = 1.1754943508222875e-38


def _check_eps(gi, g):
    """A group's eps (and a Muon group's ns_steps) in the ranges the library takes, named as the
    script gave them: torch.optim takes eps = 0 and ns_steps = 0, and the library's refusal
    named its own config keys (ns_eps, adamw_eps), not the keyword."""
    try:
        eps = float(g["eps"])
    except (TypeError, ValueError):
        eps = None
    if eps is None or not EPS_MIN <= eps <= 1:
        what = ("torch.optim.Muon's eps, added to the norm: X / (|X| + eps), so 0 would divide a "
                "zero gradient by 0" if g["algo"] == "muon" else "AdamW's eps")
        raise ValueError(f"param group {gi} ({g['algo']}): eps = {g['eps']!r}: accepted (0, 1], "
                         f"at least {EPS_MIN!r} ({what}; the kernels add it in fp32, where a "
                         "smaller one is 0)")
    n = g.get("ns_steps", 1)
    whole = (isinstance(n, int) and not isinstance(n, bool)) or type(n).__module__ == "numpy"
    if g["algo"] == "muon" and not (whole and 1 <= int(n) <= 16):
        raise ValueError(f"param group {gi} (muon): ns_steps = {g['ns_steps']!r}: accepted 1 to "
                         "16 Newton-Schulz iterations")


def _check_mesh_size(named, comm):
    """A DTensor's mesh over more ranks than comm holds: comm None (this process alone), or
    an MPI.COMM_WORLD of one rank, which each process of a torchrun launch is (torchrun starts
    no MPI job), where the library's refusal said only that a shard 'covers less than its
    extent'. named: (name, tensor) pairs."""
    meshes = [(n, p.device_mesh) for n, p in named if getattr(p, "device_mesh", None) is not None]
    get = getattr(comm, "Get_size", None)
    if not meshes or (comm is not None and not callable(get)):
        return  # no DTensor; or no communicator, which the binding names (_comm_handle)
    size = 1 if comm is None else get()
    for n, mesh in meshes:
        if mesh.size() <= size:
            continue
        if comm is None:
            raise ValueError(f"{n}: a DTensor over {mesh.size()} ranks, but comm is None (this "
                             "process alone): pass comm=MPI.COMM_WORLD (the ranks of the mesh, "
                             "in its order)")
        raise ValueError(f"{n}: a DTensor over {mesh.size()} ranks, but comm has {size} "
                         f"rank(s): comm must hold the ranks of the mesh, in its order. "
                         "MPI.COMM_WORLD holds one rank in each process torchrun starts (it "
                         "starts no MPI job): launch with mpiexec -n "
                         f"{mesh.size()} (torch.distributed can still rendezvous as before)")


def _muon_config(g):
    """The runtime config of a Muon group: torch.optim.Muon's hyperparameters as the library's
    keys (docs/python.md, switching from torch.optim.Muon)."""
    cfg = {"momentum": g["momentum"], "nesterov": bool(g["nesterov"]),
           "weight_decay": g["weight_decay"], "ns_steps": g["ns_steps"], "ns_eps": g["eps"]}
    c = g["ns_coefficients"]
    if isinstance(c, str):
        cfg["ns_coeffs"] = c
    elif len(c) and all(isinstance(t, (tuple, list)) for t in c):
        # a table, one triple per step (Emerging-Optimizers' polar_express and aol, and its
        # quintic repeated: _torch_ports), which the library takes as its custom table
        if len(c) != int(g["ns_steps"]) or any(len(t) != 3 for t in c):
            raise ValueError(f"ns_coefficients: a table of {len(c)} entries for ns_steps = "
                             f"{g['ns_steps']}: accepted one (a, b, c) triple per step")
        cfg["ns_coeffs"] = "custom"
        cfg["ns_custom_coeffs"] = [list(map(float, t)) for t in c]
    elif tuple(float(x) for x in c) == _JORDAN:
        cfg["ns_coeffs"] = "jordan"
    else:
        if len(c) != 3:
            raise ValueError(f"ns_coefficients = {c!r}: one (a, b, c) triple, a table of one "
                             "per step, or a table name (quintic, jordan, polar_express)")
        cfg["ns_coeffs"] = "custom"
        cfg["ns_custom_coeffs"] = [list(map(float, c))] * int(g["ns_steps"])
    fn = g["adjust_lr_fn"]
    # "none" (a factor of 1) is dion's adjust_lr=None (_torch_ports), which torch.optim.Muon
    # has no name for
    lr_scale = {None: "jordan", "original": "jordan", "match_rms_adamw": "rms_norm",
                "spectral_unclamped": "spectral_norm", "none": "none"}.get(fn)
    if lr_scale is None:
        raise ValueError(f"adjust_lr_fn = {fn!r}: accepted None / 'original' (sqrt(max(1, A/B))),"
                         " 'match_rms_adamw' (0.2 sqrt(max(A, B))), 'spectral_unclamped' "
                         "(sqrt(A/B)) or 'none' (1)")
    cfg["lr_scale"] = lr_scale
    return cfg


# torch.optim.AdamW's switches that change its arithmetic, which the library does not have: the
# keywords are refused (Muon.__init__), and so is a group that sets one (torch.optim.AdamW reads
# them per group). An AdamW group holds them as False, as torch.optim.AdamW's groups do, and
# they are fixed keys: set True later, the step refuses it instead of going on without it
_SWITCHES = ("maximize", "amsgrad", "capturable", "differentiable")


def _check_switches(gi, g):
    """Refuses a group that sets one of _SWITCHES (before, taken and ignored: a {"params": ...,
    "maximize": True} group was minimised, silently); an AdamW group gets them as False."""
    for k in _SWITCHES:
        if g.get(k):
            raise ValueError(f"param group {gi} ({g['algo']}): {k} = {g[k]!r}: not supported by "
                             f"shardopt.torch.Muon (only False is accepted); use torch.optim for "
                             f"{k}")
        if g["algo"] == "adamw":
            g.setdefault(k, False)


def _param_mults(name, p):
    """A parameter's own lr and weight-decay multipliers, modded-nanogpt's convention
    (`param.lr_mul = 75.` on the embeddings, `wd_mul` likewise), which its optimizers read as
    lr · lr_mul and a decay of lr · lr_mul · wd · wd_mul: the library's lr_mult and wd_mult.
    Before, ignored: a modded-nanogpt script moved its embeddings at 1/75 of its lr, silently."""
    out = []
    for attr in ("lr_mul", "wd_mul"):
        v = _scalar(getattr(p, attr, 1.0))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e6:
            raise ValueError(f"{name}: {attr} = {v!r} (the parameter's attribute, modded-"
                             f"nanogpt's multiplier of its lr or weight decay): accepted a "
                             f"number in [0, 1e6)")
        out.append(float(v))
    return out


def _check_ordered(params, where):
    """A set of tensors is refused, as torch.optim refuses one in a group: its order is that of
    the tensors' hashes, which changes between runs and between processes, and every rank
    registers its tensors in the order given (where names are made from the position, param.<i>
    on one rank was another tensor than on the next: with equal shapes, each rank's shard of
    another tensor's state). torch.optim takes a set as the whole params argument; here it is
    refused there too. Before, taken everywhere."""
    if isinstance(params, (set, frozenset)):
        raise TypeError(f"{where}: optimizer parameters need to be organized in ordered "
                        "collections, but the ordering of tensors in sets will change between "
                        "runs (and between ranks, each of which registers its tensors in that "
                        "order). Please use a list instead")
