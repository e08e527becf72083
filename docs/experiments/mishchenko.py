#!/usr/bin/env python3
"""mishchenko.py: docs/EXPERIMENTS.md section 5 (Mishchenko et al. 2022).

Multinomial logistic regression (fc:10 softmax) on Fashion-MNIST in
`downpour sim`: 40 workers with exponential compute times (mean 10 ms)
times a factor 1 + i/13 for worker i < 39 (1 to 3.9) and 100 for worker
39; plain SGD, batch 64, constant lr. Minibatch SGD (sync: each step
waits for all 40) against async with a fixed lr and async with
--delay-lr adaptive, each over an lr grid, seeds 1, 2, 3; one JSON line
per (mode, rule, lr) with the mean and sd over the seeds.

usage: docs/experiments/mishchenko.py [DOWNPOUR]   (default build/downpour)
"""
import json
import statistics as st
import subprocess
import sys

D = sys.argv[1] if len(sys.argv) > 1 else "build/downpour"
STRAG = [a for i in range(39) for a in ("--straggler", f"{i}:{1 + i / 13}")] + ["--straggler", "39:100"]
BASE = ["sim", "--workers", "40", "--compute", "exp:10", *STRAG, "--model", "fc:10 softmax",
        "--optimizer", "sgd", "--lr-schedule", "constant", "--batch", "64", "--json", "--eval-every", "0"]
# (mode, rule, lrs, updates): the time budget (~15 simulated s: 10 sync
# steps, 27000 async pushes), then the gradient budget (4000 gradients).
GRID = [
    ("sync", "none", [0.03, 0.1, 0.3, 1, 3], 10),
    ("async", "none", [0.003, 0.01, 0.03, 0.1], 27000),
    ("async", "adaptive", [0.003, 0.01, 0.03, 0.1], 27000),
    ("sync", "none", [0.1, 0.3], 100),
    ("async", "none", [0.01, 0.03], 4000),
    ("async", "adaptive", [0.01, 0.03], 4000),
]
KEYS = ["train_loss", "test_accuracy", "sim_s", "staleness_mean", "staleness_max"]


def run(mode, rule, lr, seed, updates):
    args = [D, *BASE, "--mode", mode, "--delay-lr", rule, "--lr", str(lr), "--seed", str(seed),
            "--updates", str(updates)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


for mode, rule, lrs, updates in GRID:
    for lr in lrs:
        rs = [run(mode, rule, lr, s, updates) for s in (1, 2, 3)]
        row = {"mode": mode, "delay_lr": rule, "lr": lr, "updates": updates}
        if any(r is None for r in rs):
            row["diverged"] = sum(r is None for r in rs)
        else:
            for k in KEYS:
                v = [r[k] for r in rs]
                row[k] = [round(st.mean(v), 5), round(st.stdev(v), 5)]
            row["slow_worker_staleness"] = [r["staleness_mean_per_worker"][39] for r in rs]
        print(json.dumps(row), flush=True)
