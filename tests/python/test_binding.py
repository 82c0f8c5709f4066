"""The Python binding under mpirun (python/shardopt): the tiny preset sharded over the ranks
(dense tensors along dim 0, expert stacks along their expert dim), the same gradients as the
C reference (compare_driver run, one process, the public C API), the same config: after the
steps the gathered parameters equal the C run's bit for bit. Also: save + load round trip,
stats, and errors raised as shardopt.Error with the C status and message.
    mpirun -n N python3 test_binding.py DIR   (DIR prepared by binding.sh)
With SHARDOPT_TEST_TORCH=1 the shards are torch CPU tensors (sharing the numpy buffers' values,
passed by data_ptr); exit 77 on every rank when torch is not importable."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import shardopt  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
tensors = m["tensors"]
shapes = [tuple(t["shape"]) for t in tensors]
counts = [int(np.prod(s)) for s in shapes]
offsets = np.cumsum([0] + counts)
full = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print(f"rank {rank}: FAIL: {what}", flush=True)


def chunk(n, parts, i):  # torch.chunk
    c = -(-n // parts)
    lo = min(c * i, n)
    return lo, min(lo + c, n) - lo


use_torch = os.environ.get("SHARDOPT_TEST_TORCH") == "1"
if use_torch:
    try:
        import torch
    except ImportError:
        if rank == 0:
            print("SKIP: torch is not importable (pip install torch)")
        sys.exit(77)


def as_param_buffer(a):
    return torch.from_numpy(a) if use_torch else a


def host(x):
    return x.numpy() if use_torch else x


# this rank's shards: dim 0 for everything (experts: the expert dim), like an FSDP trainer
params, views = [], []
for t, s, o in zip(tensors, shapes, offsets):
    lo, ln = chunk(s[0], size, rank)
    g = full[o:o + int(np.prod(s))].reshape(s)
    w = np.ascontiguousarray(g[lo:lo + ln]).copy()
    params.append(shardopt.Param(name=t["name"], shape=list(s), data=as_param_buffer(w),
                                 grad=as_param_buffer(np.zeros_like(w)),
                                 placement="expert" if t["expert"] else "dense",
                                 shard_dim=0, shard_offset=lo, shard_length=ln))
    views.append((lo, ln))

# the compare_driver's config (bench/compare_driver.c), as text keys
cfg = {"ns_coeffs": "jordan", "nesterov": True, "momentum": 0.95, "lr_scale": "rms_norm"}
opt = shardopt.Optimizer(params, comm=comm, config=cfg)
check(all(opt.algo(p) == t["algo"] for p, t in zip(params, tensors)),
      "the binding's algorithms match the C manifest")
for step in range(m["steps"]):
    gfull = np.fromfile(os.path.join(d, f"grads_{step}.bin"), dtype=np.float32)
    for p, s, o, (lo, ln) in zip(params, shapes, offsets, views):
        host(p.grad)[...] = gfull[o:o + int(np.prod(s))].reshape(s)[lo:lo + ln]
    opt.step(lr=m["lr"], weight_decay=m["weight_decay"])

st = opt.stats()
check(st["steps"] == m["steps"] and st["world"] == size and st["dense_size"] == size,
      f"stats: {st['steps']} steps, world {st['world']}")

# gather to rank 0, compare with the C run
ref = np.fromfile(os.path.join(d, "shardopt_params.bin"), dtype=np.float32) if rank == 0 else None
for p, s, o, (lo, ln) in zip(params, shapes, offsets, views):
    parts = comm.gather(host(p.data), root=0)
    if rank == 0:
        got = np.concatenate([x for x in parts if x.size], axis=0) if any(x.size for x in parts) \
            else np.zeros(s, np.float32)
        want = ref[o:o + int(np.prod(s))].reshape(s)
        check(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
              f"{p.name}: not bit for bit the C run's")

# save, change the state by a step, load: the next step from the loaded state repeats the
# first one's result
ck = comm.bcast(os.path.join(d, f"ckpt_np{size}") if rank == 0 else None, root=0)
opt.save(ck)
before = [host(p.data).copy() for p in params]
opt.step(lr=m["lr"])
after1 = [host(p.data).copy() for p in params]
for p, b in zip(params, before):
    host(p.data)[...] = b
opt.load(ck)
opt.step(lr=m["lr"])
check(all(np.array_equal(host(p.data), a) for p, a in zip(params, after1)),
      "a step after load repeats the step after save")

# errors carry the C status and message
try:
    shardopt.Optimizer([], comm=comm, config={"momentum": 1.5})
    check(False, "momentum = 1.5 was accepted")
except shardopt.Error as e:
    check(e.status == -1 and "momentum" in e.message, f"error carries status and message: {e}")
opt.close()

failures = comm.allreduce(failures)
if rank == 0:
    kind = "torch tensors" if use_torch else "numpy arrays"
    print(f"test_binding: {size} rank(s), {kind}: {'ok' if failures == 0 else f'{failures} failure(s)'}")
sys.exit(1 if failures else 0)
