"""shardopt.torch.Muon's refusals and per-step settings on 2 ranks (mpi4py comm, plain tensors
replicated as under DDP): a parameter frozen at construction that has a gradient on rank 0
only later fails the step on both ranks (a ValueError naming it on rank 0, shardopt.Error
naming rank 0 on rank 1), nothing written on either, and the next step goes on, as does a
negative weight_decay set on rank 0 only; a momentum warmup (g["momentum"] each step) gives the same bits on both ranks as on one process; dion's
distributed_mesh taken where it is comm's ranks, refused otherwise; a NaN gradient on one rank
refused on both; DDP with no_sync gradient accumulation and OneCycleLR as on one process; a
mesh larger than comm (torchrun's one-rank MPI.COMM_WORLD) named. Run under mpiexec with 2
ranks; exit 77 on every rank without torch."""
import sys
import warnings

from mpi4py import MPI

comm = MPI.COMM_WORLD
try:
    import torch
    import torch.nn as nn
except Exception as e:  # noqa: BLE001
    if comm.rank == 0:
        print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)

import shardopt  # noqa: E402
from shardopt.torch import Muon  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def check(cond, what):
    if not cond:
        print(f"rank {comm.rank}: FAIL {what}", flush=True)
        comm.Abort(1)


def unfrozen_on_one_rank():
    m = net()
    m[2].weight.requires_grad_(False)
    opt = Muon(m.named_parameters(), comm=comm)
    m[2].weight.requires_grad_(comm.rank == 0)  # unfrozen on rank 0 only
    m(torch.ones(2, 6)).sum().backward()
    before = [p.detach().clone() for p in m.parameters()]
    try:
        opt.step()
        check(False, "a parameter unfrozen on rank 0 was stepped")
    except ValueError as e:
        check(comm.rank == 0 and "2.weight" in str(e) and "requires_grad was False" in str(e),
              f"rank 0's message: {e}")
    except shardopt.Error as e:
        check(comm.rank == 1 and "rank 0" in str(e), f"rank 1's message: {e}")
    check(all(torch.equal(p, b) for p, b in zip(m.parameters(), before)), "written")
    m[2].weight.requires_grad_(False)
    m[2].weight.grad = None
    opt.step()  # both ranks go on
    check(not torch.equal(m[0].weight, before[0]), "the next step moved nothing")
    opt.close()


def refused_on_one_rank():
    """A group's fixed key changed on rank 1 only, then an lr that is no number on rank 0 only:
    that rank raises its ValueError, the other fails naming it (before, the refusing rank raised
    before the step's C call and the other waited in it until comm_timeout_s); nothing written,
    and the next step goes on."""
    m = net()
    opt = Muon(m.named_parameters(), comm=comm)
    m(torch.ones(2, 6)).sum().backward()
    before = [p.detach().clone() for p in m.parameters()]
    g = next(g for g in opt.param_groups if g["algo"] == "muon")
    for bad, key, value, words in ((1, "nesterov", not g["nesterov"], "nesterov changed"),
                                   (0, "lr", "fast", "not text")):
        was = g[key]
        if comm.rank == bad:
            g[key] = value
        try:
            opt.step()
            check(False, f"{key} refused on rank {bad} only: stepped on rank {comm.rank}")
        except ValueError as e:
            check(comm.rank == bad and words in str(e), f"rank {bad}'s message: {e}")
        except shardopt.Error as e:
            check(comm.rank != bad and f"rank {bad}" in str(e), f"rank {comm.rank}'s message: {e}")
        g[key] = was
        check(all(torch.equal(p, b) for p, b in zip(m.parameters(), before)), "written")
    opt.step()  # both ranks go on
    check(not torch.equal(m[0].weight, before[0]), "the next step moved nothing")
    opt.close()


def negative_weight_decay_on_one_rank():
    """A group's weight_decay set to -0.5 on rank 0 only (the library would read it as the
    config's): a ValueError naming it on rank 0 before any group steps, which then fails the
    first group's step on rank 1 too (shardopt.Error naming rank 0) rather than leave rank 1
    waiting in it; nothing written on either, and the next step goes on."""
    m = net()
    opt = Muon(m.named_parameters(), comm=comm, config={"comm_timeout_s": 60})
    g = opt.param_groups[-1]
    wd = g["weight_decay"]
    if comm.rank == 0:
        g["weight_decay"] = -0.5
    m(torch.ones(2, 6)).sum().backward()
    before = [p.detach().clone() for p in m.parameters()]
    try:
        opt.step()
        check(False, "a negative weight_decay on rank 0 was stepped")
    except ValueError as e:
        check(comm.rank == 0 and "weight_decay = -0.5" in str(e), f"rank 0's message: {e}")
    except shardopt.Error as e:
        check(comm.rank == 1 and "rank 0: lr = nan" in str(e), f"rank 1's message: {e}")
    check(all(torch.equal(p, b) for p, b in zip(m.parameters(), before)), "written")
    g["weight_decay"] = wd
    opt.step()  # both ranks go on
    check(not all(torch.equal(p, b) for p, b in zip(m.parameters(), before)), "not stepped")


def warmup_same_bits():
    runs = []
    for c in (comm, None):
        m = net()
        opt = Muon(m.named_parameters(), lr=0.02, comm=c)
        for k in range(3):
            for g in opt.param_groups:
                if g["algo"] == "muon":
                    g["momentum"] = 0.85 + 0.05 * k
            m(torch.randn(4, 6, generator=torch.Generator().manual_seed(k))).sum().backward()
            opt.step()
            opt.zero_grad()
        runs.append([p.detach().clone() for p in m.parameters()])
        opt.close()
    check(all(torch.equal(a, b) for a, b in zip(*runs)), "2 ranks differ from one process")
    mine = torch.cat([p.reshape(-1) for p in runs[0]])
    other = comm.sendrecv(mine, dest=1 - comm.rank, source=1 - comm.rank)
    check(torch.equal(mine, other), "the ranks differ")


def dion_mesh_is_comm():
    """dion's distributed_mesh (a gloo DeviceMesh over the 2 ranks, as prime-rl passes it) with
    comm=COMM_WORLD in the same order: taken, and the ported groups give the bits of one
    process on both ranks. The mesh without comm (the library would run each rank alone), or
    comm with a mesh of this rank alone, is refused on both ranks before anything collective,
    naming distributed_mesh and comm. (A mesh listing the ranks in another order is dion's
    same process group, whose ranks torch numbers in global order: taken, as dion takes it.)"""
    import socket
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=comm.size)
    mesh = DeviceMesh("cpu", [0, 1])
    runs = []
    for c, msh in ((comm, mesh), (None, None)):
        m = net()
        opt = Muon([dict(params=[m[0].weight, m[2].weight], algorithm="muon", lr=0.02,
                         adjust_lr="rms_norm"),
                    dict(params=[m[0].bias, m[1].weight, m[1].bias, m[2].bias],
                         algorithm="adamw", lr=3e-3)],
                   comm=c, distributed_mesh=msh)
        for k in range(2):
            m(torch.randn(4, 6, generator=torch.Generator().manual_seed(k))).sum().backward()
            opt.step()
            opt.zero_grad()
        runs.append([p.detach().clone() for p in m.parameters()])
        opt.close()
    check(all(torch.equal(a, b) for a, b in zip(*runs)), "2 ranks differ from one process")
    for c, msh in ((None, mesh), (comm, DeviceMesh("cpu", [comm.rank]))):
        try:
            Muon([dict(params=list(net().parameters()), algorithm="adamw")], comm=c,
                 distributed_mesh=msh)
            check(False, f"a distributed_mesh other than comm's ranks was taken: {msh}")
        except ValueError as e:
            check("distributed_mesh" in str(e) and "comm" in str(e), f"message: {e}")
    comm.Barrier()  # rank 0 holds the store: no rank may still be making a group
    dist.destroy_process_group()


def gloo_group():
    """torch.distributed over gloo on comm's ranks, at a port rank 0 found free."""
    import socket
    import torch.distributed as dist
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=comm.size)
    return dist


def nan_on_one_rank():
    """A NaN in rank 0's gradient only (the parameters sharded, dp_shard = 2): shardopt.Error
    naming the tensor on both ranks (this class's nonfinite = error; the library decides on
    every rank before writing), nothing written on either, and the next step goes on. Before,
    the Muon group's step was skipped on both and the AdamW group stepped, silently."""
    m = net()
    opt = Muon(m.named_parameters(), lr=0.02, comm=comm, config={"dp_shard": 2})
    m(torch.ones(2, 6)).sum().backward()
    if comm.rank == 0:
        m[2].weight.grad[0, 0] = float("nan")
    before = [p.detach().clone() for p in m.parameters()]
    try:
        opt.step()
        check(False, "a NaN gradient on rank 0 was stepped")
    except shardopt.Error as e:
        check("2.weight" in str(e) and "NaN/Inf" in str(e), f"message: {e}")
    check(all(torch.equal(p, b) for p, b in zip(m.parameters(), before)), "written")
    m[2].weight.grad[0, 0] = 0.0
    opt.step()
    check(not torch.equal(m[0].weight, before[0]), "the next step moved nothing")
    opt.close()


def ddp_accumulation_as_one_process():
    """DDP over gloo (gradient_as_bucket_view=True, as large-model scripts set it) with
    gradient accumulation under no_sync(), OneCycleLR with one max_lr per group and
    zero_grad(set_to_none=True), each rank half of each batch: 4 steps within 1e-6 of the
    whole batches on one process (the averaged gradients' summation order), on both ranks."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist = gloo_group()
    fp32 = {"ns_compute": "fp32", "comm_dtype": "fp32"}

    def build():
        torch.manual_seed(2)
        return nn.Sequential(nn.Embedding(16, 8), nn.Flatten(), nn.Linear(32, 32), nn.GELU(),
                             nn.Linear(32, 16))

    m, ref = build(), build()
    ddp = DDP(m, gradient_as_bucket_view=True)
    runs = []
    for mod, c, net_ in ((ddp, comm, m), (ref, None, ref)):
        opt = Muon(mod.named_parameters(), lr=0.02, adamw_lr=3e-3, comm=c, model=mod,
                   config=fp32)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.02, 3e-3], total_steps=8)
        for k in range(4):
            g = torch.Generator().manual_seed(k)
            x = torch.randint(0, 16, (8, 4), generator=g)
            y = torch.randint(0, 16, (8,), generator=g)
            parts = [(x.chunk(2)[comm.rank], y.chunk(2)[comm.rank])] if c is not None else \
                [(x.chunk(2)[r], y.chunk(2)[r]) for r in range(2)]
            for micro in range(2):
                for xs, ys in parts:
                    xm, ym = xs.chunk(2)[micro], ys.chunk(2)[micro]
                    ctx = ddp.no_sync() if c is not None and micro == 0 else torch.enable_grad()
                    with ctx:
                        loss = nn.functional.cross_entropy(mod(xm), ym) / 2
                        (loss / len(parts)).backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        runs.append([p.detach().clone() for p in net_.parameters()])
        opt.close()
    d = max(((a - b).norm() / b.norm()).item() for a, b in zip(*runs))
    check(d < 1e-6, f"DDP against one process: {d:.2e}")
    comm.Barrier()  # rank 0 holds the store: no rank may still be making a group
    dist.destroy_process_group()


def mesh_larger_than_comm():
    """FSDP2 parameters (DTensors over a 2-rank gloo mesh) with comm of one rank, as
    MPI.COMM_WORLD is in each process torchrun starts: refused on both ranks naming the
    parameter, the two sizes and the way out (mpiexec), where the library's registration said
    only that a shard 'covers less than its extent 16'."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist = gloo_group()
    m = net()
    fully_shard(m, mesh=init_device_mesh("cpu", (2,)))
    try:
        Muon(m.named_parameters(), comm=MPI.COMM_SELF)
        check(False, "a 2-rank mesh over a 1-rank comm was taken")
    except ValueError as e:
        check("0.weight" in str(e) and "over 2 ranks" in str(e) and "comm has 1 rank" in str(e)
              and "mpiexec -n 2" in str(e), f"message: {e}")
    comm.Barrier()  # rank 0 holds the store: no rank may still be making a group
    dist.destroy_process_group()


unfrozen_on_one_rank()
refused_on_one_rank()
negative_weight_decay_on_one_rank()
warmup_same_bits()
dion_mesh_is_comm()
nan_on_one_rank()
ddp_accumulation_as_one_process()
mesh_larger_than_comm()
comm.Barrier()
if comm.rank == 0:
    print("torch_dropin_np2: ok", flush=True)
