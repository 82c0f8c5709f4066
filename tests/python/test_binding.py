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
st = opt.stats()
check(st["load_kept_tensors"] == 0 and st["load_unused_params"] == 0,
      f"stats of a load where every name matches: {st['load_kept_tensors']}, "
      f"{st['load_unused_params']}")
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

# after close, the params' handles are gone: a ValueError, not a write into freed memory
try:
    opt.set_grad(params[0], params[0].grad)
    check(False, "set_grad after close was accepted")
except ValueError as e:
    check("closed" in str(e), f"set_grad after close: {e}")

# list-valued config: adamw_patterns as a list (it used to become the text "['lm', ...]")
w = np.zeros((4, 8), np.float32)
two = [shardopt.Param(name="lm.weight", shape=[4, 8], data=as_param_buffer(w.copy()),
                      grad=as_param_buffer(w.copy()), placement="replicated"),
       shardopt.Param(name="body.weight", shape=[4, 8], data=as_param_buffer(w.copy()),
                      grad=as_param_buffer(w.copy()), placement="replicated")]
with shardopt.Optimizer(two, comm=comm, config={"adamw_patterns": ["lm", "embed"]}) as o2:
    check([o2.algo(p) for p in two] == ["adamw", "muon"],
          f"adamw_patterns from a list: {[o2.algo(p) for p in two]}")

# a buffer smaller than its declared shard on the last rank only: every rank raises instead of
# the others waiting in commit until comm_timeout_s (the binding used to raise on that rank
# alone, before commit)
bad = size - 1
mine = np.zeros((3 if rank == bad else 4, 8), np.float32)
try:
    shardopt.Optimizer([shardopt.Param(name="w", shape=[4, 8], data=as_param_buffer(mine),
                                       grad=as_param_buffer(mine.copy()),
                                       placement="replicated")], comm=comm)
    check(False, "a short buffer was accepted")
except ValueError as e:
    check(rank == bad and "holds 32 here" in str(e), f"rank {rank}: {e}")
except shardopt.Error as e:
    check(rank != bad and e.status == -4, f"rank {rank}: {e}")

# stats(): every field of shardopt_stats_t version 5; bytes_ns_allreduce_last (version 3): a
# [16, 32] matrix split along its 32 columns, orthogonalized sharded, all-reduces its 16 x 16 fp32
# Gram matrix in each of 5 iterations, 2(k-1)/k of it per member over k ranks (0 on one rank)
cols = -(-32 // size)
lo = min(rank * cols, 32)
ln = min(cols, 32 - lo)
g = np.full((16, ln), 0.01, np.float32)
wide = [shardopt.Param(name="wide.weight", shape=[16, 32], data=as_param_buffer(g.copy() * 3),
                       grad=as_param_buffer(g), shard_dim=1, shard_offset=lo, shard_length=ln)]
with shardopt.Optimizer(wide, comm=comm, config={"ns_strategy": "sharded"}) as o4:
    o4.step(lr=0.01)
    st = o4.stats()
    want = 5 * 4 * (2 * (size - 1) * 16 * 16 // size)
    check(st.get("bytes_ns_allreduce_last") == want,
          f"stats bytes_ns_allreduce_last = {st.get('bytes_ns_allreduce_last')}, want {want}")
    check(st["ns_sharded_matrices"] == (1 if size > 1 else 0) and st["phases_current"] == 1 and
          st["offload"] == 0, f"stats of versions 1-2 after the prefix: {st}")
    check(st.get("ns_gram_fallbacks") == 0, f"stats ns_gram_fallbacks (version 5): {st}")
# a library built before a field was appended says so in size: the field is absent, not a zero
old = shardopt._Stats(size=shardopt._Stats.phases_current.offset, version=1)
old.bytes_ns_allreduce_last = 7
old.nonfinite_elements_last = 3
d = shardopt._stats_dict(old)
check("bytes_ns_allreduce_last" not in d and "phases_current" not in d and
      d["nonfinite_elements_last"] == 3, f"a version-1 library's stats: {sorted(d)[-3:]}")

if use_torch:  # torch_params over plain tensors (replicated on every rank)
    torch.manual_seed(3)
    lin = torch.nn.Linear(8, 4, bias=False)
    frozen = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    tp = shardopt.torch_params([("lin.weight", lin.weight), ("frozen", frozen)])
    check([q.name for q in tp] == ["lin.weight"], "frozen parameters are not registered")
    with shardopt.Optimizer(tp, comm=comm) as o3:
        lin.weight.grad = torch.ones_like(lin.weight)
        o3.step(lr=0.01)
        # new storage of the same size and dtype (param.data = ...): followed, not left behind
        lin.weight.data = lin.weight.detach().clone()
        before = lin.weight.detach().clone()
        lin.weight.grad = torch.ones_like(lin.weight)
        o3.step(lr=0.01)
        check(not torch.equal(lin.weight.detach(), before), "the step updates the new storage")
        o3.zero_grad()
        check(tp[0].grad is None and lin.weight.grad is None,
              "zero_grad lets the old gradient go")
        # no gradient on the last rank only: every rank's step fails, none waits for it
        lin.weight.grad = None if rank == size - 1 else torch.ones_like(lin.weight)
        try:
            o3.step(lr=0.01)
            check(False, "a step with a missing gradient was accepted")
        except (ValueError, shardopt.Error) as e:
            check(("no gradient" in str(e)) if rank == size - 1 else isinstance(e, shardopt.Error),
                  f"rank {rank}: {e}")

failures = comm.allreduce(failures)
if rank == 0:
    kind = "torch tensors" if use_torch else "numpy arrays"
    print(f"test_binding: {size} rank(s), {kind}: {'ok' if failures == 0 else f'{failures} failure(s)'}")
sys.exit(1 if failures else 0)
