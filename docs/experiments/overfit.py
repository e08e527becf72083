#!/usr/bin/env python3
"""overfit.py: docs/EXPERIMENTS.md section 4's question taken further.

Does the noise of asynchronous updates improve the final result once the
standalone trainer overfits? An MLP with two hidden layers (fc:256 relu
fc:256 relu fc:10 softmax, 269,322 floats) on Fashion-MNIST in `downpour
sim`, 5 epochs of data, batch 64 per worker, plain SGD at a constant lr,
compute times exponential (mean 10 ms): standalone (1 worker), sync and
async with 4 and 16 workers, each at two lrs, seeds 1-5. One JSON line per
cell: test accuracy, test loss, the train loss (the simulator's smoothed
loss of the last pushes) and the gap test loss - train loss, mean and sd.

usage: docs/experiments/overfit.py [DOWNPOUR]   (default build/downpour)
"""
import json
import statistics as st
import subprocess
import sys

D = sys.argv[1] if len(sys.argv) > 1 else "build/downpour"
BASE = ["sim", "--compute", "exp:10", "--model", "fc:256 relu fc:256 relu fc:10 softmax",
        "--optimizer", "sgd", "--lr-schedule", "constant", "--batch", "64", "--epochs", "5",
        "--json", "--eval-every", "0"]
CELLS = [("async", 1, [0.05, 0.1]), ("sync", 4, [0.1, 0.3]), ("async", 4, [0.02, 0.05]),
         ("sync", 16, [0.3, 1.0]), ("async", 16, [0.01, 0.02])]


def run(mode, workers, lr, seed):
    args = [D, *BASE, "--mode", mode, "--workers", str(workers), "--lr", str(lr), "--seed", str(seed)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


for mode, workers, lrs in CELLS:
    for lr in lrs:
        rs = [run(mode, workers, lr, s) for s in (1, 2, 3, 4, 5)]
        row = {"mode": "standalone" if workers == 1 else mode, "workers": workers, "lr": lr}
        ok = [r for r in rs if r is not None]
        row["diverged"] = len(rs) - len(ok)
        if len(ok) >= 2:
            for k in ("test_accuracy", "test_loss", "train_loss"):
                v = [r[k] for r in ok]
                row[k] = [round(st.mean(v), 4), round(st.stdev(v), 4)]
            gap = [r["test_loss"] - r["train_loss"] for r in ok]
            row["gap"] = [round(st.mean(gap), 4), round(st.stdev(gap), 4)]
        print(json.dumps(row), flush=True)
