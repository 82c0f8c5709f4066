"""shardopt.torch.Muon under FSDP2 with torch.distributed.checkpoint: save on 2 ranks, load on 1.

    mpiexec -n 2 test_torch_dcp.py save DIR    FSDP2 (gloo, CPU), 2 steps, dcp.save of the model
                                               and optimizer state, 2 more steps: DIR/ref.pt
    test_torch_dcp.py load DIR                 one process, no FSDP, no mpi4py: dcp.load into a
                                               fresh model and Muon, the same 2 steps, against
                                               DIR/ref.pt
    mpiexec -n 4 test_torch_dcp.py load4 DIR   the same under FSDP2 on 4 ranks (uneven: the
                                               6 rows of down.weight are 2, 2, 2, 0)

The optimizer state's tensors are DTensors sharded like their parameters, so DCP reshards
them; the resumed steps must match the 2-rank run to float summation order (relative 1e-4: the
averaged gradients' order differs, as in test_fsdp2.py). Exit 77 where torch is missing."""
import os
import sys

mode, d = sys.argv[1], sys.argv[2]
comm = None
if mode in ("save", "load4"):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
try:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
except Exception as e:  # noqa: BLE001 - torch or its distributed package missing: skip
    if comm is None or comm.rank == 0:
        print(f"SKIP: torch with torch.distributed is not importable ({e})")
    sys.exit(77)

from shardopt.torch import Muon

torch.set_num_threads(1)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 12)  # AdamW (model=)
        self.norm = torch.nn.LayerNorm(12)     # AdamW (1-D)
        self.up = torch.nn.Linear(12, 20)      # Muon, rows 10 + 10 over 2 ranks
        self.down = torch.nn.Linear(20, 6)     # Muon, rows 3 + 3

    def forward(self, idx):
        return self.down(torch.relu(self.up(self.norm(self.emb(idx)))))


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 16, (8,), generator=g), torch.randn(8, 6, generator=g)


def train(net, opt, steps, part=slice(None)):
    for step in steps:
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x[part]), y[part]).backward()
        opt.step()


torch.manual_seed(0)
net = Net()
cfg = {"momentum_dtype": "bf16"}  # the state keeps its dtype through DCP too
def sharded(n):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
    fully_shard(net, mesh=init_device_mesh("cpu", (comm.size,)))
    opt = Muon(net.named_parameters(), lr=0.02, adamw_lr=3e-3, model=net, comm=comm,
               config=dict(cfg, dp_shard=comm.size))
    k = 8 // comm.size
    return opt, slice(k * comm.rank, k * comm.rank + k)


def check(ref, params, where):
    worst = 0.0
    for n, p in params:
        rel = ((p - ref[n]).norm() / ref[n].norm()).item()
        worst = max(worst, rel)
        if rel > 1e-4:
            print(f"{n}: loaded on {where} differs from the 2-rank run by {rel:.2e}")
            sys.exit(1)
    return worst


if mode == "save":
    opt, part = sharded(comm.size)
    train(net, opt, range(2), part)
    sd = opt.state_dict()
    mom = [v["momentum"] for v in sd["state"].values() if "momentum" in v]
    assert all(type(t).__name__ == "DTensor" and t.dtype == torch.bfloat16 for t in mom), mom
    dcp.save({"model": net.state_dict(), "optim": sd}, checkpoint_id=os.path.join(d, "ck"))
    train(net, opt, range(2, 4), part)
    full = {n: p.full_tensor().detach() for n, p in net.named_parameters()}
    if comm.rank == 0:
        torch.save(full, os.path.join(d, "ref.pt"))
        print(f"dcp: saved on {comm.size} ranks")
    opt.close()
    dist.destroy_process_group()
elif mode == "load4":
    opt, part = sharded(comm.size)
    sd = {"model": net.state_dict(), "optim": opt.state_dict()}
    dcp.load(sd, checkpoint_id=os.path.join(d, "ck"))
    net.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    train(net, opt, range(2, 4), part)
    ref = torch.load(os.path.join(d, "ref.pt"))
    worst = check(ref, [(n, p.full_tensor().detach()) for n, p in net.named_parameters()],
                  f"{comm.size} ranks")
    worst = comm.allreduce(worst, op=__import__("mpi4py").MPI.MAX)
    if comm.rank == 0:
        print(f"dcp: loaded on {comm.size} ranks, 2 more steps within {worst:.2e} of the 2-rank "
              "run")
    opt.close()
    dist.destroy_process_group()
else:
    sys.modules["mpi4py"] = None  # one process needs no MPI from Python
    opt = Muon(net.named_parameters(), lr=0.02, adamw_lr=3e-3, model=net, config=cfg)
    sd = {"model": net.state_dict(), "optim": opt.state_dict()}
    dcp.load(sd, checkpoint_id=os.path.join(d, "ck"))
    net.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    st = opt.state_dict()["state"]
    assert all(s["step"].item() == 2 for s in st.values()), st
    assert {s["momentum"].dtype for s in st.values() if "momentum" in s} == {torch.bfloat16}
    train(net, opt, range(2, 4))
    ref = torch.load(os.path.join(d, "ref.pt"))
    worst = check(ref, [(n, p.detach()) for n, p in net.named_parameters()], "1 rank")
    opt.close()
    # without the optimizer state the same steps go elsewhere: the state is what matched
    torch.manual_seed(0)
    bare = Net()
    bare.load_state_dict(sd["model"])
    o2 = Muon(bare.named_parameters(), lr=0.02, adamw_lr=3e-3, model=bare, config=cfg)
    train(bare, o2, range(2, 4))
    apart = max(((p.detach() - ref[n]).norm() / ref[n].norm()).item()
                for n, p in bare.named_parameters())
    assert apart > 10 * max(worst, 1e-5), (apart, worst)
    o2.close()
    print(f"dcp: loaded on 1 rank, 2 more steps within {worst:.2e} of the 2-rank run "
          f"({apart:.2e} without the optimizer state)")
