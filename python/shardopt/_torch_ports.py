"""Other projects' spellings of the same optimizer, as shardopt.torch.Muon takes them, so that a
script written against one of them is ported by changing its import (docs/python.md, "Ported
from other Muon implementations"):

- Moonlight's Muon: Muon(lr=, wd=, muon_params=, adamw_params=, momentum=, nesterov=,
  ns_steps=, adamw_betas=, adamw_eps=), no params argument;
- microsoft/dion's Muon (and prime-rl's call of it): groups with "algorithm": "muon" | "adamw",
  "mu", "epsilon", "beta1" / "beta2", "adjust_lr", "distributed_mesh_name", and the keywords
  mu=, betas=, epsilon=, adjust_lr=, distributed_mesh=, world_mesh=, fsdp_mesh_dim=,
  matrix_partitions=, flatten=, use_triton=, newton_schulz_func=, cautious_wd= (False only),
  and its groups' num_heads (None or 1 only);
- Keller Jordan's MuonWithAuxAdam: groups with "use_muon" (the key itself is _split's);
- modded-nanogpt's Muon of its 2024-25 records: Muon(params, lr=, momentum=, nesterov=,
  ns_steps=, rank=, world_size=), no weight decay;
- Keller Jordan's Muon of December 2024 to February 2025 (muon.py, the one many projects
  copied): Muon(muon_params, lr=, momentum=, nesterov=, ns_steps=, adamw_params=, adamw_lr=,
  adamw_betas=, adamw_eps=, adamw_wd=), its AdamW lr adamw_lr / lr times the group's lr;
- NVIDIA Emerging-Optimizers' Muon (emerging_optimizers.orthogonalized_optimizers.Muon, which
  Megatron-Core's TensorParallelMuon derives from): Muon(params, lr=, momentum= (earlier
  momentum_beta=), weight_decay=, nesterov= (use_nesterov=), weight_decay_method= (earlier
  use_decoupled_weight_decay=, use_independent_weight_decay=), coefficient_type=, num_ns_steps=,
  scale_mode=, extra_scale_factor=, fp32_matmul_prec=, use_syrk=, split_qkv=, is_qkv_fn=,
  qkv_split_shapes=).

Each spelling is taken where it means what this class computes, and its keys left unset take
that project's defaults, not torch.optim's, so the ported run is the original's arithmetic. What
means something else (dion's "lion", a custom Newton-Schulz function, a flatten the tensors do
not follow, a mesh other than comm's ranks) is refused naming the key, the value and what is
accepted. Apart from torch.py, which holds the optimizer and its step."""
import torch

from shardopt._torch_config import _check_ordered, _torch_defaults

_UNSET = object()

# dion.Muon's adjust_lr as this class's adjust_lr_fn (_torch_config._muon_config): the same
# factor by shape (lr_scale spectral_norm sqrt(out/in), rms_norm 0.2 sqrt(max), none 1)
_DION_ADJUST = {"spectral_norm": "spectral_unclamped", "rms_norm": "match_rms_adamw",
                None: "none"}
# dion's group keys as this class's (a Muon group's epsilon is Newton-Schulz's, an AdamW one's
# AdamW's, as eps is here)
_DION_GROUP_KEYS = {"algorithm", "mu", "epsilon", "adjust_lr", "beta1", "beta2", "flatten",
                    "distributed_mesh_name",
                    "step"}
_DION_KEYWORDS = ("mu", "epsilon", "adjust_lr", "distributed_mesh", "world_mesh",
                  "fsdp_mesh_dim", "matrix_partitions", "flatten", "use_triton",
                  "newton_schulz_func", "cautious_wd")
_MOONLIGHT_KEYWORDS = ("muon_params", "adamw_params", "wd")
# modded-nanogpt's Muon splits the Newton-Schulz work over torch.distributed's ranks and gathers
# the updates: every rank ends with every matrix's update, as each rank's runtime computes it
_MODDED_KEYWORDS = ("rank", "world_size")
# Keller Jordan's muon.py of December 2024 to February 2025: muon_params first (positional),
# adamw_params, adamw_lr (which Moonlight's, derived from it, dropped) and adamw_wd
_JORDAN_KEYWORDS = ("adamw_wd",)
# NVIDIA Emerging-Optimizers' Muon, both spellings (momentum_beta / use_nesterov /
# use_decoupled_weight_decay before its weight_decay_method): the keywords that tell it apart
_EMERGING_KEYWORDS = ("num_ns_steps", "coefficient_type", "scale_mode", "extra_scale_factor",
                      "fp32_matmul_prec", "use_syrk", "weight_decay_method", "momentum_beta",
                      "use_nesterov", "use_decoupled_weight_decay",
                      "use_independent_weight_decay", "split_qkv", "is_qkv_fn",
                      "qkv_split_shapes")
# its coefficient tables (muon_utils._COEFFICIENT_SETS there), as its newton_schulz repeats
# them: quintic and aol whole tables (steps a multiple of their length), polar_express its 8
# then the last, simple its one triple. Its quintic and simple are the library's quintic and
# jordan; its polar_express (4 digits, no safety factor) and aol are not the library's
# tables of those names, so they go in as custom tables
_EMERGING_TABLES = {
    "simple": ((3.4445, -4.775, 2.0315),),
    "quintic": ((4.0848, -6.8946, 2.927), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)),
    "polar_express": ((8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184),
                      (3.9096, -2.8234, 0.525), (3.2856, -2.4153, 0.4853),
                      (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                      (1.8564, -1.2132, 0.3568), (1.875, -1.25, 0.375)),
    "aol": ((4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
            (2.7215, -3.0494, 1.3169))}
# its scale_mode as this class's adjust_lr_fn, and the factor the library's scale is off by:
# spectral sqrt(max(A, B)) is match_rms_adamw's 0.2 sqrt(max(A, B)) times 5
_EMERGING_SCALE = {"spectral": ("match_rms_adamw", 5.0), "shape_scaling": ("original", 1.0),
                   "unit_rms_norm": ("spectral_unclamped", 1.0)}
# MuonWithAuxAdam's defaults for the keys a group leaves out (Keller Jordan's muon.py)
_AUX_MUON = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0}
_AUX_ADAM = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}


def _moonlight_defaults():
    """Moonlight's Muon defaults (examples/toy_train.py there): torch.optim.Muon's arithmetic
    with its 0.2 sqrt(max(A, B)) lr scale, one lr and one wd for both sides, AdamW betas
    (0.9, 0.95)."""
    d = _torch_defaults()
    d.update(adjust_lr_fn="match_rms_adamw", adamw_betas=(0.9, 0.95), adamw_weight_decay=0.1)
    return d


def _dion_muon_defaults():
    """dion.Muon's defaults: lr 0.01, mu 0.95, betas (0.9, 0.95), weight_decay 0.01 and epsilon
    1e-8 on both sides, no Nesterov, adjust_lr spectral_norm, its quintic table (the library's
    quintic)."""
    d = _torch_defaults()
    d.update(lr=0.01, weight_decay=0.01, adamw_weight_decay=0.01, momentum=0.95,
             nesterov=False, ns_coefficients="quintic", eps=1e-8, adamw_eps=1e-8,
             adjust_lr_fn="spectral_unclamped", adamw_betas=(0.9, 0.95))
    return d


def _modded_defaults():
    """modded-nanogpt's Muon (records of late 2024 and early 2025, the ones taking rank and
    world_size): lr 0.02, momentum 0.95, Nesterov, 5 steps of Jordan's coefficients, the update
    scaled by sqrt(max(1, A/B)) (torch.optim.Muon's arithmetic), and no weight decay, where
    torch.optim.Muon's default is 0.1."""
    d = _torch_defaults()
    d.update(lr=0.02, weight_decay=0.0)
    return d


def _jordan_defaults():
    """Keller Jordan's Muon of December 2024 to February 2025 (muon.py at 28c793b): lr 0.02,
    momentum 0.95, Nesterov, 6 steps of Jordan's coefficients after X / (||X|| + 1e-7), the
    update scaled by sqrt(max(1, A/B)) (torch.optim.Muon's arithmetic), no weight decay on the
    Muon tensors; its AdamW betas (0.95, 0.95), eps 1e-8, weight decay 0 (and lr 3e-4, as
    _jordan's ratio to lr)."""
    d = _torch_defaults()
    d.update(lr=0.02, weight_decay=0.0, ns_steps=6, adamw_betas=(0.95, 0.95), adamw_eps=1e-8,
             adamw_weight_decay=0.0)
    return d


def _emerging_defaults():
    """Emerging-Optimizers' Muon defaults: lr 3e-4, momentum 0.95, weight decay 0.01 (decoupled,
    lr times it), no Nesterov, its quintic table (the library's quintic), 5 steps, the update
    scaled by sqrt(max(A, B)) (scale_mode spectral, extra_scale_factor 1: _emerging's scale
    multiplier on match_rms_adamw), eps 1e-7 (its newton_schulz's, torch.optim.Muon's).
    The AdamW side is torch.optim.AdamW's (its Muon steps matrices only)."""
    d = _torch_defaults()
    d.update(lr=3e-4, weight_decay=0.01, nesterov=False, ns_coefficients="quintic",
             adjust_lr_fn="match_rms_adamw")
    return d


def _emerging(given, extra):
    """Emerging-Optimizers' keywords as this class's, in place: given gets the aliases, the
    table (coefficient_type and num_ns_steps as ns_coefficients and ns_steps) and the scale
    (adjust_lr_fn). Returns the multiplier of the library's scale (extra_scale_factor, and 5
    for spectral), which each Muon tensor's lr_mult takes and its wd_mult divides out (the
    decay stays lr * wd, as there). What it computes otherwise is refused by name."""
    for theirs, ours in (("momentum_beta", "momentum"), ("use_nesterov", "nesterov")):
        if theirs in extra:
            _alias(given, ours, theirs, extra.pop(theirs))
    method = extra.pop("weight_decay_method", "decoupled")
    if "use_decoupled_weight_decay" in extra or "use_independent_weight_decay" in extra:
        dec = extra.pop("use_decoupled_weight_decay", True)
        ind = extra.pop("use_independent_weight_decay", False)
        method = "l2" if not dec else "independent" if ind else method
    if method != "decoupled":
        raise ValueError(f"weight_decay_method = {method!r} (Emerging-Optimizers' Muon): "
                         "accepted 'decoupled' (W * (1 - lr * wd), the library's); 'independent' "
                         "(W * (1 - wd)) and 'l2' (wd * W added to the gradient) are not what "
                         "the library computes")
    prec = extra.pop("fp32_matmul_prec", "medium")
    if prec not in ("highest", "high", "medium"):
        raise ValueError(f"fp32_matmul_prec = {prec!r}: accepted 'highest', 'high' or 'medium' "
                         "(ignored: config ns_compute chooses the library's Newton-Schulz "
                         "precision)")
    if extra.pop("use_syrk", False) not in (True, False):
        raise ValueError("use_syrk: accepted True or False (ignored: a kernel choice for the "
                         "same iteration)")
    split = extra.pop("split_qkv", False)
    extra.pop("is_qkv_fn", None)
    extra.pop("qkv_split_shapes", None)
    if split:
        raise ValueError(f"split_qkv = {split!r}: Emerging-Optimizers orthogonalizes the Q, K "
                         "and V blocks of a fused QKV weight apart; shardopt steps a tensor as "
                         "one matrix: register Q, K and V as parameters of their own, or give "
                         "split_qkv=False to step the fused weight whole")
    kind = extra.pop("coefficient_type", "quintic")
    steps = extra.pop("num_ns_steps", 5)
    if kind not in _EMERGING_TABLES:
        raise ValueError(f"coefficient_type = {kind!r}: accepted "
                         f"{', '.join(map(repr, _EMERGING_TABLES))} (Emerging-Optimizers' "
                         "tables; 'custom' takes a table its constructor cannot be given)")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 16:
        raise ValueError(f"num_ns_steps = {steps!r}: accepted 1 to 16")
    table = _EMERGING_TABLES[kind]
    n = len(table)
    if kind == "polar_express" and steps < n or kind in ("quintic", "aol") and steps % n:
        raise ValueError(f"num_ns_steps = {steps} with coefficient_type {kind!r}: "
                         + (f"at least {n}" if kind == "polar_express" else f"a multiple of {n}")
                         + " (Emerging-Optimizers' newton_schulz refuses it too)")
    table = (table * (steps // n) if kind != "polar_express"
             else table + table[-1:] * (steps - n))
    _alias(given, "ns_steps", "num_ns_steps", steps)
    _alias(given, "ns_coefficients", "coefficient_type",
           "quintic" if kind == "quintic" and steps == 5 else
           table[0] if kind == "simple" else table)
    mode = extra.pop("scale_mode", "spectral")
    factor = extra.pop("extra_scale_factor", 1.0)
    if mode not in _EMERGING_SCALE:
        raise ValueError(f"scale_mode = {mode!r}: accepted "
                         f"{', '.join(map(repr, _EMERGING_SCALE))} (Emerging-Optimizers')")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or \
            not 1e-4 <= factor <= 1e4:
        raise ValueError(f"extra_scale_factor = {factor!r}: accepted a number in [1e-4, 1e4]")
    fn, mult = _EMERGING_SCALE[mode]
    _alias(given, "adjust_lr_fn", "scale_mode", fn)
    return float(factor) * mult


def _is_jordan(params, given, extra):
    """Keller Jordan's spelling rather than Moonlight's (both have muon_params and
    adamw_params): its adamw_wd, its adamw_lr (Moonlight has one lr for both sides), or its
    muon_params given first by position (Moonlight's first is lr, and it takes no params)."""
    lists = "muon_params" in extra or "adamw_params" in extra
    return "adamw_wd" in extra or (lists and "wd" not in extra and (
        params is not _UNSET or given.get("adamw_lr", _UNSET) is not _UNSET))


def _jordan(params, given, extra):
    """(groups, given, ratio) of Keller Jordan's call: its muon_params of 2 or more dims to Muon
    (those under 2 dims and adamw_params to AdamW, as its use_muon marks them), and ratio =
    adamw_lr / lr, which every AdamW group then holds as adamw_lr_ratio, at the Muon lr, and
    the step multiplies in: its AdamW lr is that ratio times the group's lr, so a schedule or
    a hand-written `g["lr"] = ...` over every group moves both sides as it does there."""
    if "wd" in extra:
        raise ValueError("wd (Moonlight's Muon) and adamw_wd (Keller Jordan's) both given: port "
                         "from one")
    muon, adamw = extra.pop("muon_params", None), extra.pop("adamw_params", None)
    if params is not _UNSET:
        if muon is not None:
            raise ValueError("params and muon_params both given: give the tensors one way")
        muon = params
    if muon is None:
        raise TypeError("shardopt.torch.Muon: no parameters: give muon_params (Keller Jordan's "
                        "first argument)")
    _check_ordered(muon, "muon_params")
    _check_ordered(adamw, "adamw_params")
    if "adamw_wd" in extra:
        _alias(given, "adamw_weight_decay", "adamw_wd", extra.pop("adamw_wd"))
    lr = given["lr"] if given.get("lr", _UNSET) is not _UNSET else 0.02
    alr = given["adamw_lr"] if given.get("adamw_lr", _UNSET) is not _UNSET else 3e-4
    lr_f = float(lr)
    if not lr_f > 0:
        raise ValueError(f"lr = {lr!r}: Keller Jordan's Muon sets its AdamW lr as adamw_lr / lr "
                         "times the group's lr: accepted lr > 0")

    def ndim(p):
        return (p[1] if isinstance(p, tuple) else p).ndim
    muon = list(muon)
    # the AdamW parts take the group's lr (adamw_lr None), times the ratio _split gives them
    # (add_param_group's too)
    given["adamw_lr"] = None
    groups = [{"params": [p for p in muon if ndim(p) >= 2], "algo": "muon"},
              {"params": [p for p in muon if ndim(p) < 2] + list(adamw or []), "algo": "adamw"}]
    return [g for g in groups if g["params"]], given, float(alr) / lr_f


def _alias(given, ours, theirs, value):
    """given[ours] = value (their spelling), refused where ours was given too."""
    if given.get(ours, _UNSET) is not _UNSET:
        raise ValueError(f"{ours} and {theirs} both given: {theirs} is {ours} "
                         f"(shardopt.torch.Muon's name); give one")
    given[ours] = value


def _mesh_ranks(mesh):
    """(size, this rank's index) of dion's distributed_mesh: a 1-D DeviceMesh or a
    ProcessGroup."""
    import torch.distributed as dist
    if hasattr(mesh, "get_local_rank") and hasattr(mesh, "ndim"):
        if mesh.ndim != 1:
            raise ValueError(f"distributed_mesh: a {mesh.ndim}-D DeviceMesh: dion takes a 1-D "
                             "mesh (the sharded sub-mesh), and so does this class")
        return mesh.size(), mesh.get_local_rank()
    if isinstance(mesh, dist.ProcessGroup):
        return dist.get_world_size(mesh), dist.get_rank(mesh)
    raise TypeError(f"distributed_mesh: {type(mesh).__name__}: accepted None, a 1-D DeviceMesh "
                    "or a ProcessGroup (dion's)")


def _check_mesh(mesh, comm):
    """dion's distributed_mesh is the group of ranks the optimizer spans; here that is comm (an
    mpi4py communicator). Taken where it has comm's size and this rank at comm's rank, as dion
    reads it (the group rank, which torch numbers in global rank order; one rank and comm None
    included), refused otherwise."""
    if mesh is None:
        return
    size, rank = _mesh_ranks(mesh)
    csize, crank = (1, 0) if comm is None else (comm.Get_size(), comm.Get_rank())
    if (size, rank) != (csize, crank):
        raise ValueError(
            f"distributed_mesh: {size} rank(s), this one at {rank}; comm: {csize} rank(s), this "
            f"one at {crank}: shardopt.torch.Muon spans the ranks of comm (an mpi4py "
            "communicator, None for this process alone); pass comm=MPI.COMM_WORLD in the "
            "mesh's rank order, or leave distributed_mesh out")


def _world_mesh(mesh, dim):
    """dion's world_mesh (the job's whole DeviceMesh, or None) and fsdp_mesh_dim (which of its
    dims FSDP shards over), which dion reads to find each tensor's shards: taken and checked,
    not needed here (the library reads each DTensor's own mesh and placements, and spans
    comm)."""
    if mesh is not None and not (hasattr(mesh, "ndim") and hasattr(mesh, "size")):
        raise TypeError(f"world_mesh: {type(mesh).__name__}: accepted None or a DeviceMesh "
                        "(dion's)")
    ndim = mesh.ndim if mesh is not None else None
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0 or \
            (ndim is not None and dim >= ndim):
        raise ValueError(f"fsdp_mesh_dim = {dim!r}: accepted a dim of world_mesh"
                         + (f" (0 to {ndim - 1})" if ndim is not None else " (an int >= 0)"))


def _dion_group(g, gi):
    """A dion param group as this class's keys (a copy)."""
    g = dict(g)
    if "algorithm" in g:
        algo = g.pop("algorithm")
        if algo not in ("muon", "adamw"):
            raise ValueError(f"param group {gi}: algorithm = {algo!r}: accepted 'muon' or "
                             "'adamw' (shardopt has no Lion, nor dion's other update rules)")
        if g.get("algo", algo) != algo:
            raise ValueError(f"param group {gi}: algo {g['algo']!r} and algorithm {algo!r} "
                             "disagree; give one")
        g["algo"] = algo
        g["_algorithm"] = algo  # back under dion's key in the group made (_torch_split)
    for theirs, ours in (("mu", "momentum"), ("adjust_lr", "adjust_lr_fn")):
        if theirs in g:
            if ours in g:
                raise ValueError(f"param group {gi}: {ours} and {theirs} both given; give one")
            v = g.pop(theirs)
            if theirs == "adjust_lr":
                if v not in _DION_ADJUST:
                    raise ValueError(f"param group {gi}: adjust_lr = {v!r}: accepted "
                                     "'spectral_norm', 'rms_norm' or None (dion's)")
                v = _DION_ADJUST[v]
            g[ours] = v
    if "epsilon" in g:
        if "eps" in g:
            raise ValueError(f"param group {gi}: eps and epsilon both given; give one")
        eps = g.pop("epsilon")
        # a mixed group's eps is Newton-Schulz's: its AdamW part takes epsilon too, as dion's
        g["eps"] = eps
        g.setdefault("adamw_eps", eps)
    if "beta1" in g or "beta2" in g:
        if "betas" in g:
            raise ValueError(f"param group {gi}: betas and beta1 / beta2 both given; give one")
        b1, b2 = g.pop("beta1", _UNSET), g.pop("beta2", _UNSET)
        if b1 is _UNSET or b2 is _UNSET:
            raise ValueError(f"param group {gi}: beta1 and beta2 are a pair: give both (or "
                             "betas=(beta1, beta2))")
        g["betas"] = (b1, b2)
    name = g.get("distributed_mesh_name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"param group {gi}: distributed_mesh_name = {name!r}: accepted None or "
                         "the name of a dim of world_mesh (dion's)")
    # kept as dion keeps it (prime-rl reads it back from param_groups), and unused: the
    # library reads where each tensor is sharded from the DTensor itself (an expert stack on
    # an 'ep' mesh dim included, shardopt.torch_params)
    g.pop("step", None)  # dion's group step count: each tensor's own is the library's
    if "flatten" in g:
        g["flatten"] = bool(g["flatten"])
    return g


def port(params, given, extra, comm):
    """(params, given, base, flatten): the call as this class's own spelling. params and given
    (keyword -> value or _UNSET) as the caller has them; extra: the keywords this class does not
    name (the other projects'). base: the defaults of the unset keys (the ported project's);
    flatten: dion's flatten (None: not dion's spelling), which _check_flatten holds the Muon
    tensors to."""
    extra = dict(extra)
    unknown = sorted(set(extra) - set(_DION_KEYWORDS) - set(_MOONLIGHT_KEYWORDS)
                     - set(_MODDED_KEYWORDS) - set(_JORDAN_KEYWORDS) - set(_EMERGING_KEYWORDS))
    if unknown:
        raise TypeError(f"shardopt.torch.Muon got an unexpected keyword argument {unknown[0]!r} "
                        "(accepted besides torch.optim.Muon's and the AdamW side's: Moonlight's "
                        f"{', '.join(_MOONLIGHT_KEYWORDS)}, Keller Jordan's "
                        f"{', '.join(_JORDAN_KEYWORDS)}, dion's "
                        f"{', '.join(_DION_KEYWORDS)}, modded-nanogpt's "
                        f"{', '.join(_MODDED_KEYWORDS)} and Emerging-Optimizers' "
                        f"{', '.join(_EMERGING_KEYWORDS)}; docs/python.md)")
    given = dict(given)
    moon = [k for k in _MOONLIGHT_KEYWORDS if k in extra]
    dion = [k for k in _DION_KEYWORDS if k in extra]
    base, flatten = _torch_defaults(), None
    modded = [k for k in _MODDED_KEYWORDS if k in extra]
    emerging = [k for k in _EMERGING_KEYWORDS if k in extra]
    other = moon or dion or modded or [k for k in _JORDAN_KEYWORDS if k in extra]
    if emerging:
        if other:
            raise ValueError(f"{emerging[0]} (Emerging-Optimizers' Muon) and {other[0]} "
                             "(another project's) both given: port from one")
        mult = _emerging(given, extra)
        base = _emerging_defaults()
        base["muon_scale_mult"] = mult  # not a keyword: each Muon tensor's lr_mult (torch.py)
    if modded:
        if moon or dion:
            raise ValueError(f"{modded[0]} (modded-nanogpt's Muon) and {(moon or dion)[0]} "
                             "(another project's) both given: port from one")
        rank, size = extra.pop("rank", 0), extra.pop("world_size", 1)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, size)) or \
                not 0 <= rank < size:
            raise ValueError(f"rank = {rank!r}, world_size = {size!r} (modded-nanogpt's): "
                             "accepted integers with 0 <= rank < world_size (taken and unused: "
                             "every rank's runtime computes every matrix's update)")
        base = _modded_defaults()
    if "adamw_wd" in extra and (dion or modded):
        raise ValueError(f"adamw_wd (Keller Jordan's Muon) and {(dion or modded)[0]} (another "
                         "project's) both given: port from one")
    if (moon or "adamw_wd" in extra) and _is_jordan(params, given, extra):
        params, given, ratio = _jordan(params, given, extra)
        base, moon = _jordan_defaults(), []
        base["adamw_lr_ratio"] = ratio  # not a keyword: the constructor keeps it for _split
    if moon:
        if dion:
            raise ValueError(f"{moon[0]} (Moonlight's Muon) and {dion[0]} (dion's) both given: "
                             "port from one")
        if "wd" in extra:
            _alias(given, "weight_decay", "wd", extra.pop("wd"))
        muon, adamw = extra.pop("muon_params", None), extra.pop("adamw_params", None)
        _check_ordered(muon, "muon_params")
        _check_ordered(adamw, "adamw_params")
        if params is not _UNSET:
            if muon is not None or adamw is not None:
                raise ValueError("params and muon_params / adamw_params both given: give the "
                                 "tensors one way")
        else:
            # Moonlight's lists fix each tensor's algorithm, as its use_muon state does
            params = [{"params": list(ps), "algo": a}
                      for ps, a in ((muon, "muon"), (adamw, "adamw")) if ps is not None]
            params = [g for g in params if g["params"]]
        base = _moonlight_defaults()
    groups = None
    if params is not _UNSET and not isinstance(params, torch.Tensor):
        groups = list(params)
        params = groups
    dion_groups = groups is not None and any(
        isinstance(g, dict) and _DION_GROUP_KEYS & set(g) for g in groups)
    if dion or dion_groups:
        mesh = extra.pop("distributed_mesh", None)
        _check_mesh(mesh, comm)
        nsf = extra.pop("newton_schulz_func", None)
        if nsf is not None:
            raise ValueError(f"newton_schulz_func = {nsf!r}: accepted None (the library's "
                             "Newton-Schulz; ns_coefficients / config ns_* choose its table)")
        _check_cautious(extra.pop("cautious_wd", False), "cautious_wd")
        triton = extra.pop("use_triton", False)
        if triton not in (True, False):
            raise ValueError(f"use_triton = {triton!r}: accepted True or False (ignored: it "
                             "chooses dion's kernel for the same iteration)")
        _world_mesh(extra.pop("world_mesh", None), extra.pop("fsdp_mesh_dim", 0))
        parts = extra.pop("matrix_partitions", None)
        if parts:
            first = next(iter(parts))
            raise ValueError(
                f"matrix_partitions: {len(parts)} packed parameter(s) (the first of shape "
                f"{list(getattr(first, 'shape', []))}): dion orthogonalizes each partition apart; "
                "shardopt steps a tensor as one matrix (or a stack of experts): register each "
                "logical matrix as its own parameter, or leave matrix_partitions out to step "
                "the packed matrix whole")
        flatten = bool(extra.pop("flatten", False))
        if "mu" in extra:
            _alias(given, "momentum", "mu", extra.pop("mu"))
        if "epsilon" in extra:
            eps = extra.pop("epsilon")
            _alias(given, "eps", "epsilon", eps)
            if given.get("adamw_eps", _UNSET) is _UNSET:
                given["adamw_eps"] = eps  # dion's epsilon is both sides'
        if "adjust_lr" in extra:
            v = extra.pop("adjust_lr")
            if v not in _DION_ADJUST:
                raise ValueError(f"adjust_lr = {v!r}: accepted 'spectral_norm', 'rms_norm' or "
                                 "None (dion's)")
            _alias(given, "adjust_lr_fn", "adjust_lr", _DION_ADJUST[v])
        base = _dion_muon_defaults()
    if groups is not None:
        params = [port_group(g, gi, given) if isinstance(g, dict) else g
                  for gi, g in enumerate(groups)]
        if dion or dion_groups:
            params = [_dion_default_algo(g) for g in params]
    return params, given, base, flatten


def _dion_default_algo(g):
    """A group of a dion call that names no algorithm is dion's default, a Muon group (its
    defaults hold algorithm "muon"; OLMo-core's matrix group names none): "algo": "muon"
    where its tensors are all matrices (dion refuses others there; here they keep the
    classification by shape). Before, classified by shape and, its tensors unnamed, with a
    warning that every 2-D tensor goes to Muon, embeddings and the output head included,
    which the script's own grouping had already decided."""
    if not isinstance(g, dict) or {"algo", "use_muon"} & set(g):
        return g
    ps = g.get("params")
    ps = [ps] if isinstance(ps, torch.Tensor) else list(ps or [])  # a generator read once
    ts = [p[1] if isinstance(p, (tuple, list)) and len(p) == 2 else p for p in ps]
    muon = ts and all(isinstance(t, torch.Tensor) and t.ndim >= 2 for t in ts)
    return dict(g, params=ps, **({"algo": "muon"} if muon else {}))


def port_group(g, gi, given):
    """One param group in this class's keys (a copy where anything changed): dion's keys
    translated, a MuonWithAuxAdam group's left-out keys given its class's defaults. For the
    constructor's groups and for add_param_group's, which a ported script calls with the same
    spelling."""
    # dion's per-group options (OLMo-core's groups set them), whichever spelling the call has
    if "cautious_wd" in g:
        _check_cautious(g["cautious_wd"], f"param group {gi}: cautious_wd")
    if "num_heads" in g:
        _check_heads(g["num_heads"], gi)
    if _DION_GROUP_KEYS & set(g):
        g = _dion_group(g, gi)
    if "use_muon" in g:
        g = _aux_group(g, given)
    return g


def _check_cautious(v, what):
    """dion's cautious_wd (its newer Muon, OLMo-core's MuonConfig passes it): False taken; True
    decays only the elements where the update and the weight agree in sign, which the library
    does not do (it decays every element), so it is refused. Before: the keyword was an
    unexpected one, and a group's key was kept and ignored."""
    if v not in (False, None):
        raise ValueError(f"{what} = {v!r} (dion's): accepted False (the library decays every "
                         "element: W * (1 - lr * wd)); cautious weight decay, only where the "
                         "update and the weight agree in sign, is not what it computes")


def _check_heads(v, gi):
    """dion's num_heads group option (OLMo-core sets it on its attention projections): None
    or 1 steps the matrix whole, as here; more splits a [heads * d, in] matrix into heads
    [d, in] matrices orthogonalized apart, which the library does not do: refused by name.
    Before: kept in the group and ignored, the projections stepped whole, silently."""
    if v is None or (v == 1 and isinstance(v, int) and not isinstance(v, bool)):
        return
    raise ValueError(f"param group {gi}: num_heads = {v!r} (dion's): accepted None or 1; dion "
                     "orthogonalizes each head's rows apart, shardopt steps a matrix whole: "
                     "register each head's rows as a parameter of its own, or leave num_heads "
                     "out to step the whole matrix")


def _aux_group(g, given):
    """A MuonWithAuxAdam group with its class's defaults for the keys it leaves out (weight
    decay 0, an Adam group's betas (0.9, 0.95) and eps 1e-10), where this call's keywords do
    not set them: those defaults are the ported script's arithmetic."""
    g = dict(g)
    aux = _AUX_MUON if g["use_muon"] else _AUX_ADAM
    kw = {"lr": ("lr",) if g["use_muon"] else ("adamw_lr", "lr"),
          "momentum": ("momentum",), "weight_decay": ("weight_decay", "adamw_weight_decay"),
          "betas": ("adamw_betas",), "eps": ("adamw_eps",)}
    for k, v in aux.items():
        if k not in g and all(given.get(w, _UNSET) is _UNSET for w in kw[k]):
            g[k] = v
    return g


def check_flatten(flatten, named, gi):
    """dion's flatten against how the library takes a Muon tensor of 3 or more dims: an expert
    stack [E, out, in] is E matrices (dion's flatten=False), any other such tensor one
    [out, in·...] matrix (flatten=True). A tensor the two would treat otherwise is refused by
    name; 2-D tensors are the same either way."""
    for name, p, stacked in named:
        if p.ndim < 3 or stacked == (not flatten):
            continue
        how = "a stack of matrices (expert=)" if stacked else "one [out, in...] matrix"
        raise ValueError(f"param group {gi}: {name}: shape {list(p.shape)} is stepped as {how}, "
                         f"but flatten = {flatten}: dion would take it as "
                         f"{'one flattened matrix' if flatten else 'a batch of matrices'}; "
                         "name expert stacks with expert= and give flatten=False, or "
                         "flatten=True for convolution kernels, not both in one optimizer")
