"""shardopt for Python trainers: a ctypes binding of libshardopt (no compiled extension).

    import shardopt
    opt = shardopt.Optimizer(params, comm=MPI.COMM_WORLD, config={"momentum": 0.95, "dp_shard": 2})
    opt.step(lr=0.02)

`params` is a list of shardopt.Param (or dicts with the same fields): the global shape, this
rank's shard (a numpy array, or a torch tensor on the CPU or a CUDA device, row-major and
contiguous) with its gradient, and where the shard sits (shard_dim, shard_offset). The library
updates the shard in place. Config keys are those of docs/config.md, set as text exactly as the
SHARDOPT_<KEY> env vars would be. Errors raise shardopt.Error carrying the C status and the
library's message. The library is found through SHARDOPT_LIBRARY, then next to a source checkout
(build/libshardopt.so), then on the loader path."""
import ctypes
import ctypes.util
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

__all__ = ["Error", "Param", "Optimizer", "library", "torch_params"]

_STATUS = {0: "ok", -1: "invalid argument", -2: "invalid state", -3: "out of memory",
           -4: "mismatch between ranks", -5: "unsupported", -6: "I/O error", -7: "corrupt data",
           -8: "non-finite value", -9: "internal error", -10: "communication error",
           -11: "NCCL error", -12: "CUDA device error"}
DTYPES = {"fp32": 0, "bf16": 1}
PLACEMENTS = {"dense": 0, "expert": 1, "replicated": 2}
ALGOS = {"auto": 0, "muon": 1, "adamw": 2}


class Error(RuntimeError):
    """A failed library call: .status (negative int), .message (shardopt_last_error())."""

    def __init__(self, call, status, message):
        super().__init__(f"shardopt_{call}: {_STATUS.get(status, status)} ({status}): {message}")
        self.status, self.message = status, message


class _Desc(ctypes.Structure):  # shardopt_param_desc_t, version 1
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32),
                ("name", ctypes.c_char_p), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 3), ("param_dtype", ctypes.c_int),
                ("grad_dtype", ctypes.c_int), ("transposed", ctypes.c_int),
                ("placement", ctypes.c_int), ("shard_dim", ctypes.c_int),
                ("shard_offset", ctypes.c_int64), ("shard_length", ctypes.c_int64),
                ("data", ctypes.c_void_p), ("grad", ctypes.c_void_p), ("algo", ctypes.c_int),
                ("lr_mult", ctypes.c_double), ("wd_mult", ctypes.c_double)]


class _StepArgs(ctypes.Structure):  # shardopt_step_args_t, version 1
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32),
                ("lr", ctypes.c_double), ("adamw_lr", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("stream", ctypes.c_void_p),
                ("max_grad_norm", ctypes.c_double)]


class _Stats(ctypes.Structure):  # a prefix of shardopt_stats_t (size says how much to fill)
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32),
                ("steps", ctypes.c_uint64), ("num_params", ctypes.c_int),
                ("num_muon", ctypes.c_int), ("num_adamw", ctypes.c_int),
                ("muon_matrices", ctypes.c_int64), ("ns_symmetric", ctypes.c_int64),
                ("bytes_momentum", ctypes.c_uint64), ("bytes_adam_m", ctypes.c_uint64),
                ("bytes_adam_v", ctypes.c_uint64), ("bytes_workspace", ctypes.c_uint64),
                ("ns_flops_last", ctypes.c_double), ("seconds_last", ctypes.c_double),
                ("seconds_total", ctypes.c_double), ("seconds_adamw_last", ctypes.c_double),
                ("seconds_momentum_last", ctypes.c_double), ("seconds_ns_last", ctypes.c_double),
                ("seconds_apply_last", ctypes.c_double), ("kernels", ctypes.c_char * 32),
                ("rank", ctypes.c_int), ("world", ctypes.c_int), ("replica", ctypes.c_int),
                ("dp_replicate", ctypes.c_int), ("dense_rank", ctypes.c_int),
                ("dense_size", ctypes.c_int), ("ep_rank", ctypes.c_int), ("ep_size", ctypes.c_int),
                ("expert_shard_rank", ctypes.c_int), ("expert_shard_size", ctypes.c_int),
                ("grad_norm_last", ctypes.c_double), ("steps_skipped", ctypes.c_uint64),
                ("last_step_skipped", ctypes.c_int), ("nonfinite_params", ctypes.c_char * 256),
                ("bytes_sent_dense", ctypes.c_uint64), ("bytes_recv_dense", ctypes.c_uint64),
                ("bytes_sent_expert", ctypes.c_uint64), ("bytes_recv_expert", ctypes.c_uint64)]


_lib = None


def library():
    """The loaded libshardopt (ctypes.CDLL), with its signatures declared."""
    global _lib
    if _lib is not None:
        return _lib
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("SHARDOPT_LIBRARY"),
                  os.path.join(here, "..", "..", "build", "libshardopt.so"),
                  ctypes.util.find_library("shardopt")]
    path = next((c for c in candidates if c and (os.path.exists(c) or "/" not in c)), None)
    if path is None:
        raise OSError("libshardopt not found: set SHARDOPT_LIBRARY to its path")
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    P, S, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    sigs = {"shardopt_config_init": [P, S], "shardopt_config_set": [P, ctypes.c_char_p, ctypes.c_char_p],
            "shardopt_config_validate": [P], "shardopt_init": [P, P, ctypes.POINTER(P)],
            "shardopt_register": [P, ctypes.POINTER(_Desc), ctypes.POINTER(P)],
            "shardopt_param_set_pointers": [P, P, P],
            "shardopt_param_get_algo": [P, ctypes.POINTER(I)], "shardopt_commit": [P],
            "shardopt_step": [P, ctypes.POINTER(_StepArgs)],
            "shardopt_get_stats": [P, ctypes.POINTER(_Stats)], "shardopt_save": [P, ctypes.c_char_p],
            "shardopt_load": [P, ctypes.c_char_p], "shardopt_finalize": [P]}
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, I
    lib.shardopt_last_error.argtypes, lib.shardopt_last_error.restype = [], ctypes.c_char_p
    _lib = lib
    return lib


def _check(call, status):
    if status != 0:
        raise Error(call, status, library().shardopt_last_error().decode(errors="replace"))


def _config_text(v):
    """A config value as its SHARDOPT_<KEY> text: booleans 1/0, a list of patterns "a,b", a
    list of coefficient triples "a,b,c;d,e,f"."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (list, tuple)):
        return ";".join(map(_config_text, v)) if any(isinstance(x, (list, tuple)) for x in v) \
            else ",".join(map(str, v))
    return str(v)


def _comm_handle(comm):
    """The MPI_Comm of an mpi4py communicator (MPI_COMM_SELF when None)."""
    from mpi4py import MPI
    comm = MPI.COMM_SELF if comm is None else comm
    return ctypes.c_void_p(MPI._handleof(comm)), comm


def _buffer(x, what):
    """(address, dtype name, element count) of a contiguous numpy array or torch tensor."""
    if x is None:
        return None, None, 0
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch
        if not x.is_contiguous():
            raise ValueError(f"{what}: the torch tensor must be contiguous")
        dt = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(x.dtype)
        if dt is None:
            raise ValueError(f"{what}: dtype {x.dtype} is not float32 or bfloat16")
        return x.data_ptr(), dt, x.numel()
    import numpy as np
    if not isinstance(x, np.ndarray) or not x.flags["C_CONTIGUOUS"]:
        raise ValueError(f"{what}: needs a C-contiguous numpy array or torch tensor")
    if x.dtype == np.float32:
        dt = "fp32"
    elif x.dtype == np.uint16 or str(x.dtype) == "bfloat16":
        dt = "bf16"  # raw bf16 bits (numpy has no bfloat16 of its own)
    else:
        raise ValueError(f"{what}: dtype {x.dtype} is not float32 or bf16 (uint16 bits)")
    return x.ctypes.data, dt, x.size


@dataclass
class Param:
    """One parameter shard as this rank holds it (docs/api.md, shardopt_param_desc_t)."""
    name: str
    shape: Sequence[int]            # global shape: [out, in], or [E, out, in] for experts
    data: Any                       # this rank's shard (numpy / torch), updated in place
    grad: Any = None                # same layout and dtype family; may be set before step()
    placement: str = "dense"        # dense | expert | replicated
    shard_dim: int = 0
    shard_offset: int = 0
    shard_length: int = -1          # -1: the whole dim
    transposed: bool = False
    algo: str = "auto"              # auto | muon | adamw
    lr_mult: float = 1.0
    wd_mult: float = 1.0
    handle: Any = field(default=None, repr=False)
    source: Any = field(default=None, repr=False)  # the torch parameter (torch_params)


def torch_params(named_parameters, expert=None):
    """shardopt.Params from (name, torch parameter) pairs, as model.named_parameters() gives.

    A DTensor (FSDP2's fully_shard, or any DeviceMesh sharding) registers its local shard
    (to_local(), which shares the parameter's storage) with shard_dim and shard_offset read from
    its placements: one Shard(d) mesh dim at most, the others Replicate (HSDP). A plain tensor is
    whole on every rank (placement "replicated", as with DDP). `expert(name)` says which are
    [E, out, in] expert stacks; their shard_offset along dim 0 is taken within this rank's EP
    stack. Gradients are read from each parameter's .grad at every step() (FSDP2 makes new ones
    each backward), so none is needed here."""
    import torch
    out = []
    for name, p in named_parameters:
        if not p.requires_grad:  # frozen: no gradient ever comes (torch.optim skips them too)
            continue
        local, placement, sdim, soff, slen = p.detach(), "replicated", 0, 0, -1
        if hasattr(p, "placements") and hasattr(p, "to_local"):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            shards = [pl.dim for pl in p.placements if pl.is_shard()]
            if len(shards) > 1 or any(not (pl.is_shard() or pl.is_replicate())
                                      for pl in p.placements):
                raise ValueError(f"{name}: placements {p.placements}: one Shard(d) at most, the "
                                 "others Replicate")
            local = p.to_local().detach()
            if shards:
                shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                      p.placements)
                placement, sdim = "dense", shards[0]
                soff, slen = int(offset[sdim]), int(shape[sdim])
        if expert is not None and expert(name):
            placement = "expert"
        if not local.is_contiguous():
            raise ValueError(f"{name}: the local shard is not contiguous")
        out.append(Param(name=name, shape=list(p.shape), data=local, placement=placement,
                         shard_dim=sdim, shard_offset=soff, shard_length=slen, source=p))
    return out


class Optimizer:
    """A runtime over `params`: init, register, commit (collective over `comm`)."""

    def __init__(self, params, comm=None, config: Optional[dict] = None):
        lib = library()
        self._lib = lib
        self._cfg = ctypes.create_string_buffer(1 << 16)
        _check("config_init", lib.shardopt_config_init(self._cfg, len(self._cfg)))
        for k, v in (config or {}).items():
            _check("config_set", lib.shardopt_config_set(self._cfg, k.encode(),
                                                         _config_text(v).encode()))
        self._comm_handle, self.comm = _comm_handle(comm)
        self._rt = ctypes.c_void_p()
        _check("init", lib.shardopt_init(self._comm_handle, self._cfg, ctypes.byref(self._rt)))
        self.params = [p if isinstance(p, Param) else Param(**p) for p in params]
        self._names = []
        self._ep = None
        self._grad_dtype = {}
        failed = None
        for p in self.params:
            try:
                self._register(p)
            except Exception as e:  # noqa: BLE001 - re-raised below, after the commit
                failed = e
                break
        if failed is not None and not isinstance(failed, Error):
            self._poison()
        try:
            # collective: a rank that failed above still commits, so that commit fails on every
            # rank (the library remembers failed registrations) instead of leaving the others
            # waiting in it until comm_timeout_s
            _check("commit", lib.shardopt_commit(self._rt))
        except Exception as e:
            self.close()
            raise (failed or e) from (e if failed is not None else None)
        if failed is not None:  # not reached: commit fails after a failed registration
            self.close()
            raise failed

    def _poison(self):
        """A registration the library refuses and remembers: this rank's commit, and so every
        rank's, then fails (after a Python-side error, which the library cannot see)."""
        d = _Desc(size=ctypes.sizeof(_Desc), version=1, name=b"(refused by the Python binding)",
                  ndim=0)
        h = ctypes.c_void_p()
        self._lib.shardopt_register(self._rt, ctypes.byref(d), ctypes.byref(h))

    def _register(self, p):
        if p.source is not None and p.placement == "expert":
            if self._ep is None:
                self._ep = self.stats()["ep_size"]
            if self._ep > 1:  # the same on every rank: the config's ep and the model agree
                raise ValueError(
                    f"{p.name}: torch_params does not map expert stacks under ep = {self._ep} "
                    "yet (a plain tensor's shape is the EP-local one, and a DTensor's offsets "
                    "do not follow the runtime's EP ranks): register a shardopt.Param with the "
                    "global [E, out, in] shape and this rank's expert range")
        if p.source is not None and p.placement == "expert" and p.shard_dim == 0:
            p.shard_offset %= p.shape[0] // self._ep  # global -> within this rank's EP stack
        if p.source is not None and p.grad is None:
            p.grad = self._torch_grad(p, required=False)
        data, dt, n = _buffer(p.data, f"{p.name}.data")
        grad, gdt, gn = _buffer(p.grad, f"{p.name}.grad")
        if p.placement != "expert":  # the library reads as many elements as the layout says
            want = 1
            for i, s in enumerate(p.shape):
                want *= p.shard_length if i == p.shard_dim and p.shard_length >= 0 else s
            if n != want or (p.grad is not None and gn != want):
                raise ValueError(f"{p.name}: data has {n} elements and grad {gn}, but shape "
                                 f"{list(p.shape)} sharded [{p.shard_offset}, +{p.shard_length}) "
                                 f"along dim {p.shard_dim} holds {want} here")
        name = p.name.encode()
        self._names.append(name)  # the library copies it; keep ours alive for the call anyway
        d = _Desc(size=ctypes.sizeof(_Desc), version=1, name=name, ndim=len(p.shape),
                  param_dtype=DTYPES[dt], grad_dtype=DTYPES[gdt or dt], transposed=int(p.transposed),
                  placement=PLACEMENTS[p.placement], shard_dim=p.shard_dim,
                  shard_offset=p.shard_offset, shard_length=p.shard_length, data=data, grad=grad,
                  algo=ALGOS[p.algo], lr_mult=p.lr_mult, wd_mult=p.wd_mult)
        for i, s in enumerate(p.shape):
            d.shape[i] = s
        h = ctypes.c_void_p()
        _check("register", self._lib.shardopt_register(self._rt, ctypes.byref(d), ctypes.byref(h)))
        p.handle = h
        self._grad_dtype[id(p)] = gdt or dt

    def _handle(self, p):
        if not self._rt or p.handle is None:
            raise ValueError(f"{p.name}: the optimizer was closed (or p is not one of its params)")
        return p.handle

    def _point(self, p):
        """Point the library at p.data and p.grad (None: no gradient)."""
        data, _, _ = _buffer(p.data, f"{p.name}.data")
        g, _, _ = _buffer(p.grad, f"{p.name}.grad")
        _check("param_set_pointers", self._lib.shardopt_param_set_pointers(self._handle(p), data,
                                                                         g))

    def algo(self, p):
        """The algorithm the runtime gave p: "muon" or "adamw"."""
        self._handle(p)
        a = ctypes.c_int()
        _check("param_get_algo", self._lib.shardopt_param_get_algo(p.handle, ctypes.byref(a)))
        return {1: "muon", 2: "adamw"}[a.value]

    def set_grad(self, p, grad):
        """Point p at a new gradient buffer (its data buffer stays): the same number of elements
        as the data, in the dtype it was registered with (the library cannot check either)."""
        self._handle(p)
        _, _, n = _buffer(p.data, f"{p.name}.data")
        _, gdt, gn = _buffer(grad, f"{p.name}.grad")
        if grad is not None and (gn != n or gdt != self._grad_dtype.get(id(p), gdt)):
            raise ValueError(f"{p.name}: new grad has {gn} {gdt} elements, the parameter was "
                             f"registered with {n} elements of grad dtype "
                             f"{self._grad_dtype.get(id(p))}")
        p.grad = grad
        self._point(p)

    @staticmethod
    def _torch_grad(p, required=True):
        g = p.source.grad
        if g is None:
            if required:
                raise ValueError(f"{p.name}: no gradient (.grad is None): every registered "
                                 "parameter needs one at each step")
            return None
        g = g.to_local() if hasattr(g, "to_local") else g
        return g.detach()

    def step(self, lr, adamw_lr=-1.0, weight_decay=-1.0, max_grad_norm=0.0, stream=None):
        """One optimizer step (collective). stream: a CUDA stream (torch.cuda.Stream or a
        raw handle) for the CUDA backend. Parameters from torch_params take their gradients
        from .grad now."""
        refused = []
        for p in self.params:
            if p.source is None:
                continue
            try:
                self._follow_data(p)
                g = self._torch_grad(p)
                if p.grad is None or g.data_ptr() != p.grad.data_ptr():
                    self.set_grad(p, g)
            except ValueError as e:
                # the step is collective: this rank goes on to it with no gradient for p, which
                # the library refuses on every rank, instead of leaving the others waiting
                refused.append(str(e))
                p.grad = None
                self._point(p)
        if stream is not None and hasattr(stream, "cuda_stream"):
            stream = stream.cuda_stream
        a = _StepArgs(size=ctypes.sizeof(_StepArgs), version=1, lr=lr, adamw_lr=adamw_lr,
                      weight_decay=weight_decay, stream=stream, max_grad_norm=max_grad_norm)
        status = self._lib.shardopt_step(self._rt, ctypes.byref(a))
        if refused:
            raise ValueError("; ".join(refused))
        _check("step", status)

    def _follow_data(self, p):
        """A torch parameter whose storage moved (param.data = ..., model.to(...)) is followed
        if it still has the registered size and dtype; otherwise the step is refused (updating
        the old storage would be a silent no-op for the model)."""
        local = p.source.to_local() if hasattr(p.source, "to_local") else p.source
        local = local.detach()
        if local.data_ptr() == p.data.data_ptr():
            return
        _, dt, n = _buffer(local, f"{p.name}.data")
        _, odt, on = _buffer(p.data, f"{p.name}.data")
        if n != on or dt != odt:
            raise ValueError(f"{p.name}: the parameter's storage changed to {n} {dt} elements; "
                             f"it was registered with {on} {odt}: make a new Optimizer")
        p.data = local
        self._point(p)

    def zero_grad(self, set_to_none=True):
        """Zero every registered gradient buffer in place; torch parameters' .grad is set to
        None instead (as torch.optim does) unless set_to_none is False."""
        for p in self.params:
            if p.source is not None and set_to_none:
                p.source.grad = None
                if p.grad is not None and p.handle is not None:  # let the old tensor go
                    p.grad = None
                    self._point(p)
            elif p.grad is not None:
                p.grad[...] = 0

    def save(self, directory):
        _check("save", self._lib.shardopt_save(self._rt, os.fsencode(directory)))

    def load(self, directory):
        _check("load", self._lib.shardopt_load(self._rt, os.fsencode(directory)))

    def stats(self):
        s = _Stats(size=ctypes.sizeof(_Stats), version=1)
        _check("get_stats", self._lib.shardopt_get_stats(self._rt, ctypes.byref(s)))
        out = {f: getattr(s, f) for f, _ in _Stats._fields_ if f not in ("size", "version")}
        out["kernels"] = s.kernels.decode()
        out["nonfinite_params"] = s.nonfinite_params.decode()
        return out

    def close(self):
        if self._rt:
            self._lib.shardopt_finalize(self._rt)
            self._rt = ctypes.c_void_p()
            for p in getattr(self, "params", []):  # freed with the runtime
                p.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
