"""Which algorithm a parameter of shardopt.torch.Muon gets when its group does not say: by the
model's modules (model=), else by its name (embeddings and output heads to AdamW) and its
dimensions, and the names as the bare model has them under the wrappers' prefixes; and where a
parameter's memory starts, which tells distinct tensors over one memory apart. Apart from
torch.py, which holds the optimizer and its step."""
import warnings

import torch

# names that are embeddings or output heads in the usual trainers (the library's default list
# plus nanoGPT's wte / wpe): AdamW under torch's conventions too
_ADAMW_NAMES = ["embed", "lm_head", "=output.weight", "wte", "wpe", "tok_embeddings"]
_HEAD_NAMES = ("lm_head", "output", "head", "classifier")


def _matches(name, patterns):
    return any(name == p[1:] if p.startswith("=") else p in name for p in patterns if p)


def _unwrapped(name):
    """A parameter's name as the bare model has it: without DDP's and DataParallel's leading
    module., torch.compile's _orig_mod., FSDP1's and activation checkpointing's wrapper
    components. An exact pattern (=output.weight, llama's head) never matched
    module.output.weight, and the head went to Muon, silently. Twin of runtime/classify.c's
    equals_unwrapped, kept apart: this splits groups before a runtime exists and runs every
    pattern on the bare name (C: substrings on the given one)."""
    for w in ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        name = name.replace(w, "")
    while name.startswith("module."):
        name = name[len("module."):]
    return name


def _classify_by_model(model):
    """{id(parameter): "adamw"} for the parameters a model's modules say are not hidden
    matrices: nn.Embedding weights (a head tied to one is the same tensor), and a Linear output
    head named lm_head, output, head or classifier (an untied head is told apart by its name
    only: its shape is an ordinary matrix's)."""
    out = {}
    for mname, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding):
            out[id(m.weight)] = "adamw"
        elif isinstance(m, torch.nn.Linear) and mname.rsplit(".", 1)[-1] in _HEAD_NAMES:
            out[id(m.weight)] = "adamw"
    return out


def _memory(p):
    """Where a parameter's elements start, (device, address), or None for none (empty, meta):
    two tensor objects starting at one address overlap."""
    t = p.to_local() if hasattr(p, "to_local") and hasattr(p, "placements") else p
    if t.numel() == 0 or t.device.type == "meta":
        return None
    return (str(t.device), t.data_ptr())


def _algo(name, p, by_model, patterns):
    """A parameter's algorithm where its group fixes none: by_model's (_classify_by_model),
    else AdamW for fewer than 2 dims (or at most one dim over 1: a [1, 1, d] token) and for
    a name matching patterns (None: _ADAMW_NAMES), else Muon."""
    if id(p) in by_model:
        return by_model[id(p)]
    if p.ndim < 2 or (p.ndim > 2 and sum(d > 1 for d in p.shape) <= 1):
        # a vector in more dims: ViTs' [1, 1, d] cls_token / mask_token / dist_token, which
        # torch.optim.Muon refuses (3-D) and its scripts give AdamW; as a stack it was one
        # [1, d] matrix whose Muon update is its direction alone
        return "adamw"
    return "adamw" if _matches(_unwrapped(name), patterns if patterns is not None
                               else _ADAMW_NAMES) else "muon"


def _conv_kernels(model):
    """The ids of model's 3-D convolution kernels (nn.Conv1d, nn.ConvTranspose1d: [out, in, k]),
    which Muon steps as one [out, in * k] matrix as it does a Conv2d's 4-D kernel; any other
    3-D tensor is taken as a stack of matrices (an expert stack), which a Conv1d kernel is not:
    each [in, k] slice was orthogonalized on its own."""
    return {id(m.weight) for m in model.modules()
            if isinstance(m, torch.nn.modules.conv._ConvNd) and m.weight is not None
            and m.weight.ndim == 3}


def _warn_stack(sp):
    """Warns where a Muon parameter (a shardopt.Param) is a 3-D tensor that model= does not
    show as a Conv1d kernel and expert= does not name: it is stepped as a stack of matrices,
    which a Conv1d kernel should not be. True where it warned (once per optimizer)."""
    if len(sp.shape) != 3 or sp.placement == "expert" or sp.shape[0] == 1:
        return False  # [1, out, in]: one matrix, no stack
    e, a, b = sp.shape
    warnings.warn(f"shardopt.torch.Muon: {sp.name} {list(sp.shape)} is stepped as {e} [{a}, {b}] "
                  "matrices (an expert stack); a Conv1d kernel [out, in, k] is one [out, in*k] "
                  "matrix where model= shows its module: pass model=model, or expert= naming the "
                  "stacks", stacklevel=5)
    return True


def _flat_3d(algo, flatten, moonlight, named, expert, convs):
    """The ids of a group's 3-D tensors to register as one [out, in * k] matrix rather than a
    stack: a Muon group's Conv1d kernels that model= shows (convs, _conv_kernels); with dion's
    flatten=True, or under Moonlight's spelling (which flattens every tensor of more than 2
    dims), every 3-D one that expert= does not name; none with dion's flatten=False (a batch
    of matrices, as dion takes them). named: the group's (name, tensor) pairs."""
    if algo != "muon" or flatten is False:
        return set()
    if flatten is True or moonlight:
        return {id(p) for n, p in named
                if p.ndim == 3 and not (expert is not None and expert(n))}
    return convs
