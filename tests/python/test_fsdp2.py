"""shardopt.torch_params on FSDP2 (fully_shard over a gloo DeviceMesh, CPU) against the same
model unsharded on one process: three training steps of a small MLP with a norm-like vector,
each rank a half of the batch (FSDP2 averages the gradients), shardopt stepping the DTensor
local shards in place. The gathered parameters must match the one-process run to float
summation order (relative 1e-4; Muon amplifies the last-bit differences of the averaged
gradients a little). Run under mpiexec with 2 ranks; exit 77 on every rank without torch."""
import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
try:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
except Exception as e:  # torch (or its distributed package) missing: skip on every rank
    if comm.rank == 0:
        print(f"SKIP: torch with torch.distributed is not importable ({e})")
    sys.exit(77)

import shardopt

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # fsdp2.sh sets both
os.environ.setdefault("MASTER_PORT", "29531")
dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(12, 20)   # weight [20, 12]: Muon; bias: AdamW
        self.down = torch.nn.Linear(20, 6)  # [6, 20]: rows split 3 + 3 over 2 ranks
        self.norm = torch.nn.Parameter(torch.ones(12))

    def forward(self, x):
        return self.down(torch.relu(self.up(x * self.norm)))


ref = Net()
net = Net()
net.load_state_dict(ref.state_dict())
fully_shard(net, mesh=init_device_mesh("cpu", (comm.size,)))

cfg = {"dp_shard": comm.size, "weight_decay": 0.01}
opt = shardopt.Optimizer(shardopt.torch_params(net.named_parameters()), comm=comm, config=cfg)
ref_opt = shardopt.Optimizer(shardopt.torch_params(ref.named_parameters()), comm=MPI.COMM_SELF,
                             config={"weight_decay": 0.01})
kinds = {p.name: (p.placement, p.shard_dim, p.shard_offset, p.shard_length, opt.algo(p))
         for p in opt.params}
assert kinds["up.weight"][0] == "dense" and kinds["up.weight"][4] == "muon", kinds
assert kinds["up.bias"][4] == "adamw", kinds
assert kinds["down.weight"][2] == 3 * comm.rank and kinds["down.weight"][3] == 3, kinds

start = {k: v.detach().clone() for k, v in ref.state_dict().items()}
g = torch.Generator().manual_seed(1)
for step in range(3):
    x = torch.randn(8, 12, generator=g)
    y = torch.randn(8, 6, generator=g)
    half = slice(4 * comm.rank, 4 * comm.rank + 4)
    torch.nn.functional.mse_loss(net(x[half]), y[half]).backward()
    opt.step(lr=0.02)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step(lr=0.02)
    ref_opt.zero_grad()

worst = 0.0
for (name, p), (_, q) in zip(net.named_parameters(), ref.named_parameters()):
    full = p.full_tensor().detach()
    d = ((full - q.detach()).norm() / q.detach().norm()).item()
    worst = max(worst, d)
    if (q.detach() - start[name]).norm().item() < 1e-3 * start[name].norm().item():
        print(f"rank {comm.rank}: {name} did not move: the test would prove nothing")
        sys.exit(1)
    if d > 1e-4:
        print(f"rank {comm.rank}: {name}: FSDP2 + shardopt differs from one process by {d:.2e}")
        sys.exit(1)
if comm.rank == 0:
    print(f"fsdp2: {len(opt.params)} DTensor parameters on {comm.size} ranks, 3 steps, worst "
          f"relative difference to one process {worst:.2e}")
opt.close()
ref_opt.close()
dist.destroy_process_group()
