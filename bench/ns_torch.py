"""PyTorch's bf16 Newton-Schulz, the peer ns_bench --torch measures against.

The iteration as torch.optim.Muon and dion write it: X = G.bfloat16() / (norm + eps), then per
step A = X @ X.T; B = b * A + c * A @ A; X = a * X + B @ X, every op in bf16 (PyTorch's CPU
matmul in bf16 is oneDNN's). Same quintic coefficients, same 4m^2n + 2m^3 work per step.
Prints the median seconds per call; prints nothing (exit 3) when torch is missing.
"""
import argparse
import statistics
import sys
import time

QUINTIC = [
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
]


def newton_schulz(g, eps=1e-8):
    x = g.bfloat16()
    x = x / (x.norm() + eps)
    for a, b, c in QUINTIC:
        A = x @ x.T
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-sample", type=float, default=0.05)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit(3)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    g = torch.rand(args.m, args.n, generator=gen) * 2 - 1
    t0 = time.perf_counter()
    newton_schulz(g)  # warm-up; also sizes a sample to at least --min-sample seconds
    one = time.perf_counter() - t0
    calls = 1 if one >= args.min_sample else int(args.min_sample / max(one, 1e-6)) + 1
    samples = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            newton_schulz(g)
        samples.append((time.perf_counter() - t0) / calls)
    print(f"{statistics.median(samples):.9f}")


if __name__ == "__main__":
    main()
