#!/usr/bin/env python3
"""Plots for docs/scaling.md from shardopt-plan sweeps (and, with --validate, from
bench/validate_plan.sh's measured vs predicted steps on this machine).

  python3 bench/plot_scaling.py [--build build] [--out docs/img] [--validate]

Writes scaling_step.png (predicted step time per rank against node count, one line per layout)
and scaling_state.png (optimizer state per rank), and with --validate validate.png. Needs
matplotlib (pip install matplotlib); not part of CI."""
import argparse
import json
import os
import re
import subprocess
import sys

LAYOUTS = [
    ("GLM-4.5-Air, ep 8, experts whole", ["--preset", "glm45-air", "--ep", "8"]),
    ("GLM-4.5-Air, ep 8, experts along dim 1",
     ["--preset", "glm45-air", "--ep", "8", "--expert-shard-dim", "1"]),
    ("GLM-4.5-Air, ep 8, bf16 momentum, offload optimizer",
     ["--preset", "glm45-air", "--ep", "8", "--momentum-dtype", "bf16", "--offload", "optimizer"]),
    ("Qwen3-30B-A3B, ep 8", ["--preset", "qwen3-30b-a3b", "--ep", "8"]),
]
NODES = [1, 2, 4, 8, 16, 32, 64, 128, 512, 2048]  # 8 to 16,384 GPUs, as the tables


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--validate", action="store_true")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_scaling: skipped: matplotlib is not installed (pip install matplotlib)")
        return 0
    os.makedirs(a.out, exist_ok=True)
    plan = os.path.join(a.build, "bench", "shardopt-plan")
    series = []
    for label, args in LAYOUTS:
        nodes = [n for n in NODES if n * 8 >= 8]
        out = subprocess.run([plan, *args, "--sweep", ",".join(map(str, nodes)), "--json"],
                             check=True, capture_output=True, text=True).stdout
        rows = json.loads(out)["layouts"]
        series.append((label, [r["world"] // 8 for r in rows], rows))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, nodes, rows in series:
        ax.plot(nodes, [r["step"] * 1e3 for r in rows], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="nodes (8 x H200)", ylabel="predicted step (ms)",
           title="shardopt-plan: predicted optimizer step (h200.json rates)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "scaling_step.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, nodes, rows in series:
        ax.plot(nodes, [r["state_bytes"] / 2**30 for r in rows], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="nodes (8 x H200)",
           ylabel="optimizer state per rank (GiB, max)", title="shardopt-plan: state per rank")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "scaling_state.png"), dpi=110)

    if a.validate:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run([os.path.join(here, "validate_plan.sh"), a.build], check=False,
                             capture_output=True, text=True).stdout
        pts = re.findall(r"\| (\S+) \| (\d+) \| ([0-9.]+) ms \| ([0-9.]+) ms \|", out)
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for preset in sorted({p for p, *_ in pts}):
            xs = [float(m) for p, _, m, _ in pts if p == preset]
            ys = [float(q) for p, _, _, q in pts if p == preset]
            ax.scatter(xs, ys, label=preset)
            for (p, n, m, q) in pts:
                if p == preset:
                    ax.annotate(f"{n} rk", (float(m), float(q)), fontsize=7)
        lim = [0, max(float(v) for *_, m, q in pts for v in (m, q)) * 1.3]
        ax.plot(lim, lim, "k-", lw=0.8)
        ax.plot(lim, [v * 1.25 for v in lim], "k:", lw=0.6)
        ax.plot(lim, [v * 0.75 for v in lim], "k:", lw=0.6)
        ax.set(xlabel="measured step (ms)", ylabel="predicted step (ms)", xlim=lim, ylim=lim,
               title="calibrated shardopt-plan vs shardopt-bench (this machine)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "validate.png"), dpi=110)
        print(out)
    print(f"plot_scaling: wrote {a.out}/scaling_step.png, scaling_state.png"
          + (", validate.png" if a.validate else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
