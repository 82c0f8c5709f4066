#!/usr/bin/env python3
"""Side by side with PyTorch: the same model shapes and the same gradients through
torch.optim.Muon (matrices, one 2-D parameter per expert) + torch.optim.AdamW (the rest) on the
CPU, and through shardopt (bench/compare_driver, one process, the public C API), in one run.
Reports the median step time of each and their ratio, and the relative Frobenius difference of
the updated weights, per algorithm.

Settings are matched: torch's Muon keeps an EMA momentum (buf = mu*buf + (1-mu)*g) where
shardopt keeps heavy-ball momentum (M = mu*M + g); the two differ by the factor (1 - mu), which
the Frobenius normalisation in Newton-Schulz removes (up to eps). Jordan's coefficients,
Nesterov, 5 steps, lr scale 0.2*sqrt(max(A, B)) (torch: adjust_lr_fn="match_rms_adamw",
shardopt: lr_scale = rms_norm), decoupled weight decay with the unscaled lr on both (none on 1-D tensors); AdamW with
betas (0.9, 0.95), eps 1e-8. Both orthogonalize in bf16 (torch always; shardopt with
ns_compute = auto on a CPU with native bf16, else fp32: the driver's output says which).

  python3 bench/compare_torch.py --driver build/bench/compare_driver [--preset glm45-air]
      [--layers 1] [--width-div 8] [--experts-div 4] [--steps 5] [--threads N]
      [--ns-algorithm standard|gram|auto] [--json]

--ns-algorithm is shardopt's (docs/config.md): gram is the same polynomial as torch's standard
Newton-Schulz in exact arithmetic, so the settings stay matched.

Uses torch.optim.Muon (torch >= 2.9); with an older torch, the same algorithm written in torch
ops (FallbackMuon, the torch 2.9 formulation), and says which. Needs numpy and torch; says so
plainly and exits 0 without them (it is a benchmark, not a test)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def fallback_muon(torch):
    """torch.optim.Muon's update for torches that lack it: EMA momentum, Nesterov by lerp, bf16
    Newton-Schulz with Jordan's coefficients, lr * 0.2 * sqrt(max(A, B)), decoupled decay."""

    class FallbackMuon(torch.optim.Optimizer):
        def __init__(self, params, lr, weight_decay, momentum, nesterov, ns_steps, adjust_lr_fn):
            super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                          nesterov=nesterov, ns_steps=ns_steps))

        @torch.no_grad()
        def step(self):
            a, b, c = 3.4445, -4.775, 2.0315
            for g in self.param_groups:
                for p in g["params"]:
                    st = self.state[p]
                    buf = st.setdefault("buf", torch.zeros_like(p))
                    buf.lerp_(p.grad, 1 - g["momentum"])
                    u = p.grad.lerp(buf, g["momentum"]) if g["nesterov"] else buf
                    x = u.to(torch.bfloat16)
                    x = x.T if x.shape[0] > x.shape[1] else x
                    x = x / x.norm().clamp(min=1e-7)
                    for _ in range(g["ns_steps"]):
                        A = x @ x.T
                        B = torch.addmm(A, A, A, beta=b, alpha=c)
                        x = torch.addmm(x, B, x, beta=a, alpha=1.0)
                    x = x.T if u.shape[0] > u.shape[1] else x
                    lr = g["lr"] * 0.2 * max(p.shape[0], p.shape[1]) ** 0.5
                    p.mul_(1 - g["lr"] * g["weight_decay"])
                    p.add_(x.to(p.dtype), alpha=-lr)

    return FallbackMuon


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--preset", default="glm45-air")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--width-div", type=int, default=8)
    ap.add_argument("--experts-div", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--ns-algorithm", choices=["standard", "gram", "auto"], default="standard")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"compare_torch: skipped: {e} (pip install torch numpy)")
        return 0
    muon_cls = getattr(torch.optim, "Muon", None)
    muon_name = "torch.optim.Muon"
    if muon_cls is None:
        muon_cls, muon_name = fallback_muon(torch), "Muon in torch ops (no torch.optim.Muon)"
    if a.threads > 0:
        torch.set_num_threads(a.threads)

    with tempfile.TemporaryDirectory(prefix="shardopt_compare_") as d:
        man = os.path.join(d, "manifest.json")
        subprocess.run([a.driver, "manifest", "--preset", a.preset, "--layers", str(a.layers),
                        "--width-div", str(a.width_div), "--experts-div", str(a.experts_div),
                        man], check=True)
        m = json.load(open(man))
        m.update(steps=a.steps, lr=a.lr, weight_decay=a.weight_decay)
        json.dump(m, open(man, "w"))
        rng = np.random.default_rng(1234)
        params = [(0.05 * rng.standard_normal(t["shape"])).astype(np.float32) for t in m["tensors"]]
        np.concatenate([p.ravel() for p in params]).tofile(os.path.join(d, "params.bin"))
        grads = []
        for s in range(a.steps):
            g = [rng.standard_normal(t["shape"]).astype(np.float32) for t in m["tensors"]]
            np.concatenate([x.ravel() for x in g]).tofile(os.path.join(d, f"grads_{s}.bin"))
            grads.append(g)

        # torch: experts as one 2-D parameter each (torch.optim.Muon takes matrices only)
        muon_p, adam_p, views = [], [], []
        for t, p in zip(m["tensors"], params):
            if t["algo"] == "muon":
                mats = [torch.tensor(p[e]) for e in range(p.shape[0])] if p.ndim == 3 else [torch.tensor(p)]
                muon_p += mats
                views.append(("muon", mats))
            else:
                x = torch.tensor(p)
                adam_p.append(x)
                views.append(("adamw", [x]))
        opts = [muon_cls(muon_p, lr=a.lr, weight_decay=a.weight_decay, momentum=0.95,
                                 nesterov=True, ns_steps=5, adjust_lr_fn="match_rms_adamw")]
        if adam_p:
            # shardopt's default (weight_decay_1d = 0): no decay on 1-D tensors (norms, biases),
            # the usual param-group convention
            groups = [{"params": [x for x in adam_p if x.ndim > 1], "weight_decay": a.weight_decay},
                      {"params": [x for x in adam_p if x.ndim <= 1], "weight_decay": 0.0}]
            opts.append(torch.optim.AdamW([g for g in groups if g["params"]], lr=a.lr,
                                          betas=(0.9, 0.95), eps=1e-8))
        times = []
        for s in range(a.steps):
            for (kind, mats), g in zip(views, grads[s]):
                for i, x in enumerate(mats):
                    x.grad = torch.tensor(g[i] if g.ndim == 3 and kind == "muon" else g)
            t0 = time.perf_counter()
            for o in opts:
                o.step()
            times.append(time.perf_counter() - t0)
        torch_step = sorted(times)[len(times) // 2]

        out = subprocess.run([a.driver, "run", d, "--ns-algorithm", a.ns_algorithm] +
                             (["--threads", str(a.threads)] if a.threads else []),
                             check=True, capture_output=True, text=True).stdout
        drv = json.loads(out.strip().splitlines()[-1])
        ours = np.fromfile(os.path.join(d, "shardopt_params.bin"), dtype=np.float32)

        diff = {"muon": [0.0, 0.0], "adamw": [0.0, 0.0]}
        off = 0
        for t, (kind, mats), p0 in zip(m["tensors"], views, params):
            n = p0.size
            mine = ours[off:off + n].reshape(p0.shape)
            off += n
            theirs = np.stack([x.detach().numpy() for x in mats]) if (kind == "muon" and p0.ndim == 3) else mats[0].detach().numpy()
            # the updates, not the weights: the weights barely move in a few steps
            du, dt = mine - p0, theirs - p0
            diff[kind][0] += float(((du - dt) ** 2).sum())
            diff[kind][1] += float((dt ** 2).sum())
        rel = {k: (v[0] / v[1]) ** 0.5 if v[1] > 0 else 0.0 for k, v in diff.items()}
        res = {"preset": m["preset"], "tensors": len(m["tensors"]),
               "parameters": int(sum(p.size for p in params)), "steps": a.steps,
               "torch_version": torch.__version__, "torch_muon": muon_name,
               "torch_threads": torch.get_num_threads(),
               "torch_step_s": torch_step, "shardopt_step_s": drv["median_step_s"],
               "speedup": torch_step / drv["median_step_s"], "shardopt_ns_compute": drv["ns_compute"],
               "shardopt_ns_algorithm": a.ns_algorithm,
               "shardopt_kernels": drv["kernels"], "rel_frobenius_update_muon": rel["muon"],
               "rel_frobenius_update_adamw": rel["adamw"]}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"compare_torch: {res['preset']} ({res['parameters'] / 1e6:.1f} M parameters, "
              f"{res['tensors']} tensors), {a.steps} steps, medians\n\n"
              "| | step time | ratio | update rel. Frobenius vs torch (Muon / AdamW) |\n|---|---|---|---|\n"
              f"| torch {res['torch_version']} ({muon_name} + AdamW, {res['torch_threads']} threads) | "
              f"{torch_step:.3f} s | 1 | |\n"
              f"| shardopt ({res['shardopt_kernels']}, NS {res['shardopt_ns_compute']}, "
              f"ns_algorithm {a.ns_algorithm}) | "
              f"{res['shardopt_step_s']:.3f} s | {res['speedup']:.2f}x faster | "
              f"{rel['muon']:.2e} / {rel['adamw']:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
