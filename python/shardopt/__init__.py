"""shardopt for Python trainers: a ctypes binding of libshardopt (no compiled extension
needed: step()'s per-tensor comparison has an optional C twin, _fast.c, used where built).

    import shardopt
    opt = shardopt.Optimizer(params, comm=MPI.COMM_WORLD, config={"momentum": 0.95, "dp_shard": 2})
    opt.step(lr=0.02)

For torch.optim's interface (param groups, schedulers, state_dict), use shardopt.torch.Muon.
comm=None runs on MPI_COMM_SELF without mpi4py.

`params` is a list of shardopt.Param (or dicts with the same fields, or torch tensors / (name,
tensor) pairs through torch_params): the global shape, this
rank's shard (a numpy array, or a torch tensor on the CPU or a CUDA device, row-major and
contiguous) with its gradient, and where the shard sits (shard_dim, shard_offset). The library
updates the shard in place. Config keys are those of docs/config.md, set as text exactly as the
SHARDOPT_<KEY> env vars would be. Errors raise shardopt.Error carrying the C status and the
library's message. The library is found through SHARDOPT_LIBRARY (a value that names no loadable
libshardopt is an OSError), then next to a source checkout (build/libshardopt.so), then on the
loader path.

The library dereferences whatever pointers it is given, so the binding vouches for them: every
buffer is checked (writeable parameter data, C-contiguous, aligned, native float32 / bf16, host
memory under the CPU kernels, exactly the elements of the declared shard), held by the binding
while the library may touch it, and checked again at each step() (docs/python.md; for plain
torch tensors, compared with the last check: the same objects at the same addresses).

This module is one file, over 600 lines, on purpose: it is the whole ctypes binding, and the
structures that mirror include/shardopt.h, the buffer checks that vouch for every pointer and the
Optimizer that hands them to the library are read together when any of them changes."""
import ctypes
import ctypes.util
import functools
import numbers as _numbers
import operator
import os
import sys
import weakref
from dataclasses import dataclass, field
from time import perf_counter as _perf_counter
from typing import Any, Optional, Sequence

__all__ = ["Error", "SaveRefused", "Param", "Optimizer", "library", "torch_params"]

_STATUS = {0: "ok", -1: "invalid argument", -2: "invalid state", -3: "out of memory",
           -4: "mismatch between ranks", -5: "unsupported", -6: "I/O error", -7: "corrupt data",
           -8: "non-finite value", -9: "internal error", -10: "communication error",
           -11: "NCCL error", -12: "device error"}
DTYPES = {"fp32": 0, "bf16": 1}
PLACEMENTS = {"dense": 0, "expert": 1, "replicated": 2}
STATE_KINDS = {"momentum": 0, "exp_avg": 1, "exp_avg_sq": 2}  # shardopt_state_kind_t
_ERR_STATE = -2
ALGOS = {"auto": 0, "muon": 1, "adamw": 2}


class Error(RuntimeError):
    """A failed library call: .status (negative int), .message (shardopt_last_error())."""

    def __init__(self, call, status, message):
        super().__init__(f"shardopt_{call}: {_STATUS.get(status, status)} ({status}): {message}")
        self.status, self.message = status, message


class SaveRefused(Error):
    """save(dir) at the step dir's `latest` already names: a refusal (it would replace the
    current checkpoint), not an I/O failure; nothing was written. The library's status for it,
    SHARDOPT_ERR_STATE (-2), is kept in .status."""

    def __init__(self, status, message):
        RuntimeError.__init__(self, f"shardopt_save: refused, nothing written: {message}")
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


class _StepArgs(ctypes.Structure):  # shardopt_step_args_t, version 4
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32),
                ("lr", ctypes.c_double), ("adamw_lr", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("stream", ctypes.c_void_p),
                ("max_grad_norm", ctypes.c_double), ("skip_missing_grads", ctypes.c_int),
                ("momentum", ctypes.c_double), ("adamw_beta1", ctypes.c_double),
                ("adamw_beta2", ctypes.c_double), ("adamw_eps", ctypes.c_double)]


class _Stats(ctypes.Structure):  # shardopt_stats_t, version 5 (size says how much to fill)
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
                ("bytes_sent_expert", ctypes.c_uint64), ("bytes_recv_expert", ctypes.c_uint64),
                ("seconds_prepass_last", ctypes.c_double),
                ("seconds_exchange1_last", ctypes.c_double),
                ("seconds_exchange2_last", ctypes.c_double),
                ("ns_sharded_matrices", ctypes.c_int64),
                ("seconds_ns_sharded_last", ctypes.c_double),
                ("offload", ctypes.c_int), ("bytes_host_store", ctypes.c_uint64),
                ("bytes_h2d_momentum", ctypes.c_uint64), ("bytes_d2h_momentum", ctypes.c_uint64),
                ("bytes_h2d_adam_m", ctypes.c_uint64), ("bytes_d2h_adam_m", ctypes.c_uint64),
                ("bytes_h2d_adam_v", ctypes.c_uint64), ("bytes_d2h_adam_v", ctypes.c_uint64),
                ("bytes_h2d_ns", ctypes.c_uint64), ("bytes_d2h_ns", ctypes.c_uint64),
                ("staging_slot_bytes", ctypes.c_uint64),
                ("staging_peak_bytes_last", ctypes.c_uint64),
                ("seconds_copy_exposed_last", ctypes.c_double),
                ("seconds_copy_hidden_last", ctypes.c_double),
                ("ns_compute", ctypes.c_int), ("nonfinite_elements_last", ctypes.c_uint64),
                # version 2
                ("phases_current", ctypes.c_int),
                # version 3
                ("bytes_ns_allreduce_last", ctypes.c_uint64),
                # version 4: the last load's unmatched tensors and parameters
                ("load_kept_tensors", ctypes.c_int64), ("load_unused_params", ctypes.c_int64),
                # version 5: Gram results the result guard recomputed with standard
                ("ns_gram_fallbacks", ctypes.c_uint64)]


def _stats_dict(s):
    """The fields of a filled _Stats as a dict: those the library wrote. get_stats writes
    min(our size, its own) bytes and says how many in s.size, so a library built before a field
    was appended leaves it out of the dict (absent, not a stale zero); version 1 libraries
    wrote the struct up to nonfinite_elements_last."""
    out = {}
    for f, _ in _Stats._fields_:
        d = getattr(_Stats, f)
        if f not in ("size", "version") and d.offset + d.size <= s.size:
            out[f] = getattr(s, f)
    for f in ("kernels", "nonfinite_params"):
        if f in out:
            out[f] = out[f].decode()
    return out


_lib = None


def _lib_path():
    """(path, how it was found) of the library to load: SHARDOPT_LIBRARY when set (a path that
    names no file is an error, never a silent fallback to another copy), then the source
    checkout's build/libshardopt.so, then the loader path."""
    env = os.environ.get("SHARDOPT_LIBRARY")
    if env:
        origin = f"SHARDOPT_LIBRARY={env}"
        if os.sep in env:  # a bare file name is looked up on the loader path, as dlopen does
            if os.path.isdir(env):
                raise OSError(f"{origin}: is a directory: set SHARDOPT_LIBRARY to the path of "
                              "libshardopt.so (or unset it)")
            if not os.path.isfile(env):
                raise OSError(f"{origin}: no such file: set SHARDOPT_LIBRARY to the path of "
                              "libshardopt.so (or unset it)")
        return env, origin
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.join(here, "..", "..", "build", "libshardopt.so")
    if os.path.isfile(build):
        return build, f"{os.path.normpath(build)} (the source checkout's build)"
    found = ctypes.util.find_library("shardopt")
    if found:
        return found, f"{found} (from the loader path)"
    raise OSError("libshardopt not found: set SHARDOPT_LIBRARY to its path")


def library():
    """The loaded libshardopt (ctypes.CDLL), with its signatures declared."""
    global _lib
    if _lib is not None:
        return _lib
    path, origin = _lib_path()
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise OSError(f"{origin}: cannot be loaded as a shared library: {e}") from e
    P, S, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    sigs = {"shardopt_config_init": [P, S], "shardopt_config_set": [P, ctypes.c_char_p, ctypes.c_char_p],
            "shardopt_config_validate": [P], "shardopt_init": [P, P, ctypes.POINTER(P)],
            "shardopt_register": [P, ctypes.POINTER(_Desc), ctypes.POINTER(P)],
            "shardopt_param_set_pointers": [P, P, P],
            "shardopt_params_set_pointers": [P, I, P, P, P],
            "shardopt_param_get_algo": [P, ctypes.POINTER(I)], "shardopt_commit": [P],
            "shardopt_step": [P, ctypes.POINTER(_StepArgs)],
            "shardopt_get_stats": [P, ctypes.POINTER(_Stats)], "shardopt_save": [P, ctypes.c_char_p],
            "shardopt_load": [P, ctypes.c_char_p], "shardopt_finalize": [P],
            "shardopt_param_state_info": [P, I, ctypes.POINTER(I), ctypes.POINTER(ctypes.c_int64)],
            "shardopt_param_get_state": [P, I, P, S, I], "shardopt_param_set_state": [P, I, P, S, I],
            "shardopt_param_get_step": [P, ctypes.POINTER(ctypes.c_uint64)],
            "shardopt_param_set_step": [P, ctypes.c_uint64]}
    # a library that loads but is not libshardopt (libc, an old build) would fail at the first
    # call with an AttributeError naming neither the file nor how it was chosen
    missing = [n for n in list(sigs) + ["shardopt_last_error"] if not hasattr(lib, n)]
    if missing:
        raise OSError(f"{origin}: is not libshardopt: it has no {missing[0]}"
                      + (f" (nor {len(missing) - 1} other shardopt function(s))"
                         if len(missing) > 1 else ""))
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, I
    lib.shardopt_last_error.argtypes, lib.shardopt_last_error.restype = [], ctypes.c_char_p
    if hasattr(lib, "shardopt_register_refused"):  # absent from libraries before 0.1 of 2026-12
        lib.shardopt_register_refused.argtypes = [P, ctypes.c_char_p, ctypes.c_char_p]
        lib.shardopt_register_refused.restype = I
    _lib = lib
    global _lib_file
    _lib_file = path
    return lib


_lib_file = None  # the path library() loaded
_ext = False  # _fast_ext(): not looked for yet
_FAST_API = 5  # _fast.c's FAST_API: the layout of _Fast.rows it reads (2: the shapes list;
# 3: the gradients are not stored on the slots and Params, only in the rows' list; 4: is_neg;
# 5: the seen list, weak references to the gradients whose storage was measured)
_GONE = object()  # _Fast.grads after a step: the gradients let go (none is "the same" tensor)


def _fast_ext():
    """The module _shardopt_fast (python/shardopt/_fast.c: follow, the C twin of
    _follow_rows, and step, which also makes the shardopt_step call), built by CMake where it
    finds Python's headers and found like the library: next to the libshardopt loaded (build/,
    or an install's lib/), else in this package. None where it is absent, built for another
    Python or of another version: step() then runs _follow_rows and the ctypes call, with the
    same results (a module that is there but cannot be used is a warning)."""
    global _ext
    if _ext is not False:
        return _ext
    _ext = None
    library()
    import importlib.machinery
    import importlib.util
    dirs = [os.path.dirname(os.path.abspath(_lib_file))] if os.sep in _lib_file else []
    dirs.append(os.path.dirname(os.path.abspath(__file__)))
    for d in dirs:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(d, "_shardopt_fast" + suffix)
            if not os.path.isfile(path):
                continue
            try:
                spec = importlib.util.spec_from_file_location("_shardopt_fast", path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                if getattr(mod, "API", None) != _FAST_API:
                    raise ImportError(f"API {getattr(mod, 'API', None)}, this binding's is "
                                      f"{_FAST_API}")
            except Exception as e:  # noqa: BLE001 - optional: the Python path does the same
                import warnings
                warnings.warn(f"shardopt: {path} not used ({e}): step() runs its Python path")
                continue
            _ext = mod
            return _ext
    return _ext


def _check(call, status):
    if status != 0:
        raise Error(call, status, library().shardopt_last_error().decode(errors="replace"))


def _c_text(b, what):
    """b (bytes) as a C string: a NUL byte inside would cut it there without a word (a parameter
    named 'w\\0x' registered as 'w', save('ck\\0/x') wrote into ck), so it is refused, as
    Python's own os calls refuse it."""
    i = b.find(b"\0")
    if i >= 0:
        raise ValueError(f"{what}: holds a NUL byte at {i}: the C library would read it cut "
                         f"there, as {b[:i]!r}")
    return b


# the keys whose values are lists (docs/config.md): patterns "a,b" and coefficient triples
_LIST_KEYS = ("adamw_patterns", "ns_custom_coeffs")


def _config_text(v, key=None):
    """A config value as its SHARDOPT_<KEY> text: booleans true/false (which the library takes
    for its boolean keys only: True for ns_steps was read as 1), a list of patterns "a,b", a
    list of coefficient triples "a,b,c;d,e,f" (a list for any other key is refused: [0.5] for
    momentum was read as 0.5), a 0-d numpy or torch value as its Python number."""
    if getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        if key is not None and key not in _LIST_KEYS:
            raise ValueError(f"config {key} = {v!r}: a list is accepted for "
                            f"{' and '.join(_LIST_KEYS)} only; give {key} one value "
                            "(docs/config.md)")
        return ";".join(map(_config_text, v)) if any(isinstance(x, (list, tuple)) for x in v) \
            else ",".join(map(_config_text, v))
    return str(v)


def _step_number(name, v):
    """A step argument as a float, or ValueError naming the argument and the value (_number)."""
    if type(v) is float:  # the common case, at no cost beyond this test
        return v
    return _number(f"step: {name}", v)


def _number(what, v):
    """v as a float, or ValueError naming `what` and the value. ctypes took True as 1.0
    (step(max_grad_norm=True) clipped at 1, lr_mult=True) and refused a str, None or an int
    past a double with a TypeError / OverflowError that named nothing. A 0-d numpy or torch
    number is its value; Decimal and Fraction are numbers."""
    if type(v) is float:
        return v
    if getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool) or not (isinstance(v, _numbers.Real) or type(v).__name__ == "Decimal"):
        raise ValueError(f"{what} = {v!r} ({type(v).__name__}): accepted a real number "
                         "(a bool or text is not one)")
    try:
        return float(v)
    except (OverflowError, ValueError, TypeError):
        said = f"an integer of {len(str(abs(v)))} digits" if isinstance(v, int) else repr(v)
        raise ValueError(f"{what} = {said}: past the largest double") from None


def _step_flag(name, v):
    """skip_missing_grads as 0 or 1: bool("false") was True."""
    if getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise ValueError(f"step: {name} = {v!r} ({type(v).__name__}): accepted True or False")


_mpi_inited_here = False
_live = None  # weakref.WeakSet of the Optimizers whose runtime is open (closed before finalize)


def _mpi_finalize():
    """At exit, where the binding initialised MPI itself: close the runtimes still open (their
    finalize frees communicators), then MPI_Finalize, as mpi4py would."""
    for opt in list(_live or ()):
        try:
            opt.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    lib, done = library(), ctypes.c_int()
    lib.MPI_Finalized(ctypes.byref(done))
    if not done.value:
        lib.MPI_Finalize()


def _comm_self(lib):
    """MPI_COMM_SELF with no mpi4py: MPI is initialised through the libmpi the library links
    (MPI_Init_thread, finalized at exit) unless someone did already. Open MPI's MPI_COMM_SELF is
    the address of ompi_mpi_comm_self; MPICH's the constant 0x44000001."""
    global _mpi_inited_here
    for fn in ("MPI_Initialized", "MPI_Finalized", "MPI_Init_thread", "MPI_Finalize"):
        if not hasattr(lib, fn):
            raise OSError(f"libshardopt does not export {fn} from its MPI: pass comm= (an "
                          "mpi4py communicator) instead")
    ready, done = ctypes.c_int(), ctypes.c_int()
    lib.MPI_Initialized(ctypes.byref(ready))
    lib.MPI_Finalized(ctypes.byref(done))
    if done.value:
        raise RuntimeError("MPI was finalized: no runtime can be made any more")
    if not ready.value:
        provided = ctypes.c_int()
        lib.MPI_Init_thread.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int)]
        if lib.MPI_Init_thread(None, None, 3, ctypes.byref(provided)) != 0:  # MULTIPLE, as mpi4py
            raise RuntimeError("MPI_Init_thread failed")
        _mpi_inited_here = True
        import atexit
        atexit.register(_mpi_finalize)
    if hasattr(lib, "ompi_mpi_comm_self"):
        return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, "ompi_mpi_comm_self")))
    return ctypes.c_void_p(0x44000001)


def _comm_handle(comm):
    """The MPI_Comm of an mpi4py communicator; None: MPI_COMM_SELF, without needing mpi4py."""
    if comm is None:
        return _comm_self(library()), None
    from mpi4py import MPI
    if not isinstance(comm, MPI.Comm):
        # a torch.distributed ProcessGroup (dist.group.WORLD) or DeviceMesh, as scripts
        # written for torch.distributed hold: mpi4py's own error named neither the argument
        # nor what was given
        raise TypeError(f"comm = {type(comm).__module__}.{type(comm).__name__}: an mpi4py "
                        "communicator is accepted (MPI.COMM_WORLD, or one split from it in the "
                        "ranks' order), or None for this process alone; a torch.distributed "
                        "process group or DeviceMesh is not (docs/python.md)")
    return ctypes.c_void_p(MPI._handleof(comm)), comm


def _layout_refused(what, x):
    """Why a torch tensor of a layout other than strided is refused: a sparse gradient
    (nn.Embedding(sparse=True)) was told "must be strided and contiguous", which named neither
    the layout nor the way out."""
    out = f"{what}: a {x.layout} torch tensor; the library reads strided, contiguous memory"
    if x.is_sparse or "sparse" in str(x.layout):
        out += (" (a sparse gradient: nn.Embedding(..., sparse=True) or EmbeddingBag(sparse="
                "True), which torch.optim.AdamW refuses too; make it with sparse=False)")
    return out


def _lazy_refused(what, x):
    """None, or why a torch tensor whose values are not its memory's is refused: a lazily
    negated view (torch._neg_view, the negative bit) or a conjugate view reads as -m or conj(m)
    in torch, while the library reads and writes m itself: a gradient's sign was dropped and a
    parameter stepped the wrong way, silently."""
    if x.is_neg() or x.is_conj():
        how = "negated (is_neg(): torch._neg_view" if x.is_neg() else "conjugated (is_conj()"
        fix = "resolve_neg()" if x.is_neg() else "resolve_conj()"
        return (f"{what}: a lazily {how}): torch reads its memory with the sign flipped, the "
                f"library would read the memory as it is; pass x.{fix} (a tensor of its own)")
    return None


def _torch_addr(x, what):
    """x.data_ptr(), refused where its storage is shorter than the tensor, or where it is 0 for
    a tensor with elements: a ZeroTensor
    (torch._efficientzerotensor) or a storage resized to 0 (FSDP frees parameters' storage
    so) has no memory; passed on, 0 was NULL, a gradient the library took as missing, so the
    parameter was left out of the step silently where torch.optim steps it with zeros."""
    addr = x.data_ptr()
    if addr:
        # a storage resized smaller after the tensor was made (untyped_storage().resize_(8)):
        # torch refuses to read the tensor, but data_ptr() answers, and the library wrote the
        # tensor's whole extent past the storage's end: heap memory overwritten, a crash later
        need = (x.storage_offset() + x.numel()) * x.element_size()
        have = x.untyped_storage().nbytes()
        if have < need:
            raise ValueError(f"{what}: its storage holds {have} bytes, but the tensor spans "
                             f"{need} (storage_offset {x.storage_offset()} + {x.numel()} "
                             f"elements of {x.element_size()} bytes): a storage resized smaller "
                             "after the tensor was made (untyped_storage().resize_()); the "
                             "library would read and write past its end")
        return addr
    if not x.numel():
        return addr
    zero = getattr(x, "_is_zerotensor", None)
    if zero is not None and zero():
        how = "a ZeroTensor (torch._efficientzerotensor), which has no memory: pass " \
              "torch.zeros_like(x)"
    elif type(x).__name__ == "FakeTensor":
        how = "a FakeTensor (FakeTensorMode: shapes only, no memory): pass a real tensor"
    else:
        how = "its storage holds no memory (untyped_storage().resize_(0), as FSDP frees a " \
              "parameter's storage between uses): give it memory before the step"
    raise ValueError(f"{what}: data_ptr() is 0 for {x.numel()} elements: {how}")


_torch_tensor = None  # torch.Tensor, once torch is imported


def _is_torch(x):
    global _torch_tensor
    if _torch_tensor is None:
        torch = sys.modules.get("torch")  # a tensor exists only once torch was imported
        if torch is None or not hasattr(torch, "Tensor"):
            return False
        _torch_tensor = torch.Tensor
    return isinstance(x, _torch_tensor)


_torch_dtypes = None


def _is_ndarray(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _from_dlpack(x, what):
    """A DLPack producer (jax, cupy, a framework's tensor) as a torch tensor when torch is
    imported, else as a numpy array (host memory only). Refusals are ValueErrors."""
    try:
        dev = tuple(x.__dlpack_device__())
    except Exception:  # noqa: BLE001 - no device claim: let the importer decide
        dev = None
    torch = sys.modules.get("torch")
    try:
        if torch is not None:
            return torch.from_dlpack(x)
        if dev is not None and dev[0] != 1:  # kDLCPU = 1
            raise ValueError(f"{what}: DLPack device {dev} (not host memory): without torch "
                             "imported only host memory is taken through DLPack")
        import numpy as np
        return np.from_dlpack(x)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - an importer's refusal, as the binding's
        raise ValueError(f"{what}: {type(x).__name__} through DLPack: {e}") from None


def _torch_buffer(x, what, host):
    """_buffer for a torch tensor: the same checks, without the generic path's (step() makes
    this call for every gradient and parameter)."""
    global _torch_dtypes
    if _torch_dtypes is None:
        import torch
        _torch_dtypes = ({torch.float32: "fp32", torch.bfloat16: "bf16"}, torch.strided)
    dev = x.device.type
    if dev != "cpu":
        if host:
            raise ValueError(f"{what}: is {dev} memory, but this runtime updates parameters "
                             "on the host (backend = cpu, or offload = cpu): pass host memory, "
                             "or use backend = cuda")
        if dev != "cuda":
            raise ValueError(f"{what}: {type(x).__name__} on device {dev}: device memory is "
                             "taken from torch CUDA tensors only")
    if x.layout != _torch_dtypes[1]:
        raise ValueError(_layout_refused(what, x))
    if not x.is_contiguous():
        raise ValueError(f"{what}: the torch tensor must be strided and contiguous")
    if x.is_neg() or x.is_conj():
        raise ValueError(_lazy_refused(what, x))
    dt = _torch_dtypes[0].get(x.dtype)
    if dt is None:
        raise ValueError(f"{what}: dtype {x.dtype} is not float32 or bfloat16")
    return _torch_addr(x, what), dt, x.numel()


def _declared_grad_dtype(p):
    """The gradient dtype a torch parameter without a gradient yet declares (torch >= 2.10's
    Tensor.grad_dtype: bf16 weights with `p.grad_dtype = torch.float32` get fp32 gradients from
    autograd, which torch.optim.Muon steps), as the library's name; None where it declares none
    (the parameter's dtype then). Registered as the parameter's, those fp32 gradients were
    refused at every step ('registered with ... grad dtype bf16')."""
    src = p.source
    src = src.to_local() if hasattr(src, "to_local") and hasattr(src, "placements") else src
    want = getattr(src, "grad_dtype", None)
    if want is None or _torch_dtypes is None:
        return None
    dt = _torch_dtypes[0].get(want)
    if dt is None:
        raise ValueError(f"{p.name}: grad_dtype = {want} (the parameter's declared gradient "
                         "dtype): the library takes float32 or bfloat16 gradients")
    return dt


def _device(x):
    """Where x's memory is: "cpu", "cuda", another torch device type, or None (no claim).
    Anything exposing __cuda_array_interface__ or is_cuda = True is CUDA memory, whatever its
    type says: the CPU kernels would dereference it."""
    if _is_torch(x):
        return x.device.type
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return "cuda"
    except Exception:  # noqa: BLE001 - a property that raises still says "CUDA"
        return "cuda"
    if getattr(x, "is_cuda", False) is True:
        return "cuda"
    dev = getattr(x, "device", None)
    if dev is None:
        return None
    kind = dev if isinstance(dev, str) else getattr(dev, "type", None)
    return str(kind) if kind is not None else repr(dev)


def _buffer(x, what, writable=False, host=True):
    """(address, dtype name, element count) of memory the library may dereference: a numpy
    array (aligned, C-contiguous, native float32 or uint16/bfloat16, writeable where the library
    writes) or a strided, contiguous torch float32/bfloat16 tensor; with host, only host memory
    (the CPU kernels would dereference a device pointer). Anything else raises ValueError: the
    library cannot check what it is given, so an unfit buffer would crash or corrupt memory."""
    if x is None:
        return None, None, 0
    if _is_torch(x):
        return _torch_buffer(x, what, host)
    if hasattr(type(x), "__dlpack__") and not _is_ndarray(x):
        x = _from_dlpack(x, what)  # a view of the same memory; the caller holds the producer
        if _is_torch(x):
            return _torch_buffer(x, what, host)
    dev = _device(x)
    if dev not in (None, "cpu"):
        if host:
            raise ValueError(f"{what}: is {dev} memory, but this runtime updates parameters "
                             "on the host (backend = cpu, or offload = cpu): pass host memory, "
                             "or use backend = cuda")
        if not _is_torch(x) or dev != "cuda":
            raise ValueError(f"{what}: {type(x).__name__} on device {dev}: device memory is "
                             "taken from torch CUDA tensors only")
    if _is_torch(x):
        import torch
        if x.layout != torch.strided:
            raise ValueError(_layout_refused(what, x))
        if not x.is_contiguous():
            raise ValueError(f"{what}: the torch tensor must be strided and contiguous")
        if x.is_neg() or x.is_conj():
            raise ValueError(_lazy_refused(what, x))
        dt = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(x.dtype)
        if dt is None:
            raise ValueError(f"{what}: dtype {x.dtype} is not float32 or bfloat16")
        return _torch_addr(x, what), dt, x.numel()
    import numpy as np
    if not issubclass(type(x), np.ndarray):  # type(): __class__ can be made to say ndarray
        raise ValueError(f"{what}: {type(x).__name__} is not a numpy array or torch tensor")
    if type(x) is not np.ndarray:  # a subclass may override size, flags, ...: ask the base
        x = np.ndarray.view(x, np.ndarray)
    t = x.dtype
    if t == np.dtype(np.float32):
        dt = "fp32"
    elif t == np.dtype(np.uint16) or (t.name == "bfloat16" and t.itemsize == 2 and t.isnative):
        dt = "bf16"  # raw bf16 bits (numpy has no bfloat16 of its own)
    else:
        raise ValueError(f"{what}: dtype {t} ({t.str}) is not float32 or bf16 (uint16 bits) in "
                         "native byte order")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: the numpy array is not C-contiguous (strides {x.strides}): "
                         "pass np.ascontiguousarray(...) and keep that array")
    if not x.flags.aligned:
        raise ValueError(f"{what}: the numpy array is not aligned to its element size")
    if writable and not x.flags.writeable:
        raise ValueError(f"{what}: the numpy array is read-only (a mmap_mode='r' load, a "
                         "read-only view or flags.writeable = False): the library writes the "
                         "parameter in place")
    return x.ctypes.data, dt, x.size


def _kind(p, kind):
    """STATE_KINDS' number for kind, or ValueError naming the parameter and the kinds (a bare
    KeyError 'MOMENTUM' named neither)."""
    if isinstance(kind, str) and kind in STATE_KINDS:
        return STATE_KINDS[kind]
    raise ValueError(f"{getattr(p, 'name', p)}: state kind {kind!r}: accepted momentum (Muon), "
                     "exp_avg, exp_avg_sq (AdamW)")


def _is_bool(v):
    """Python's bool or numpy's (np.bool_, named np.bool since numpy 2)."""
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and
                                   type(v).__name__ in ("bool", "bool_"))


def _shape(p):
    """p.shape as a list of 1 to 3 ints (the library's ndim), refused before any call."""
    try:  # read once: a sequence may say something else each time it is read
        given = list(p.shape)
        shape = [operator.index(s) for s in given]
    except TypeError:
        raise ValueError(f"{p.name}: shape {p.shape!r} is not a sequence of ints") from None
    if any(isinstance(s, bool) for s in given):  # operator.index(True) is 1: [True, 64] ran
        raise ValueError(f"{p.name}: shape {given!r} holds a bool, not an int")
    if not shape:
        raise ValueError(f"{p.name}: a 0-D (scalar) parameter: shardopt takes 1-D to 3-D "
                         "tensors; register it with shape [1] and a 1-element view of the same "
                         "memory (data.reshape(1))")
    if len(shape) > 3:
        raise ValueError(f"{p.name}: shape {shape} has {len(shape)} dims: 1 to 3 are accepted "
                         "(register per-layer stacks)")
    # ctypes wraps integers that do not fit the C field silently: the library would see
    # another layout than the one the buffers were checked against
    for what, v, bits in [(f"shape[{i}]", s, 64) for i, s in enumerate(shape)] + [
            ("shard_dim", p.shard_dim, 32), ("shard_offset", p.shard_offset, 64),
            ("shard_length", p.shard_length, 64)]:
        if _is_bool(v):  # operator.index(True) is 1: shard_offset = True was offset 1
            raise ValueError(f"{p.name}: {what} = {v!r} is a bool, not an int")
        try:
            v = operator.index(v)
        except TypeError:
            raise ValueError(f"{p.name}: {what} = {v!r} is not an int") from None
        if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
            raise ValueError(f"{p.name}: {what} = {v} does not fit the C field (int{bits})")
    # the names and flags as the library's fields take them: a bare KeyError 'EXPERT', int('no')
    # and ctypes' TypeError named neither the parameter nor what is accepted; lr_mult = True
    # was taken as 1
    for what, v, names in (("placement", p.placement, PLACEMENTS), ("algo", p.algo, ALGOS)):
        if not isinstance(v, str) or v not in names:
            raise ValueError(f"{p.name}: {what} = {v!r}: accepted {', '.join(names)}")
    t = p.transposed
    if not (isinstance(t, int) or _is_bool(t)) or t not in (0, 1):
        raise ValueError(f"{p.name}: transposed = {t!r}: accepted True or False")
    _number(f"{p.name}: lr_mult", p.lr_mult)
    _number(f"{p.name}: wd_mult", p.wd_mult)
    return shape


def _shard_count(shape, placement, shard_dim, shard_offset, shard_length, ep):
    """Elements of this rank's shard as the library lays it out (sharding/layout.c layout_init,
    the window of runtime/register.c shard_window): an expert stack's dim 0 is this EP rank's
    E / ep experts. None where the library refuses the layout itself."""
    ndim = len(shape)
    big = 1 << 62  # beyond int64 ctypes would wrap the value the library sees
    if any(not 1 <= s < big for s in shape) or not 0 <= shard_dim < ndim or \
            not -big < shard_offset < big or not -big < shard_length < big:
        return None
    win = shape[0]
    if placement == "expert":
        if ndim != 3 or ep < 1 or shape[0] % ep:
            return None
        win = shape[0] // ep
    extent = win if shard_dim == 0 else shape[shard_dim]
    length = extent - shard_offset if shard_length < 0 else shard_length
    if shard_offset < 0 or shard_offset > extent or length < 0 or length > extent - shard_offset:
        return None
    dims = [win] + list(shape[1:])
    dims[shard_dim] = length
    n = 1
    for s in dims:
        n *= s
    return n


class _Slot:
    """What the library holds for one parameter: its handle, the registered element count and
    dtypes, and the objects whose memory it points at, referenced here (not only through
    Param.data / .grad, which the trainer may reassign) until the pointers change or the
    runtime is finalized."""
    __slots__ = ("param", "handle", "count", "dtype", "grad_dtype", "data", "grad", "data_addr",
                 "grad_addr", "shape")

    def __init__(self, param, handle, count, dtype, grad_dtype, data, grad, data_addr,
                 grad_addr, shape=None):
        self.param = param  # held: its id() keys the slot and must not be reused by another
        self.handle, self.count, self.dtype, self.grad_dtype = handle, count, dtype, grad_dtype
        self.data, self.grad, self.data_addr, self.grad_addr = data, grad, data_addr, grad_addr
        # a torch parameter's local shape at registration (torch.Size; None for numpy Params,
        # whose buffers are read flat): the library steps the memory as the registered layout,
        # so a tensor reshaped since (param.data = param.data.view(...)) would be stepped as
        # another matrix
        self.shape = shape


class _Fast:
    """An Optimizer's torch parameters as the library points at them, for step() to compare
    (Optimizer._follow). `rows` is the tuple _follow_rows (or its C twin) reads: torch.Tensor
    and its methods data_ptr, numel, is_contiguous and is_neg, host (CPU kernels: host memory only),
    shardopt_params_set_pointers, then per parameter (lists) its Param, _Slot, tensor, .grad
    object (None included; _GONE once the step has let it go), the gradient's address as the
    library has it (None: NULL), the data address, element count, torch grad dtype and local
    shape (torch.Size), a weak reference to the gradient whose storage was last measured whole
    (None: none), and last the C arrays that call takes (handles, data addresses,
    gradient addresses refilled per call). With the C module the function and the arrays are
    passed by address. The lists are shared with this object's fields and changed in place
    (_follow_rows, zero_grad, Optimizer.step). step: the C module's step over these rows and
    this runtime (None without the module); gone: [_GONE] * n, what grads becomes after a
    step."""
    __slots__ = ("params", "slots", "srcs", "grads", "gaddrs", "handles", "darr", "garr",
                 "rows", "step", "gone")


_ESIZE = {}  # dtype -> its element size: a new gradient's storage measure asks it once a dtype


def _esize(g, dt):
    """g.element_size() (g of dtype dt), kept in _ESIZE for dt."""
    e = _ESIZE[dt] = g.element_size()
    return e


def _follow_rows(rows, rt, skip_missing):
    """None, or the status of pointing the library at the parameters' gradients as they are
    now: None (the caller checks every buffer again, _sync) unless each parameter's tensor is
    still at the address the library has, with the registered shape, contiguous and not a
    lazily negated view (a tensor changed in place, t_(), param.data = param.data.t() or
    torch._neg_view(param.data), is not; _lazy_refused), and its .grad is
    either None (with skip_missing), or the very tensor object the library was pointed at
    (held in the rows, so no other object can take its id: only from a comparison to the step
    that follows it, which lets them go) unchanged so (not negated since), or a new plain tensor
    that passes the checks a torch gradient needs here (strided and contiguous, the registered
    dtype, the parameter's shape, a device the runtime takes, not negated). A tensor that refuses to say (a
    sparse layout raises RuntimeError) is None too: the full check names it. The library is
    pointed at the runtime's gradients in one shardopt_params_set_pointers call where any
    changed. _shardopt_fast.follow (python/shardopt/_fast.c) is this function in C: the same
    checks in the same order, on the same lists."""
    tensor, data_ptr, numel, contiguous, is_neg, host, set_pointers, params, slots, srcs, \
        grads, gaddrs, daddrs, counts, dtypes, shapes, seen, handles, darr, garr = rows
    got, addrs = [], []
    try:
        for src, was, ga, da, n, dt, shp, w in zip(srcs, grads, gaddrs, daddrs, counts, dtypes,
                                                   shapes, seen):
            if data_ptr(src) != da or src.shape != shp or not contiguous(src) or is_neg(src):
                return None
            g = src.grad
            if g is None:
                if not skip_missing:
                    return None
                a = None
            elif g is was:
                if data_ptr(g) != ga or numel(g) != n or not contiguous(g) or is_neg(g):
                    return None
                a = ga
            elif (type(g) is not tensor or not contiguous(g) or g.dtype != dt
                  or g.shape != shp or not (g.is_cpu or not host and g.is_cuda) or is_neg(g)):
                return None
            else:
                a = data_ptr(g)
                if not a:  # no memory (a ZeroTensor): the full check names it
                    return None
                # its storage holding it whole (not resized smaller after the tensor was made:
                # the full check names that), measured once per tensor object: the one measured
                # before at the same address is whole still (a resize moves the memory)
                if (a != ga or w is None or w() is not g) and g.untyped_storage().nbytes() < \
                        (n + g.storage_offset()) * (_ESIZE.get(dt) or _esize(g, dt)):
                    return None
            got.append(g)
            addrs.append(a)
    except RuntimeError:
        return None
    if addrs != gaddrs:
        garr[:] = addrs
        status = set_pointers(rt, len(addrs), handles, darr, garr)
        if status:
            return status
    for i, g in enumerate(got):
        if g is not grads[i]:
            grads[i] = g  # held through the step only: Optimizer.step lets them go after it
            slots[i].grad_addr = gaddrs[i] = addrs[i]
            if g is not None and (seen[i] is None or seen[i]() is not g):
                seen[i] = weakref.ref(g)
    return 0


def _peer_clash(opt, peers):
    """None, or (Param, message) for the first of opt's parameters whose data overlaps a span
    of peers ((lo, hi, name): another runtime's parameters in this process). Two runtimes
    update such memory once each per step, silently (each one's step compares only its own
    buffers); on the full check only, where a data address may have moved."""
    spans = [(lo, hi, name, None) for lo, hi, name in peers]
    for p in opt.params:
        s = opt._slots.get(id(p))
        if s is not None and s.count and s.data_addr:
            lo = s.data_addr
            spans.append((lo, lo + s.count * (2 if s.dtype == "bf16" else 4), p.name, p))
    spans.sort(key=lambda x: x[0])
    far = None  # the span reaching furthest so far
    for x in spans:
        if far is not None and x[0] < far[1] and (x[3] is None) != (far[3] is None):
            mine, peer = (x, far) if x[3] is not None else (far, x)
            return mine[3], (f"{mine[2]}.data [{mine[0]:#x}, +{mine[1] - mine[0]} bytes) and "
                             f"{peer[2]}.data [{peer[0]:#x}, +{peer[1] - peer[0]} bytes) share "
                             "memory, and another runtime (another param group) steps "
                             f"{peer[2]}: that memory would be updated twice per step; tie "
                             "them as one Parameter, or give each its own memory")
        if far is None or x[1] > far[1]:
            far = x
    return None


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


def _memory_order(t):
    """The permutation of t's dims that lists them as its memory holds them (outermost first),
    where that order is dense and is one the library steps as t: a convolution kernel with dim
    0 outermost (channels_last: [out, kh, kw, in]), or a transposed matrix ((1, 0): stored [in,
    out], registered with `transposed`); else None. Muon steps such a kernel as the matrix [out,
    kh kw in], whose columns are those of [out, in kh kw] permuted: Newton-Schulz commutes with
    a permutation of columns, so the update is the same, in the memory's order."""
    perm = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    if (perm[0] == 0 and t.dim() > 3) or perm == (1, 0):
        return perm if t.permute(perm).is_contiguous() else None
    return None


def _in_order(grad, perm):
    """A gradient of a parameter registered in the memory order perm (_memory_order), in that
    order: a view where the gradient has the parameter's layout (as autograd makes it), else a
    copy (a gradient assigned by hand in another layout), which the binding holds through the
    step."""
    if perm is None:
        return grad
    g = grad.permute(perm)
    return g if g.is_contiguous() else g.contiguous()


def _dense_grad(grad, local):
    """False for a gradient torch.optim takes but the library cannot read in place: a strided
    tensor of the parameter's shape whose memory is not in the parameter's order (grad.t() of
    a [in, out] product, an expand(), a slice). Anything else is True here and left to
    _check_buffers, which names what it refuses."""
    torch = sys.modules["torch"]
    return (grad.layout != torch.strided or grad.shape != local.shape
            or grad.is_contiguous())


def _named(params):
    """(name, tensor) pairs from model.named_parameters(), model.parameters() (named param.<i>
    in order) or a mix."""
    out = []
    for i, x in enumerate(params):
        if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], str):
            out.append((x[0], x[1]))
        elif _is_torch(x):
            out.append((f"param.{i}", x))
        else:
            raise TypeError(f"parameter {i}: {type(x).__name__} is neither a torch tensor nor a "
                            "(name, tensor) pair")
    return out


def _dedup(named, warn=True):
    """named without the repeats of a tensor object already listed (a tied weight under
    named_parameters(remove_duplicate=False)): registered twice, it would be updated twice per
    step with its one gradient. Each repeat is a warning naming both names. Distinct tensor
    objects over the same memory (tied through .data) are two parameters, as torch.optim steps
    them: each with its own gradient, one after the other."""
    seen, out = {}, []
    for name, p in named:
        key = id(p)
        if key in seen:
            if warn:
                import warnings
                warnings.warn(f"shardopt: {name} is the same tensor as {seen[key]} (a tied "
                              f"weight listed twice): registered once, as {seen[key]}",
                              stacklevel=3)
            continue
        seen[key] = name
        out.append((name, p))
    return out


def torch_params(named_parameters, expert=None, ep=None, matrices=()):
    """shardopt.Params from (name, torch parameter) pairs, as model.named_parameters() gives
    (model.parameters() works too: its tensors are named param.<i>). A tensor object listed
    twice (a tied weight under remove_duplicate=False) is registered once, with a warning.

    A DTensor (FSDP2's fully_shard, or any DeviceMesh sharding) registers its local shard
    (to_local(), which shares the parameter's storage) with shard_dim and shard_offset read from
    its placements: one Shard(d) mesh dim at most, the others Replicate (HSDP). A plain tensor is
    whole on every rank (placement "replicated", as with DDP). `expert(name)` says which are
    [E, out, in] expert stacks; their shard_offset along dim 0 is taken within this rank's EP
    stack. Under expert parallelism (torchtitan's convention): a DTensor whose mesh has a dim
    named "ep" sharding dim 0 is an expert stack (expert() or not), holding the experts of its
    "ep" coordinate, optionally sharded further along another dim by one other mesh dim; a plain
    tensor that expert() names, with `ep` given (> 1), is this rank's [E / ep, out, in] share of
    a [E, out, in] stack. The Optimizer checks that the experts a rank holds are those of its
    runtime EP rank. A plain tensor of more than 3 dims (a convolution kernel) is registered
    as one [out, in * kh * kw ...] matrix, a 0-D one (a scalar) as shape [1]; so is a 3-D tensor
    whose id() is in `matrices` (a Conv1d kernel [out, in, k]: shardopt.torch.Muon finds them
    through model=), where any other 3-D tensor is a stack of [out, in] matrices (each its own
    Muon matrix). Gradients are read from each parameter's .grad at
    every step() (FSDP2 makes new ones each backward), so none is needed here."""
    import torch
    out = []
    for name, p in _dedup(_named(named_parameters)):
        if not p.requires_grad:  # frozen: no gradient ever comes (torch.optim skips them too)
            continue
        local, placement, sdim, soff, slen = p.detach(), "replicated", 0, 0, -1
        shape_g, ep_first = list(p.shape), None
        dims = getattr(getattr(p, "device_mesh", None), "mesh_dim_names", None) or ()
        if hasattr(p, "placements") and "ep" in dims and \
                p.placements[dims.index("ep")].is_shard(0):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            e = dims.index("ep")
            others = [pl for i, pl in enumerate(p.placements) if i != e and not pl.is_replicate()]
            if len(p.shape) != 3 or len(others) > 1 or \
                    any(not pl.is_shard() or pl.dim == 0 for pl in others):
                raise ValueError(f"{name}: an expert stack on the 'ep' mesh dim with placements "
                                 f"{p.placements}: accepted a 3-D [E, out, in] stack, Shard(0) on "
                                 "'ep' and at most one other Shard(1 or 2), the rest Replicate")
            local = p.to_local().detach()
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                  p.placements)
            placement, ep_first = "expert", (int(offset[0]), p.device_mesh.size(e))
            sdim = others[0].dim if others else 0
            soff, slen = int(offset[sdim]), int(shape[sdim])
        elif hasattr(p, "placements") and hasattr(p, "to_local"):
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
        elif expert is not None and expert(name) and ep is not None and ep > 1:
            if len(p.shape) != 3:
                raise ValueError(f"{name}: an expert stack is [E / ep, out, in]; shape {shape_g}")
            shape_g = [p.shape[0] * ep] + list(p.shape[1:])  # this rank's share of E experts
        elif (len(p.shape) > 3 or (len(p.shape) == 3 and id(p) in matrices)) and \
                not hasattr(p, "placements"):
            # a convolution kernel [out, in, kh, kw, ...]: one matrix [out, in kh kw ...], as
            # Muon treats convolutions (the same memory, row-major: a view, nothing copied)
            shape_g = [p.shape[0], p.numel() // max(p.shape[0], 1)]
        elif len(p.shape) == 0 and not hasattr(p, "placements"):
            shape_g = [1]  # a scalar (CLIP's logit_scale): one element, as AdamW steps it
        if expert is not None and expert(name):
            placement = "expert"
        perm = None
        if not local.is_contiguous() and len(p.shape) != 3 and placement != "expert" \
                and not hasattr(p, "placements"):
            # channels_last kernels, transposed matrices: registered in their memory's order
            perm = _memory_order(local)
            local = local.permute(perm) if perm is not None else local
            if perm == (1, 0):
                shape_g = shape_g[::-1]  # stored [in, out]: transposed (docs/api.md)
        if not local.is_contiguous():
            # a view of part of another tensor (nn.Parameter(w[:, :k]), a strided slice):
            # its elements are not one dense block in any order, which the library steps;
            # torch.optim steps any view. Said so, and what to do, where it said only this
            raise ValueError(f"{name}: the local shard is not contiguous (shape "
                             f"{list(local.shape)}, strides {list(local.stride())}: a view of "
                             "part of another tensor?): the library steps each parameter as "
                             "one dense block of memory; make it one before the optimizer is "
                             "made (p.data = p.data.contiguous(), or a Parameter of its own)")
        q = Param(name=name, shape=shape_g, data=local, placement=placement, shard_dim=sdim,
                  shard_offset=soff, shard_length=slen, source=p, transposed=perm == (1, 0))
        q._ep_first = ep_first  # (first expert held, the mesh's ep size) of an 'ep' DTensor
        q._perm = perm  # the dims in memory order (channels_last), None where contiguous
        out.append(q)
    return out


class Optimizer:
    """A runtime over `params`: init, register, commit (collective over `comm`).

    The binding owns a reference to every buffer the library points at (_Slot), so reassigning
    Param.data / .grad never frees memory the library may still touch; each step() checks every
    parameter's current buffers again (or, for plain torch tensors, compares them with the last
    check: _follow), follows new ones of the registered size and dtype and refuses the rest
    (ValueError on that rank, a failed step on every rank)."""

    # None, or a callable giving [(lo, hi, name)]: the data spans of parameters another runtime
    # steps in the same process (shardopt.torch.Muon's other param groups), which this one's
    # full check refuses to overlap (_peer_clash): the library compares one runtime's buffers
    _peers = None

    def __init__(self, params, comm=None, config: Optional[dict] = None):
        lib = library()
        self._lib = lib
        self._slots = {}  # id(Param) -> _Slot, for the Params in self.params
        self._cfg = ctypes.create_string_buffer(1 << 16)
        _check("config_init", lib.shardopt_config_init(self._cfg, len(self._cfg)))
        refused = None
        try:
            if config is not None and not hasattr(config, "items"):  # a list's .items raised
                raise ValueError(f"config = {config!r}: accepted a dict of key: value "
                                 f"(docs/config.md), not a {type(config).__name__}")
            for k, v in (config or {}).items():
                if not isinstance(k, str):  # bytes or an int: "has no attribute 'encode'"
                    raise ValueError(f"config key {k!r} ({type(k).__name__}): accepted a str "
                                     "naming a key of docs/config.md")
                key = _c_text(k.encode(), f"config key {k!r}")
                text = _c_text(_config_text(v, k).encode(), f"config {k} = {v!r}")
                _check("config_set", lib.shardopt_config_set(self._cfg, key, text))
        except Exception as e:  # noqa: BLE001 - raised below, after the collective init
            refused = e
        self._comm_handle, self.comm = _comm_handle(comm)
        self._rt = ctypes.c_void_p()
        # init is collective: a rank whose config was refused here still makes it, with a NULL
        # cfg, which init refuses on every rank (the others name this rank), instead of raising
        # first and leaving them in init until comm_timeout_s
        status = lib.shardopt_init(self._comm_handle, None if refused else self._cfg,
                                   ctypes.byref(self._rt))
        if refused is not None:
            raise refused
        _check("init", status)
        global _live
        if _live is None:
            import weakref
            _live = weakref.WeakSet()
        _live.add(self)
        self.params = []
        self._names = []
        self._cuda = False  # a CUDA torch tensor registered: step() defaults to its stream
        self.seconds_call_last = 0.0  # wall time of the last shardopt_step call
        self._fast = None  # what step() compares instead of checking again (_fast_rows)
        self._ext = _fast_ext()  # _follow_rows and the step call in C, or None
        self._args = _StepArgs(size=ctypes.sizeof(_StepArgs), version=4)
        self._args_ref, self._step_fn = ctypes.byref(self._args), lib.shardopt_step
        self._c_args = ctypes.addressof(self._args)  # the same struct and call, for _fast.c
        self._c_step = ctypes.cast(lib.shardopt_step, ctypes.c_void_p).value
        failed, p = None, None
        try:
            st = self.stats()
            self._ep, self._ep_rank = st["ep_size"], st["ep_rank"]
            self._host = st["kernels"].startswith("cpu")  # CPU kernels: host memory only
            params = list(params)
            if any(_is_torch(x) or (isinstance(x, (tuple, list)) and len(x) == 2
                                    and _is_torch(x[1])) for x in params):
                params = torch_params(params)  # model.parameters() / named_parameters()
            for p in params:
                if not isinstance(p, (Param, dict)):
                    raise TypeError(f"{type(p).__name__}: a parameter is a shardopt.Param, a "
                                    "dict of its fields, a torch tensor or a (name, tensor) pair")
                p = p if isinstance(p, Param) else Param(**p)
                self.params.append(p)
                self._register(p)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the commit
            failed = e
        if failed is not None and not isinstance(failed, Error):
            self._poison(p, failed)
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

    def _poison(self, p=None, why=None):
        """A registration the library refuses and remembers: this rank's commit, and so every
        rank's, then fails (after a Python-side error, which the library cannot see). The
        library logs and reports the binding's reason (a descriptor of ndim 0 made it blame
        "ndim = 0")."""
        refuse = getattr(self._lib, "shardopt_register_refused", None)
        if refuse is not None:
            name = (p.get("name") if isinstance(p, dict) else getattr(p, "name", None)) or "?"
            refuse(self._rt, str(name).encode("utf-8", "replace"),
                   f"{type(why).__name__}: {why}".encode("utf-8", "replace"))
            return
        d = _Desc(size=ctypes.sizeof(_Desc), version=1, name=b"(refused by the Python binding)",
                  ndim=0)
        h = ctypes.c_void_p()
        self._lib.shardopt_register(self._rt, ctypes.byref(d), ctypes.byref(h))

    def _register(self, p):
        shape = _shape(p)
        first = getattr(p, "_ep_first", None)
        if p.source is not None and p.placement == "expert" and first is not None:
            win = shape[0] // self._ep if shape[0] % self._ep == 0 else None
            if first[1] != self._ep or win is None or first[0] // win != self._ep_rank:
                # the runtime's EP rank is the dense rank % ep (docs/api.md): with 'ep' the
                # innermost mesh dim and comm in the mesh's rank order the two agree
                raise ValueError(
                    f"{p.name}: this rank holds experts from {first[0]} of {shape[0]} on an 'ep' "
                    f"mesh dim of size {first[1]}, but the runtime (ep = {self._ep}) gives it "
                    f"EP rank {self._ep_rank}, experts [{self._ep_rank * (win or 0)}, "
                    f"{(self._ep_rank + 1) * (win or 0)}): set config ep to the mesh's, make "
                    "'ep' the innermost mesh dim and pass comm in the mesh's rank order")
        if p.source is not None and p.placement == "expert" and p.shard_dim == 0:
            p.shard_offset %= p.shape[0] // self._ep  # global -> within this rank's EP stack
        if p.source is not None and p.grad is None:
            p.grad = self._torch_grad(p, required=False)
        if p.data is None:
            raise ValueError(f"{p.name}.data is None: every parameter needs its shard (an empty "
                             "array where this rank's shard is empty)")
        data, dt, n = _buffer(p.data, f"{p.name}.data", writable=True, host=self._host)
        grad, gdt, gn = _buffer(p.grad, f"{p.name}.grad", host=self._host)
        if gdt is None and p.source is not None:
            gdt = _declared_grad_dtype(p)
        # the library reads and writes as many elements as the layout says, whatever the buffer
        # holds: a buffer of any other size is refused (dense, replicated and expert alike)
        want = _shard_count(shape, p.placement, p.shard_dim, p.shard_offset, p.shard_length,
                            self._ep)
        if want is not None and (n != want or (p.grad is not None and gn != want)):
            where = (f", within this EP rank's {shape[0] // self._ep} of {shape[0]} experts "
                     f"(ep = {self._ep})," if p.placement == "expert" else "")
            end = p.shard_offset + p.shard_length if p.shard_length >= 0 else "end"
            raise ValueError(f"{p.name}: data has {n} elements and grad {gn}, but shape "
                             f"{shape} ({p.placement}) sharded [{p.shard_offset}, {end}) along "
                             f"dim {p.shard_dim}{where} holds {want} here")
        if want is None:  # a layout the library refuses: hand it no pointer at all
            data = grad = None
        if not isinstance(p.name, str):  # bytes had no .encode: an AttributeError
            raise ValueError(f"parameter name {p.name!r} is a {type(p.name).__name__}, not a str")
        try:  # str's own encode: a subclass's could hand the library another name than p.name
            raw = str.encode(p.name, "utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"parameter name {p.name!r} is not UTF-8 text ({e.reason} at "
                             f"{e.start})") from None
        name = _c_text(raw, f"parameter name {p.name!r}")
        self._names.append(name)  # the library copies it; keep ours alive for the call anyway
        d = _Desc(size=ctypes.sizeof(_Desc), version=1, name=name, ndim=len(shape),
                  param_dtype=DTYPES[dt], grad_dtype=DTYPES[gdt or dt], transposed=int(p.transposed),
                  placement=PLACEMENTS[p.placement], shard_dim=p.shard_dim,
                  shard_offset=p.shard_offset, shard_length=p.shard_length, data=data, grad=grad,
                  algo=ALGOS[p.algo], lr_mult=p.lr_mult, wd_mult=p.wd_mult)
        for i, s in enumerate(shape):
            d.shape[i] = s
        h = ctypes.c_void_p()
        _check("register", self._lib.shardopt_register(self._rt, ctypes.byref(d), ctypes.byref(h)))
        if want is None:  # the library took a layout the binding cannot size: refuse it anyway
            raise ValueError(f"{p.name}: shape {shape} sharded [{p.shard_offset}, "
                             f"+{p.shard_length}) along dim {p.shard_dim}: the binding cannot "
                             "size this shard")
        p.handle = h
        self._cuda = self._cuda or (_is_torch(p.data) and p.data.is_cuda)
        self._slots[id(p)] = _Slot(p, h, n, dt, gdt or dt, p.data, p.grad, data, grad,
                                   p.data.shape if p.source is not None else None)

    def _slot(self, p):
        # not p.handle: a Param registered with two optimizers holds the later one's handle
        slot = self._slots.get(id(p)) if self._rt else None
        if slot is None:
            if not isinstance(p, Param):  # a name given for the Param: AttributeError on .name
                raise ValueError(f"{p!r} is a {type(p).__name__}: pass the shardopt.Param "
                                 "(one of this optimizer's params)")
            raise ValueError(f"{p.name}: the optimizer was closed (or p is not one of its params)")
        return slot

    def _check_buffers(self, p, data, grad):
        """(data address, grad address) of data and grad for p's registered shard, or
        ValueError: the library may dereference only memory of the registered size and dtype."""
        slot = self._slot(p)
        a, dt, n = _buffer(data, f"{p.name}.data", writable=True, host=self._host)
        if data is None or n != slot.count or dt != slot.dtype:
            raise ValueError(f"{p.name}.data is now {'None' if data is None else f'{n} {dt}'} "
                             f"elements; it was registered with {slot.count} {slot.dtype}: "
                             "assign a buffer of that size and dtype, or make a new Optimizer")
        g, gdt, gn = _buffer(grad, f"{p.name}.grad", host=self._host)
        if grad is not None and (gn != slot.count or gdt != slot.grad_dtype):
            # a torch parameter's grad_dtype set after the optimizer was made: the runtime
            # holds the gradient dtype it was registered with (_declared_grad_dtype)
            hint = ("" if p.source is None or gn != slot.count else
                    " (its grad_dtype set after the optimizer was made, or None? set "
                    "p.grad_dtype to the gradients' dtype before making it)")
            raise ValueError(f"{p.name}.grad has {gn} {gdt} elements; the parameter was "
                             f"registered with {slot.count} elements of grad dtype "
                             f"{slot.grad_dtype}{hint}")
        return a, g

    def _point(self, p, data, grad, addrs):
        """Point the library at data and grad (checked: addrs), holding both until the next
        change or close."""
        slot = self._slot(p)
        a, g = addrs
        if (a, g) != (slot.data_addr, slot.grad_addr):
            self._fast = None
            _check("param_set_pointers", self._lib.shardopt_param_set_pointers(slot.handle, a, g))
        slot.data, slot.grad, slot.data_addr, slot.grad_addr = data, grad, a, g

    def algo(self, p):
        """The algorithm the runtime gave p: "muon" or "adamw"."""
        slot = self._slot(p)
        a = ctypes.c_int()
        _check("param_get_algo", self._lib.shardopt_param_get_algo(slot.handle, ctypes.byref(a)))
        return {1: "muon", 2: "adamw"}[a.value]

    def set_grad(self, p, grad):
        """Point p at a new gradient buffer (its data buffer stays): the same number of elements
        as the data, in the dtype it was registered with (the library cannot check either)."""
        slot = self._slot(p)
        addrs = self._check_buffers(p, slot.data, grad)
        p.grad = grad
        self._point(p, slot.data, grad, addrs)

    @staticmethod
    def _torch_grad(p, required=True):
        g = p.source.grad
        if g is None:
            if required:
                raise ValueError(f"{p.name}: no gradient (.grad is None): every registered "
                                 "parameter needs one at each step")
            return None
        g = g.to_local() if hasattr(g, "to_local") else g
        return _in_order(g.detach(), getattr(p, "_perm", None))

    def _sync(self, p, skip_missing=False):
        """Check p's current buffers and point the library at them. A torch parameter's are its
        local storage (followed when it moved: param.data = ..., model.to(...)) and its .grad
        now; a numpy Param's are p.data and p.grad as they are now. Buffers of another size or
        dtype, read-only, non-contiguous or on the wrong device raise ValueError (updating the
        old storage would be a silent no-op for the model; using the new one would overrun it)."""
        if p.source is not None:
            src = p.source
            local = src.to_local() if hasattr(src, "to_local") else src
            was = self._slot(p).dtype
            if _torch_dtypes is not None and _torch_dtypes[0].get(local.dtype) != was:
                # model.to(torch.bfloat16) / .half() after the optimizer was made: torch.optim
                # follows it (its state is made lazily); the runtime holds state and kernels
                # for the dtype it registered
                raise ValueError(f"{p.name}.data is now {local.dtype}; it was registered as "
                                 f"{was} (model.to(dtype) or .half() after the optimizer was "
                                 "made?): make the optimizer after changing the model's dtype "
                                 "(float32 or bfloat16), and load_state_dict(old.state_dict()) "
                                 "into it to keep the state")
            grad = src.grad
            if grad is None and not skip_missing:
                self._torch_grad(p)  # raises, naming p
            grad = grad.to_local() if hasattr(grad, "to_local") else grad
            # param.grad.data = g of another shape (torch's .grad setter refuses one, .data does
            # not): of the same element count it was read as the parameter's matrix, a silently
            # wrong update (torch.optim fails on the shapes); refused below, after the count
            shapes = (None if grad is None or grad.shape == local.shape
                      else (list(grad.shape), list(local.shape)))
            perm = getattr(p, "_perm", None)
            shown = local
            if perm is not None:  # channels_last, transposed: the registered view
                local = local.permute(perm)
                grad = _in_order(grad, perm) if grad is not None else None
            if local.layout == sys.modules["torch"].strided and not local.is_contiguous():
                # model.to(memory_format=...) or a transpose after the optimizer was made:
                # torch.optim follows it (elementwise, its state in the parameter's shape);
                # the runtime's state is in the registered memory order
                raise ValueError(f"{p.name}.data is not contiguous in the memory order it was "
                                 f"registered in (now strides {tuple(shown.stride())} for shape "
                                 f"{list(shown.shape)}: model.to(memory_format=...), t_() or "
                                 "param.data = param.data.t() after the optimizer was made?): "
                                 "make the optimizer after changing the layout, and "
                                 "load_state_dict(old.state_dict()) into it to keep the state")
            elif grad is not None and not _dense_grad(grad, local):
                # torch.optim takes any strided gradient of the parameter's shape (a .t() of
                # a transposed product, an expand of a broadcast): read from a copy in the
                # parameter's order, held through the step as _in_order's
                grad = grad.contiguous()
            addrs = self._check_buffers(p, local, grad)  # the checks hold for a detached view
            slot = self._slot(p)
            if slot.shape is not None and local.shape != slot.shape:
                # the same element count in another shape (param.data = w.reshape(...)): the
                # library would step the memory as the registered matrix, a silently wrong
                # Muon update (torch.optim fails on its state's shape)
                raise ValueError(f"{p.name}.data has shape {list(local.shape)}; it was registered "
                                 f"with shape {list(slot.shape)} (the same elements in another "
                                 "shape would be stepped as the registered matrix): assign a "
                                 "tensor of that shape, or make a new Optimizer")
            if shapes is not None:
                raise ValueError(f"{p.name}.grad has shape {shapes[0]}; the parameter's is "
                                 f"{shapes[1]}: a gradient of another tensor?")
            # keep the tensors held while nothing moved (they keep the memory alive); a new
            # address is held through a detached view of it
            data = slot.data if addrs[0] == slot.data_addr else local.detach()
            grad = (slot.grad if addrs[1] == slot.grad_addr and slot.grad is not None
                    else grad.detach() if grad is not None else None)
            p.data, p.grad = data, grad
        else:
            data, grad = p.data, p.grad
            addrs = self._check_buffers(p, data, grad)
        self._point(p, data, grad, addrs)

    def _fast_rows(self):
        """What _follow compares at the next step (_Fast), taken when every parameter's buffers
        were just checked and the library points at them. None (every step checks everything,
        _sync) unless every parameter is a plain torch tensor (nn.Parameter or Tensor, not a
        DTensor or another subclass) whose .grad is a plain tensor or None, at the address the
        library has."""
        torch = sys.modules.get("torch")
        if torch is None or not self.params or not self._rt:
            return None
        kinds, data_ptr = (torch.Tensor, torch.nn.Parameter), torch.Tensor.data_ptr
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        f = _Fast()
        f.params, f.slots, f.srcs, f.grads = [], [], [], []
        for p in self.params:
            src, slot = p.source, self._slots.get(id(p))
            if slot is None or type(src) not in kinds:
                return None
            g = src.grad
            if (g is not None and type(g) is not torch.Tensor) or \
                    data_ptr(src) != slot.data_addr or \
                    (slot.grad_addr if g is None else data_ptr(g)) != slot.grad_addr:
                return None
            f.params.append(p)
            f.slots.append(slot)
            f.srcs.append(src)
            f.grads.append(g)
        slots, n = f.slots, len(f.slots)
        f.gaddrs = [s.grad_addr for s in slots]
        daddrs = [s.data_addr for s in slots]
        f.handles = (ctypes.c_void_p * n)(*[s.handle for s in slots])
        f.darr = (ctypes.c_void_p * n)(*daddrs)
        f.garr = (ctypes.c_void_p * n)()
        set_pointers = self._lib.shardopt_params_set_pointers
        if self._ext is not None:  # the C twin takes the function and the arrays by address
            set_pointers = ctypes.cast(set_pointers, ctypes.c_void_p).value
            arrays = tuple(ctypes.addressof(x) for x in (f.handles, f.darr, f.garr))
        else:
            arrays = (f.handles, f.darr, f.garr)
        t = torch.Tensor
        f.rows = (t, t.data_ptr, t.numel, t.is_contiguous, t.is_neg, self._host, set_pointers,
                  f.params, f.slots, f.srcs, f.grads, f.gaddrs, daddrs,
                  [s.count for s in slots], [dtypes[s.grad_dtype] for s in slots],
                  [s.shape for s in slots],
                  # the full check (_sync) has just measured every gradient's storage
                  [None if g is None else weakref.ref(g) for g in f.grads]) + arrays
        f.step = None if self._ext is None else functools.partial(
            self._ext.step, f.rows, self._rt.value, self._c_step, self._c_args)
        f.gone = [_GONE] * n
        return f

    def _follow(self, skip_missing):
        """True when every parameter is up to date without the full check (_sync): nothing
        moved since the last step, or only gradients a torch step may take as they are
        (_follow_rows, or _shardopt_fast.follow, its C twin, where that module was built).
        False where the full check must run (a parameter given new memory, a tensor changed in
        place, a gradient of another kind, None without skip_missing, set_grad in between).
        This keeps step()'s Python time to one pass over the parameters (docs/python.md,
        overhead)."""
        f = self._fast
        if f is None:
            return False
        follow = _follow_rows if self._ext is None else self._ext.follow
        status = follow(f.rows, self._rt.value, skip_missing)
        if status is None:
            return False
        _check("params_set_pointers", status)
        return True

    def _full_check(self, skip_missing):
        """The check of every buffer (_sync) and of the other runtimes' memory (_peer_clash),
        where the comparison (_follow) declined: [(Param, message)] this rank refuses; the
        comparison's rows made again where none."""
        refused = []
        for p in self.params if self._rt else []:  # closed: the library says so below
            try:
                self._sync(p, skip_missing)
            except Exception as e:  # noqa: BLE001 - raised after the collective step
                refused.append((p, str(e)))
        if not refused and self._rt and self._peers is not None:
            clash = _peer_clash(self, self._peers())
            if clash is not None:
                refused.append(clash)
        self._fast = None if refused else self._fast_rows()
        return refused

    def _prepare(self, skip_missing):
        """step()'s check of the buffers, made ahead of the step: (followed, refused), which
        step(..., _checked=) goes on from without checking again. shardopt.torch.Muon checks
        every param group's runtime so before any group steps, so that a refusal in a later
        group steps nothing (each group is its own runtime, stepped in turn)."""
        followed = self._follow(skip_missing)
        return followed, [] if followed else self._full_check(skip_missing)

    def step(self, lr, adamw_lr=-1.0, weight_decay=-1.0, max_grad_norm=0.0, stream=None,
             skip_missing_grads=False, momentum=-1.0, adamw_betas=None, adamw_eps=-1.0,
             _checked=None):
        """One optimizer step (collective). stream: a CUDA stream (torch.cuda.Stream or a
        raw handle) for the CUDA backend. Every parameter's buffers are checked again first
        (_sync) unless nothing moved since the last check (_follow); parameters from
        torch_params take their gradients from .grad now.
        skip_missing_grads: a parameter whose gradient is None on every rank is left exactly as
        it is (values, state, step count), as torch.optim does; None on some ranks only fails
        the step on every rank (Error, status -4). Pass the same value on every rank.
        momentum: Muon's mu for this step, in [0, 1) (a warmup written every step); < 0: the
        config's. adamw_betas: (beta1, beta2) of the AdamW tensors for this step, each in
        [0, 1) or < 0 for the config's (None: both the config's); adamw_eps: their eps, in
        (0, 1], < 0 the config's. The moments and the bias correction 1 - beta^t take this
        step's values, as torch.optim.AdamW reads its group's betas and eps at every step."""
        bad = None
        try:
            skip_missing_grads = _step_flag("skip_missing_grads", skip_missing_grads)
            lr, adamw_lr = _step_number("lr", lr), _step_number("adamw_lr", adamw_lr)
            weight_decay = _step_number("weight_decay", weight_decay)
            max_grad_norm = _step_number("max_grad_norm", max_grad_norm)
            momentum, adamw_eps = _step_number("momentum", momentum), _step_number("adamw_eps",
                                                                                   adamw_eps)
            if adamw_betas is None:
                b1, b2 = -1.0, -1.0
            elif isinstance(adamw_betas, (tuple, list)) and len(adamw_betas) == 2:
                b1, b2 = (_step_number(f"adamw_betas[{i}]", b) for i, b in enumerate(adamw_betas))
            else:
                raise ValueError(f"step: adamw_betas = {adamw_betas!r}: accepted None or a pair "
                                 "(beta1, beta2)")
            if stream is None and self._cuda:  # torch's convention: the current stream
                import torch
                stream = torch.cuda.current_stream()
            if stream is not None and hasattr(stream, "cuda_stream"):
                stream = stream.cuda_stream
            t = _StepArgs()  # the assignments below, tried first: what ctypes refuses raises
            t.lr, t.adamw_lr, t.weight_decay, t.stream = lr, adamw_lr, weight_decay, stream
            t.max_grad_norm, t.momentum, t.adamw_eps = max_grad_norm, momentum, adamw_eps
            t.adamw_beta1, t.adamw_beta2 = b1, b2
        except Exception as e:  # noqa: BLE001 - raised below, after the collective step
            # the step is collective: this rank still makes it, with lr = NaN, which the
            # library refuses on every rank before touching anything (the others name this
            # rank), instead of raising here and leaving them in it until comm_timeout_s
            bad, skip_missing_grads, b1, b2, stream = e, False, -1.0, -1.0, None
            lr, adamw_lr, weight_decay, max_grad_norm = float("nan"), -1.0, -1.0, 0.0
            momentum, adamw_eps = -1.0, -1.0
        f = self._fast if bad is None else None
        checked = _checked if bad is None else None  # _prepare's outcome: not checked again
        if f is not None and f.step is not None and (checked is None or checked[0]):
            # _follow and the step below in one C call (_fast.c), where nothing else is needed;
            # the C call fills every field but momentum and AdamW's betas and eps, set here in
            # the struct it shares
            a = self._args
            a.momentum, a.adamw_beta1, a.adamw_beta2, a.adamw_eps = momentum, b1, b2, adamw_eps
            done = f.step(skip_missing_grads, lr, adamw_lr, weight_decay, max_grad_norm, stream,
                          checked is not None)
            if done is not None:
                f.grads[:] = f.gone  # held through the step only (_let_grads_go)
                status, seconds = done
                if seconds is None:
                    _check("params_set_pointers", status)
                self.seconds_call_last = seconds
                _check("step", status)
                return
            followed = False  # the same comparison in Python would say the same
        elif checked is not None:
            followed = checked[0]
        else:
            followed = self._follow(skip_missing_grads)
        if checked is not None:
            refused = list(checked[1])
        else:
            refused = [] if followed else self._full_check(skip_missing_grads)
        a = self._args  # one struct per runtime, refilled: the library reads it during the call
        a.lr, a.adamw_lr, a.weight_decay, a.stream = lr, adamw_lr, weight_decay, stream
        a.max_grad_norm, a.skip_missing_grads = max_grad_norm, int(bool(skip_missing_grads))
        a.momentum = momentum  # Muon's mu for this step (a warmup); < 0: the config's
        a.adamw_beta1, a.adamw_beta2, a.adamw_eps = b1, b2, adamw_eps  # < 0: the config's
        if refused:
            # the step is collective: this rank still goes on to it, with arguments the library
            # refuses before touching any buffer, so that it fails on every rank instead of the
            # others waiting for this one. A refused parameter's gradient is passed as NULL
            # (the library names the parameter on every rank); where its shard is empty here,
            # or where skip_missing_grads would skip a NULL gradient, lr = NaN makes the
            # refusal certain.
            named = False
            for p, _ in refused:
                slot = self._slots.get(id(p))
                if slot is None:  # not one of this optimizer's registered parameters
                    continue
                self._lib.shardopt_param_set_pointers(slot.handle, slot.data_addr, None)
                slot.grad, slot.grad_addr = None, None
                if p.source is not None:
                    p.grad = None
                named = named or slot.count > 0
            if not named or skip_missing_grads:
                a.lr = float("nan")
        t0 = _perf_counter()
        status = self._step_fn(self._rt, self._args_ref)
        self.seconds_call_last = _perf_counter() - t0  # the C call, as Python waited for it
        self._let_grads_go(followed)
        if bad is not None:
            raise bad
        if refused:
            raise ValueError("; ".join(m for _, m in refused))
        _check("step", status)

    def _let_grads_go(self, followed):
        """After a step: the torch gradients are held no longer (the library's pointers to
        them are not read before the next step, which checks every parameter's .grad again and
        points the library at it). Held to the next step, a gradient the trainer drops
        (model.zero_grad(), as HF's Trainer and modded-nanogpt call it, instead of the
        optimizer's) would stay allocated through the next forward and backward: twice the
        gradients' memory of a torch.optim optimizer. Numpy Params keep theirs (Param.grad is
        the caller's)."""
        f = self._fast
        if f is not None:
            f.grads[:] = f.gone
        if not followed:  # the full check (_sync) held them on the slots and Params
            for p in self.params:
                if p.source is not None:
                    p.grad = None
                    slot = self._slots.get(id(p))
                    if slot is not None:
                        slot.grad = None

    def zero_grad(self, set_to_none=True):
        """Zero every registered gradient buffer in place; torch parameters' .grad is set to
        None instead (as torch.optim does) unless set_to_none is False, when the gradient the
        parameter holds now is zeroed in place (the one backward accumulates into next, whether
        or not a step has picked it up yet)."""
        fast = self._fast  # the comparison goes on from every gradient None (_follow)
        cleared = []  # the library lets go of these gradients in one call, below
        for p in self.params:
            if p.source is not None and set_to_none:
                p.source.grad = None
                p.grad = None  # let the old tensor go
                slot = self._slots.get(id(p))
                if slot is not None:
                    if slot.grad_addr is not None:
                        cleared.append(slot)
                    slot.grad = None
            elif p.source is not None:
                g = p.source.grad
                if g is not None:  # as torch.optim.Optimizer.zero_grad(set_to_none=False)
                    if g.grad_fn is not None:
                        g.detach_()
                    else:
                        g.requires_grad_(False)
                    g.zero_()
            elif p.grad is not None:
                p.grad[...] = 0
        if cleared and self._rt:
            n = len(cleared)
            if fast is not None and n == len(fast.slots):  # every one: the arrays it holds
                handles, darr = fast.handles, fast.darr
            else:
                handles = (ctypes.c_void_p * n)(*[s.handle for s in cleared])
                darr = (ctypes.c_void_p * n)(*[s.data_addr for s in cleared])
            _check("params_set_pointers", self._lib.shardopt_params_set_pointers(
                self._rt, n, handles, darr, None))
            for slot in cleared:
                slot.grad_addr = None
        if fast is not None and set_to_none:
            for i, (src, slot) in enumerate(zip(fast.srcs, fast.slots)):
                if src.grad is not None or slot.grad_addr is not None:
                    fast = None  # a gradient the loop above did not let go: check it all
                    break
                fast.grads[i] = fast.gaddrs[i] = None
        self._fast = fast

    def save(self, directory):
        """Save the optimizer state (collective). Saving again at the step `latest` already
        names is refused with SaveRefused (nothing written), not an I/O error."""
        try:
            self._checkpoint_call("save", self._lib.shardopt_save, directory)
        except Error as e:
            # a committed runtime's save has one invalid-state refusal: that step is latest
            if e.status == _ERR_STATE:
                raise SaveRefused(e.status, e.message) from None
            raise

    # ---- one parameter's optimizer state (not collective) ----------------------------------

    def state_kinds(self, p):
        """The state tensors of p: ("momentum",) for Muon, ("exp_avg", "exp_avg_sq") for
        AdamW."""
        return ("momentum",) if self.algo(p) == "muon" else ("exp_avg", "exp_avg_sq")

    def state_info(self, p, kind):
        """(dtype, count): the dtype ("fp32" / "bf16") p's state `kind` is held in and the
        number of elements this rank holds (its shard's, in the parameter's local order)."""
        slot = self._slot(p)
        dt, n = ctypes.c_int(), ctypes.c_int64()
        _check("param_state_info", self._lib.shardopt_param_state_info(
            slot.handle, _kind(p, kind), ctypes.byref(dt), ctypes.byref(n)))
        return {0: "fp32", 1: "bf16"}[dt.value], n.value

    def get_state(self, p, kind):
        """This rank's shard of p's state `kind` (state_kinds) as a new flat numpy array in
        the parameter's local element order: float32, or uint16 holding bf16 bits where the
        state is held in bf16 (the bytes a save writes). Not collective."""
        import numpy as np
        dt, n = self.state_info(p, kind)
        out = np.empty(n, np.float32 if dt == "fp32" else np.uint16)
        _check("param_get_state", self._lib.shardopt_param_get_state(
            self._slot(p).handle, _kind(p, kind), out.ctypes.data, out.nbytes, DTYPES[dt]))
        return out

    def set_state(self, p, kind, values):
        """Replace this rank's shard of p's state `kind` with values: a host buffer (numpy
        float32 / uint16-as-bf16, torch float32 / bfloat16) of the state's dtype and element
        count (state_info); anything else raises (the library converts nothing). Not
        collective: where the runtime holds replicas, set the same values on every replica."""
        slot = self._slot(p)
        k = _kind(p, kind)
        addr, dt, n = _buffer(values, f"{p.name}.{kind}", host=True)
        if addr is None and n == 0:
            dt = self.state_info(p, kind)[0]
        size = 2 if dt == "bf16" else 4
        _check("param_set_state", self._lib.shardopt_param_set_state(
            slot.handle, k, addr, n * size, DTYPES[dt]))

    def get_step(self, p):
        """The steps p has taken (AdamW's bias correction, the stochastic rounding key)."""
        s = ctypes.c_uint64()
        _check("param_get_step", self._lib.shardopt_param_get_step(self._slot(p).handle,
                                                                    ctypes.byref(s)))
        return s.value

    def set_step(self, p, step):
        """Set p's step count (the same value on every rank)."""
        if _is_bool(step):  # operator.index(True) is 1: set as step 1
            raise ValueError(f"{p.name}: step = {step!r}: a step count is an integer, not a bool")
        try:  # ctypes wrapped 2**70 to 0 and int() cut 1.5 to 1, both set without a word
            n = operator.index(step)
        except TypeError:
            raise ValueError(f"{p.name}: step = {step!r}: a step count is an integer") from None
        if not 0 <= n < 1 << 64:
            raise ValueError(f"{p.name}: step = {n}: accepted [0, 2^53)")
        _check("param_set_step", self._lib.shardopt_param_set_step(self._slot(p).handle, n))

    def load(self, directory):
        self._checkpoint_call("load", self._lib.shardopt_load, directory)

    def _checkpoint_call(self, call, fn, directory):
        """fn (shardopt_save / shardopt_load) on this runtime and directory, collective: a path
        holding a NUL byte raises its ValueError after the call (_dir_text), in place of the
        library's refusal of the "" it was given; on a rank that read rank 0's path instead,
        after a call that succeeded."""
        path, bad = self._dir_text(directory, call)
        try:
            _check(call, fn(self._rt, path))
        except Error as e:
            if bad is not None:
                raise bad from e
            raise
        if bad is not None:
            raise bad

    @staticmethod
    def _dir_text(directory, call):
        """A checkpoint path as C reads it, and the refusal of one holding a NUL byte. save and
        load are collective: such a path goes to the library as "" (refused there on every rank
        that reads its own path) and the ValueError is raised after the call, never before it
        (the other ranks would wait in it until comm_timeout_s)."""
        try:  # a directory os.fsencode refuses (None, a number) likewise, after the call
            return _c_text(os.fsencode(directory), f"{call}: directory {directory!r}"), None
        except (TypeError, ValueError) as e:
            return b"", e

    def stats(self):
        s = _Stats(size=ctypes.sizeof(_Stats), version=5)
        _check("get_stats", self._lib.shardopt_get_stats(self._rt, ctypes.byref(s)))
        return _stats_dict(s)

    def close(self):
        if self._rt:
            self._lib.shardopt_finalize(self._rt)
            self._rt = ctypes.c_void_p()
            if _live is not None:
                _live.discard(self)
            for p in getattr(self, "params", []):  # freed with the runtime
                p.handle = None
            self._slots = {}  # the library no longer touches any buffer
            self._fast = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
