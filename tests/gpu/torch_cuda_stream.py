"""The torch CUDA stream path on a GPU: shardopt.torch.Muon with backend = cuda on CUDA tensors,
its step queued on torch's current stream (the default one, then a side torch.cuda.Stream the
caller switched to), against the same model stepped by the CPU backend on CPU tensors.

    SHARDOPT_LIBRARY=libshardopt.so PYTHONPATH=python python3 tests/gpu/torch_cuda_stream.py

Checks: the side stream's run is the default stream's (relative Frobenius difference of the
parameters at most 1e-6: a step queued on the wrong stream would race the backward pass that
wrote the gradients), and both are near the CPU run (the change of every parameter within 5e-2
relative: ns_compute = auto is bf16 on the device, fp32 on the CPU). Prints the numbers. Exit 77
without torch or without a CUDA device; tests/gpu/device_check.sh runs it (step torch_cuda), no
CTest does (CI has no GPU). --cpu-only: the CPU run alone (checks this script where no GPU is).
"""
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means: no torch here
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)

from shardopt.torch import Muon

STEPS = 3


def run(dev, backend, side_stream):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    m = m.to(dev)
    start = [p.detach().cpu().clone() for p in m.parameters()]
    opt = Muon(m.named_parameters(), lr=0.02, model=m, config={"backend": backend})
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 64, generator=g).to(dev), torch.randn(16, 32, generator=g).to(dev)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        if side_stream:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # the step goes on s, torch's current stream now
                opt.step()
            torch.cuda.current_stream().wait_stream(s)
        else:
            opt.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    return start, [p.detach().cpu().clone() for p in m.parameters()]


def rel(a, b):
    return float(torch.linalg.vector_norm(a - b) / max(float(torch.linalg.vector_norm(b)), 1e-30))


def main():
    start, cpu = run("cpu", "cpu", False)
    if "--cpu-only" in sys.argv[1:]:
        print(f"torch_cuda_stream: CPU run: {len(cpu)} tensors, {STEPS} steps (--cpu-only)")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return 77
    _, dflt = run("cuda", "cuda", False)
    _, side = run("cuda", "cuda", True)
    fails = 0
    for i, (s0, c, d, s) in enumerate(zip(start, cpu, dflt, side)):
        streams, devcpu = rel(s, d), rel(d - s0, c - s0)
        ok = streams <= 1e-6 and devcpu <= 5e-2
        fails += not ok
        print(f"  tensor {i} {tuple(c.shape)}: side stream vs default {streams:.2e}, "
              f"device change vs CPU change {devcpu:.2e}{'' if ok else '  FAIL'}")
    print(f"torch_cuda_stream: {'ok' if not fails else f'{fails} tensors FAIL'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
