"""Expert stacks under expert parallelism through shardopt.torch.Muon, on 2 ranks (ep = 2):
torchtitan's convention (a DTensor on an 'ep' mesh dim, Shard(0)) and plain EP-local tensors
with config ep, each against the whole stack stepped on one process (ep = 1): the same bits,
Muon being per expert and the library layout-invariant. A mesh whose 'ep' coordinates do not
follow the runtime's EP ranks is refused on every rank, and so is a gradient that is None on
one rank only (agreed over comm). Run under mpiexec with 2 ranks; exit 77
on every rank without torch."""
import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
try:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
except Exception as e:  # noqa: BLE001
    if comm.rank == 0:
        print(f"SKIP: torch with torch.distributed is not importable ({e})")
    sys.exit(77)

import shardopt  # noqa: E402
from shardopt.torch import Muon  # noqa: E402

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29551")
dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
torch.set_num_threads(1)
E, O, I = 4, 16, 12
full = torch.randn(E, O, I, generator=torch.Generator().manual_seed(0))
grads = [torch.randn(E, O, I, generator=torch.Generator().manual_seed(1 + k)) for k in range(2)]
win = slice(2 * comm.rank, 2 * comm.rank + 2)
experts = lambda n: "experts" in n  # noqa: E731

# the reference: the whole stack on this process alone, ep = 1
ref = torch.nn.Parameter(full.clone())
ro = Muon([("moe.experts.w", ref)], lr=0.02, expert=experts)
for g in grads:
    ref.grad = g.clone()
    ro.step()
ro.close()


def run(param, local_grad, **kw):
    opt = Muon([("moe.experts.w", param)], lr=0.02, comm=comm, config={"ep": 2, "dp_shard": 2},
               **kw)
    for g in grads:
        param.grad = local_grad(g)
        opt.step()
    opt.close()


failures = 0
# torchtitan: a DTensor on the 'ep' mesh dim, Shard(0): no expert= needed
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("ep",))
dt = torch.nn.Parameter(DTensor.from_local(full[win].clone(), mesh, [Shard(0)], run_check=False))
run(dt, lambda g: DTensor.from_local(g[win].clone(), mesh, [Shard(0)], run_check=False))
if not torch.equal(dt.to_local(), ref.detach()[win]):
    print(f"rank {comm.rank}: the 'ep' DTensor's experts differ from one process")
    failures += 1
# plain EP-local tensors: [E / ep, out, in] on each rank, with config ep = 2 and expert=
pl = torch.nn.Parameter(full[win].clone())
run(pl, lambda g: g[win].clone(), expert=experts)
if not torch.equal(pl.detach(), ref.detach()[win]):
    print(f"rank {comm.rank}: the EP-local tensor's experts differ from one process")
    failures += 1
# a mesh whose 'ep' coordinate is not the runtime's EP rank (ranks reversed): refused everywhere
rev = DeviceMesh("cpu", [1, 0], mesh_dim_names=("ep",))
mine = full[2 * (1 - comm.rank):2 * (1 - comm.rank) + 2].clone()
bad = torch.nn.Parameter(DTensor.from_local(mine, rev, [Shard(0)], run_check=False))
try:
    run(bad, lambda g: g)
    print(f"rank {comm.rank}: experts of another EP rank were not refused")
    failures += 1
except Exception as e:  # noqa: BLE001 - ValueError here, shardopt.Error on the other rank
    if "EP rank" not in str(e) and "refused by the Python binding" not in str(e):
        print(f"rank {comm.rank}: unexpected error: {e}")
        failures += 1
# a DTensor over 2 ranks with comm left out: refused before any runtime is made
try:
    Muon([("moe.experts.w", dt)], lr=0.02)
    print(f"rank {comm.rank}: a 2-rank DTensor with comm=None was taken")
    failures += 1
except ValueError as e:
    if "pass comm=MPI.COMM_WORLD" not in str(e):
        print(f"rank {comm.rank}: unexpected error: {e}")
        failures += 1
# a gradient None on one rank only: shardopt.Error (ERR_MISMATCH) on every rank, naming the
# parameter and rank 1, nothing stepped
lin = torch.nn.Linear(6, 6)
torch.nn.init.constant_(lin.weight, 0.5)
keep = lin.weight.detach().clone()
mo = Muon(lin.named_parameters(), lr=0.02, comm=comm)
lin.weight.grad = torch.ones(6, 6) if comm.rank == 0 else None
lin.bias.grad = torch.ones(6)
try:
    mo.step()
    print(f"rank {comm.rank}: a gradient missing on rank 1 only was not refused")
    failures += 1
except shardopt.Error as e:
    if e.status != -4 or "'weight' has no gradient (NULL grad) on rank 1" not in str(e):
        print(f"rank {comm.rank}: unexpected error: {e}")
        failures += 1
if not torch.equal(lin.weight.detach(), keep):
    print(f"rank {comm.rank}: the refused step wrote the weight")
    failures += 1
lin.weight.grad = None  # on every rank now: skipped, the bias steps
mo.step()
if not torch.equal(lin.weight.detach(), keep):
    print(f"rank {comm.rank}: a weight without a gradient anywhere moved")
    failures += 1
mo.close()
failures = comm.allreduce(failures)
if comm.rank == 0:
    print(f"torch_ep: {'ok' if failures == 0 else f'{failures} failure(s)'}")
dist.destroy_process_group()
sys.exit(1 if failures else 0)
