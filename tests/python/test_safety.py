"""The Python binding must not be able to crash the process (docs/python.md, "What the binding
refuses"): every buffer the library may dereference is checked (writeable where the library
writes, C-contiguous, aligned, float32/bf16 in native byte order, host memory under the CPU
backend, exactly the elements of its declared shard: dense, replicated and expert), owned by the
binding while the library may touch it, and checked again at each step(); a reassigned buffer
is followed (same size and dtype) or refused. A refusal is a ValueError on the rank that made
it and a failed collective call (shardopt.Error) on the others, never a hang.

    python3 test_safety.py cases         every single-process case, each in a child process
                                         (a segfault is reported as that case's failure)
    python3 test_safety.py case NAME     one of them, in this process

The collective cases, on 2 ranks, are test_safety_ranks.py's.

SHARDOPT_LIBRARY names the library under test (safety.sh sets it)."""
import gc
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import shardopt  # noqa: E402

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def refused(fn, *words):
    """fn() raises ValueError whose message has every word (a refusal, not a library error and
    not a silent acceptance); returns the message."""
    try:
        fn()
    except ValueError as e:
        msg = str(e)
        for w in words:
            assert w.lower() in msg.lower(), f"{w!r} not in the refusal: {msg}"
        return msg
    raise AssertionError(f"accepted (expected a ValueError naming {words})")


def comm_self():
    from mpi4py import MPI
    return MPI.COMM_SELF


def one(data, grad=None, shape=None, **kw):
    """A Param named w (replicated: this rank holds all of it) and its Optimizer on one rank."""
    p = shardopt.Param(name=kw.pop("name_override", "w"),
                       shape=list(data.shape) if shape is None else shape, data=data,
                       grad=grad, placement=kw.pop("placement", "replicated"), **kw)
    return p, shardopt.Optimizer([p], comm=comm_self())


def register(data, grad=None, shape=None, **kw):
    """Optimizer over a single Param w; closed at once when made (the caller expects a
    refusal)."""
    _, opt = one(data, grad, shape, **kw)
    opt.close()


def reference(w0, g, steps=1, **kw):
    """w after `steps` steps from w0 with gradient g, through fresh buffers."""
    w = w0.copy()
    p, opt = one(w, g.copy(), **kw)
    for _ in range(steps):
        opt.step(lr=0.01)
    opt.close()
    return w


def bits(a):
    return a.view(np.uint32) if a.dtype == np.float32 else a


def rng_arrays(n, seed=1):
    r = np.random.default_rng(seed)
    return r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)


class CudaInterface(np.ndarray):
    """Host memory that claims to be CUDA memory, as a cupy / numba device array does."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.ctypes.data, False)}


class IsCuda(np.ndarray):
    is_cuda = True  # as torch.Tensor.is_cuda


class CudaDevice(np.ndarray):
    class _Dev:
        type = "cuda"  # as torch.device("cuda:0").type

    @property
    def device(self):
        return self._Dev()


class NotAnArray:
    """A non-numpy object exposing __cuda_array_interface__ (cupy-like)."""
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (8, False),
                                "version": 3}


def cuda_standins(a):
    return [a.view(CudaInterface), a.view(IsCuda), a.view(CudaDevice)]


# ---------------------------------------------------------------------------------------------
# Class 1: non-writeable parameter data (the library writes the parameter in place)

@case
def readonly_data_refused_at_registration():
    """np.load(mmap_mode="r") (read-only pages: the step used to segfault), a read-only view,
    np.frombuffer(bytes), np.broadcast_to: refused at registration, naming w.data."""
    w, g = rng_arrays(64)
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "w.npy"), w)
        mm = np.load(os.path.join(d, "w.npy"), mmap_mode="r")
        ro = w.copy()
        ro.flags.writeable = False
        variants = {"mmap_mode='r'": mm, "read-only view": ro,
                    "frombuffer(bytes)": np.frombuffer(w.tobytes(), np.float32),
                    "broadcast_to": np.broadcast_to(np.float32(1), (64,))}
        for what, x in variants.items():
            def attempt():
                p, opt = one(x, g.copy())
                opt.step(lr=0.01)  # the old binding got here and wrote read-only memory
                opt.close()
            msg = refused(attempt, "w.data")
            assert "read-only" in msg or "contiguous" in msg, f"{what}: {msg}"
        # a read-only gradient is fine: the library only reads it
        src = rng_arrays(64, seed=5)[1]
        np.save(os.path.join(d, "g.npy"), src)
        gm = np.load(os.path.join(d, "g.npy"), mmap_mode="r")
        x = w.copy()
        p, opt = one(x, gm)
        opt.step(lr=0.01)
        opt.close()
        assert np.array_equal(bits(x), bits(reference(w, src))), "read-only grad: wrong result"


@case
def readonly_data_refused_at_step():
    """flags.writeable turned off after registration, or p.data reassigned to a read-only array
    of the same size and dtype (an mmap_mode='r' load): that step is refused and writes
    nothing; writeable again, the next step goes on."""
    w, g = rng_arrays(64)
    x = w.copy()
    p, opt = one(x, g.copy())
    x.flags.writeable = False
    refused(lambda: opt.step(lr=0.01), "w.data", "read-only")
    assert np.array_equal(bits(x), bits(w)), "a refused step wrote the parameter"
    x.flags.writeable = True
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "w.npy"), w)
        p.data = np.load(os.path.join(d, "w.npy"), mmap_mode="r")
        refused(lambda: opt.step(lr=0.01), "w.data", "read-only")
        p.data = x
        opt.step(lr=0.01)
    opt.close()
    assert np.array_equal(bits(x), bits(reference(w, g))), "the step after the refusals"


# ---------------------------------------------------------------------------------------------
# Class 2: buffers reassigned (or changed in place) after registration

@case
def reassigned_buffers_followed():
    """p.data and p.grad reassigned to new arrays of the same size and dtype, the old ones
    dropped and collected: the step reads the new gradient and updates the new array (the old
    binding wrote the freed one: a segfault with large arrays, the new array unchanged)."""
    n = 1 << 17  # 512 KiB: its own mapping (cases() fixes the malloc mmap threshold)
    w, g = rng_arrays(n)
    want = reference(w, 2 * g)
    p, opt = one(w.copy(), g.copy())
    p.data = w.copy()
    p.grad = 2 * g
    gc.collect()
    opt.step(lr=0.01)
    assert np.array_equal(bits(p.data), bits(want)), "the step did not update the new arrays"
    # a new object over the same memory (a reshaped view) is followed too
    keep = p.data
    p.data = keep.reshape(2, -1)
    opt.step(lr=0.01)
    opt.close()
    assert np.array_equal(bits(keep), bits(reference(w, 2 * g, steps=2))), "second step"


@case
def reassigned_buffers_refused():
    """p.data / p.grad reassigned to what the registered shard cannot take (another size,
    float64, byte-swapped, non-contiguous, unaligned, a memoryview, a list, None for data) or
    changed in place (resized, its dtype reinterpreted): each step is refused naming the
    buffer, the old buffers are still owned (no use after free), and once a fit buffer is
    back the steps go on with the right result."""
    n = 1 << 17
    w, g = rng_arrays(n)
    x = w.copy()
    p, opt = one(x, g.copy())
    xs = x.copy()
    bad = {"another size": np.zeros(n - 1, np.float32), "float64": w.astype(np.float64),
           "byte-swapped": w.astype(">f4"), "non-contiguous": np.zeros(2 * n, np.float32)[::2],
           "unaligned": np.frombuffer(bytearray(4 * n + 1), np.float32, n, offset=1),
           "memoryview": memoryview(bytearray(4 * n)), "list": [0.0] * 4, "None": None,
           "object": np.zeros(n, object), "0-size": np.zeros(0, np.float32)}
    for what, b in bad.items():
        p.data = b
        gc.collect()  # the binding, not p.data, keeps the registered array alive
        refused(lambda: opt.step(lr=0.01), "w.data")
    for what, b in bad.items():
        if b is None:
            continue
        p.data, p.grad = xs, b
        gc.collect()
        refused(lambda: opt.step(lr=0.01), "w.grad")
    assert np.array_equal(bits(xs), bits(w)), "a refused step wrote the parameter"
    # set_grad checks the same way
    refused(lambda: opt.set_grad(p, np.zeros(n, np.float64)), "w.grad")
    refused(lambda: opt.set_grad(p, np.zeros(2 * n, np.float32)[::2]), "w.grad")
    # a missing gradient is the library's refusal (a NULL grad), not a read of freed memory
    p.data, p.grad = xs, None
    gc.collect()
    try:
        opt.step(lr=0.01)
        raise AssertionError("a step with grad None was accepted")
    except shardopt.Error as e:
        assert "NULL grad" in e.message, e.message
    assert np.array_equal(bits(xs), bits(w)), "a refused step wrote the parameter"
    # the registered array changed in place: reallocated bigger (resize), reinterpreted as
    # uint16 (twice the elements); each refused, and followed once it fits again
    p.grad = g.copy()
    y = xs.copy()
    p.data = y
    opt.step(lr=0.01)  # y is the registered array now
    y.resize(2 * n, refcheck=False)
    gc.collect()
    refused(lambda: opt.step(lr=0.01), "w.data", f"{2 * n}")
    y.resize(n, refcheck=False)
    opt.step(lr=0.01)
    y.dtype = np.uint16
    refused(lambda: opt.step(lr=0.01), "w.data", f"{2 * n} bf16")
    y.dtype = np.float32
    opt.step(lr=0.01)
    opt.close()
    assert np.array_equal(bits(y), bits(reference(w, g, steps=3))), "the steps that went on"


@case
def closed_optimizer_lets_buffers_go():
    """After close() the binding holds no buffer and set_grad / algo refuse; a step reports the
    closed runtime (the library's NULL runtime), never touching freed memory. Closing another
    optimizer over the same Param leaves this one working."""
    w, g = rng_arrays(64)
    p, opt = one(w.copy(), g.copy())
    opt.close()
    p.data = p.grad = None
    gc.collect()
    refused(lambda: opt.set_grad(p, g), "closed")
    refused(lambda: opt.algo(p), "closed")
    try:
        opt.step(lr=0.01)
        raise AssertionError("a step after close was accepted")
    except shardopt.Error as e:
        assert "NULL runtime" in e.message, e.message
    # a Param registered with two optimizers: closing one leaves the other's buffers and
    # handle as they were
    x = w.copy()
    p, o1 = one(x, g.copy())
    o2 = shardopt.Optimizer([p], comm=comm_self())
    o2.close()
    o1.set_grad(p, g.copy())
    o1.step(lr=0.01)
    o1.close()
    assert np.array_equal(bits(x), bits(reference(w, g))), "the first optimizer's step"


# ---------------------------------------------------------------------------------------------
# Class 3: buffers that do not fit the declared shard, including expert-placed stacks

@case
def odd_buffers_refused_at_registration():
    """Non-contiguous, transposed, byte-swapped, float64, float16, int32, object, unaligned
    arrays, a memoryview of bytes, a list, a numpy scalar, None data, a 0-size array, data and
    grad of different sizes: a ValueError naming w at registration, never a crash."""
    a = np.zeros((8, 8), np.float32)
    g = np.zeros((8, 8), np.float32)
    bad = {"non-contiguous": np.zeros((8, 16), np.float32)[:, ::2],
           "transposed": np.zeros((8, 8), np.float32).T[:, :],
           "byte-swapped": a.astype(">f4"), "float64": a.astype(np.float64),
           "float16": a.astype(np.float16), "int32": a.astype(np.int32),
           "object": a.astype(object),
           "unaligned": np.frombuffer(bytearray(257), np.float32, 64, offset=1).reshape(8, 8),
           "memoryview of bytes": memoryview(bytes(256)), "list": a.tolist(),
           "numpy scalar": np.float32(0), "0-size": np.zeros((0, 8), np.float32),
           "short": np.zeros((7, 8), np.float32), "long": np.zeros((9, 8), np.float32)}
    for what, x in bad.items():
        refused(lambda: register(x, g.copy(), shape=[8, 8]), "w")
        refused(lambda: register(a.copy(), x, shape=[8, 8]), "w.grad" if what not in (
            "0-size", "short", "long") else "grad")
    refused(lambda: register(None, g.copy(), shape=[8, 8]), "w.data", "None")

    class Liar(np.ndarray):  # says it holds 64 elements, C-contiguous, writeable
        size = property(lambda self: 64)
    refused(lambda: register(np.zeros(8, np.float32).view(Liar), g.copy(), shape=[8, 8]), "w")
    # values that ctypes would wrap into another layout than the one checked
    refused(lambda: register(a.copy(), g.copy(), shape=[8, 8], shard_dim=1 << 32), "w",
            "shard_dim")
    refused(lambda: register(a.copy(), g.copy(), shape=[8, 8 + (1 << 64)]), "w", "shape[1]")


@case
def a_refused_fp16_parameter_logs_the_reason_not_ndim():
    """The binding refuses an fp16 array itself; the library must still fail commit (every
    rank), and what it logs must be the binding's reason: it logged "register '(refused by the
    Python binding)': ndim = 0", blaming a field the caller never set."""
    a = np.zeros((8, 8), np.float32)
    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            msg = refused(lambda: register(a.astype(np.float16), a.copy(), shape=[8, 8]), "w")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        logged = f.read().decode("utf-8", "replace")
    assert "ndim = 0" not in logged and "refused by the Python binding" not in logged, logged
    assert "register 'w': refused by the caller" in logged and "float16" in logged, logged
    assert "float16" in msg, msg


@case
def expert_buffer_sizes_checked():
    """An expert-placed [E, out, in] stack's buffer must hold this rank's shard of its E / ep
    experts (the old binding checked dense and replicated only: a short expert buffer was
    read and written past its end)."""
    n = 1 << 15
    e, o, i = 4, 64, n // 256  # 4 experts of [64, 128]: 128 KiB
    good = np.zeros((e, o, i), np.float32)
    for what, x in {"short": np.zeros((e - 1, o, i), np.float32),
                    "one expert": np.zeros((1, o, i), np.float32),
                    "long": np.zeros((e + 1, o, i), np.float32)}.items():
        def attempt():
            p, opt = one(x, np.ones_like(x), shape=[e, o, i], placement="expert", algo="adamw")
            opt.step(lr=0.01)  # the old binding got here
            opt.close()
        refused(attempt, "w", "expert", f"holds {e * o * i} here")
    # a grad of the wrong size with the right data
    refused(lambda: register(good.copy(), np.zeros((e - 1, o, i), np.float32), shape=[e, o, i],
                             placement="expert"), "w", "expert")
    # the right size steps
    w = np.random.default_rng(2).standard_normal((e, o, i)).astype(np.float32)
    x = w.copy()
    p, opt = one(x, np.ones_like(x), placement="expert", algo="adamw")
    opt.step(lr=0.01)
    opt.close()
    assert not np.array_equal(x, w), "the expert stack was not updated"


# ---------------------------------------------------------------------------------------------
# Class 4: device memory with the CPU backend; 0-D parameters

@case
def cuda_memory_refused_with_cpu_backend():
    """Objects that say they are CUDA memory (__cuda_array_interface__, is_cuda, a device of
    type cuda, as torch CUDA tensors and cupy arrays do) are refused under backend = cpu, at
    registration and when reassigned before a step (the CPU kernels would dereference a device
    pointer). torch itself is not needed: the check is on those attributes."""
    w, g = rng_arrays(64)
    for x in cuda_standins(w.copy()):
        refused(lambda: register(x, g.copy()), "w.data", "cuda")
        refused(lambda: register(w.copy(), x), "w.grad", "cuda")
    refused(lambda: register(NotAnArray(), g[:4].copy(), shape=[4]), "w.data", "cuda")
    x = w.copy()
    p, opt = one(x, g.copy())
    for y in cuda_standins(w.copy()):
        p.data = y
        refused(lambda: opt.step(lr=0.01), "w.data", "cuda")
    p.data = x
    for y in cuda_standins(g.copy()):
        p.grad = y
        refused(lambda: opt.step(lr=0.01), "w.grad", "cuda")
    p.grad = g.copy()
    opt.step(lr=0.01)
    opt.close()
    assert np.array_equal(bits(x), bits(reference(w, g))), "the step after the refusals"


@case
def zero_d_parameter_refused():
    """A 0-D (scalar) parameter, as a learnable temperature is: a ValueError naming it and
    saying what to do, at registration (the old binding passed ndim 0 on to the library)."""
    s = np.zeros((), np.float32)
    for shape in ([], (), np.zeros(()).shape):
        refused(lambda: register(s, s.copy(), shape=shape), "w", "0-D", "reshape(1)")
    refused(lambda: register(np.zeros(16, np.float32), None, shape=[1, 2, 2, 4]), "w", "4 dims")
    refused(lambda: register(np.zeros(16, np.float32), None, shape=16), "w", "shape")
    # the way out the message gives: shape [1] over a 1-element view of the same memory
    t = np.ones((), np.float32)
    p, opt = one(t.reshape(1), np.ones(1, np.float32), shape=[1])
    opt.step(lr=0.01)
    opt.close()
    assert t != 1, "the 1-element view did not update the scalar"


# ---------------------------------------------------------------------------------------------
# Class 4b: Python values C would read otherwise than they were written

@case
def text_with_nul_and_step_counts_ctypes_would_wrap_refused():
    """A NUL byte in a config key or value, a parameter name or a checkpoint path: C reads the
    text cut there (before: {"momentum\\0x": 0.5} set momentum, a parameter 'w\\0x'
    registered as 'w', save('D/ck\\0x') wrote into D/ck). set_step(2**70) went through ctypes as
    0 and set_step(1.5) as 1, both without a word."""
    w, g = rng_arrays(64)
    refused(lambda: shardopt.Optimizer([], comm=comm_self(), config={"momentum\0x": 0.5}),
            "config key", "NUL byte at 8", "b'momentum'")
    refused(lambda: shardopt.Optimizer([], comm=comm_self(),
                                       config={"adamw_patterns": "embed\0lm_head"}),
            "adamw_patterns", "NUL byte at 5")
    refused(lambda: register(w.copy(), g.copy(), name_override="w\0x"), "parameter name",
            "NUL byte at 1", "b'w'")
    p, opt = one(w.copy(), g.copy())
    opt.step(lr=0.01)
    with tempfile.TemporaryDirectory() as d:
        refused(lambda: opt.save(os.path.join(d, "ck\0x")), "save: directory", "NUL byte")
        assert not os.path.exists(os.path.join(d, "ck")), "a save wrote into the cut path"
        opt.save(os.path.join(d, "ck"))
        refused(lambda: opt.load(os.path.join(d, "ck\0x")), "load: directory", "NUL byte")
        opt.load(os.path.join(d, "ck"))
    for bad in (2**70, -1, 1.5, "3"):
        refused(lambda: opt.set_step(p, bad), "step = ")
    assert opt.get_step(p) == 1, opt.get_step(p)
    opt.set_step(p, np.int64(4))  # any integer type
    assert opt.get_step(p) == 4
    opt.close()


@case
def config_values_of_another_type_refused():
    """Before, {"momentum": [0.5]} was sent as "0.5" and {"ns_steps": True} as "1", taken
    without a word. A list is for the list keys only; a bool goes as true/false."""
    def make(cfg):
        return shardopt.Optimizer([], comm=comm_self(), config=cfg)

    refused(lambda: make({"momentum": [0.5]}), "momentum", "a list is accepted for")
    refused(lambda: make({"ns_steps": (5,)}), "ns_steps", "one value")
    for key, v in (("ns_steps", True), ("momentum", False), ("weight_decay", True)):
        try:
            make({key: v})
        except shardopt.Error as e:
            assert key in str(e) and ("'true'" in str(e) or "'false'" in str(e)), str(e)
        else:
            raise AssertionError(f"config {key} = {v!r} accepted")
    make({"nesterov": True, "param_stats": np.bool_(False), "momentum": np.float32(0.5),
          "ns_steps": np.int64(5), "adamw_patterns": ["embed", "lm_head"],
          "ns_coeffs": "custom", "ns_custom_coeffs": [[3.4445, -4.775, 2.0315]] * 5}).close()


# ---------------------------------------------------------------------------------------------
# Class 5: SHARDOPT_LIBRARY naming something that is not the library

def libc_path():
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if os.path.basename(path).startswith("libc.so"):
            return path
    raise AssertionError("libc not found in /proc/self/maps")


@case
def library_env_names_bad_file():
    """SHARDOPT_LIBRARY naming a missing file, a directory, an executable, libc (by path and by
    bare name): OSError naming the variable and the value (the old binding silently loaded
    build/libshardopt.so instead of a missing file, or failed later on an AttributeError)."""
    with tempfile.TemporaryDirectory() as d:
        for value in [os.path.join(d, "libshardopt.so"), d, "/bin/ls", libc_path(), "libc.so.6"]:
            env = dict(os.environ, SHARDOPT_LIBRARY=value)
            r = subprocess.run([sys.executable, "-c", "import shardopt; shardopt.library()"],
                               env=dict(env, PYTHONPATH=os.path.join(HERE, "..", "..", "python")),
                               capture_output=True, text=True, timeout=60)
            assert r.returncode != 0, f"SHARDOPT_LIBRARY={value}: loaded"
            last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            assert last.startswith("OSError") and f"SHARDOPT_LIBRARY={value}" in last, \
                f"SHARDOPT_LIBRARY={value}: {last}"
    # the real one loads
    r = subprocess.run([sys.executable, "-c", "import shardopt; shardopt.library()"],
                       env=dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python")),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def cases():
    failed = 0
    for name in CASES:
        try:
            # a fixed malloc mmap threshold: every array of 64 KiB or more has its own mapping,
            # unmapped when freed, so that a write through a stale pointer faults every time
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "case", name],
                               env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"),
                               capture_output=True, text=True, timeout=240)
            rc, out = r.returncode, (r.stdout + r.stderr).strip()
        except subprocess.TimeoutExpired:
            rc, out = "timeout", ""
        if rc == 0:
            print(f"{name}: ok", flush=True)
            continue
        failed += 1
        how = (f"killed by {signal.Signals(-rc).name}" if isinstance(rc, int) and rc < 0
               else f"exit {rc}")
        print(f"{name}: FAIL ({how})\n    " + "\n    ".join(out.splitlines()[-6:]), flush=True)
    print(f"test_safety: {len(CASES)} cases, 1 rank: "
          f"{'ok' if failed == 0 else f'{failed} failure(s)'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "cases"
    if mode == "case":
        CASES[sys.argv[2]]()
        sys.exit(0)
    sys.exit(cases())
