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

BASE = ["sim", "--compute", "exp:10", "--model", "fc:256 relu fc:256 relu fc:10 softmax",
        "--optimizer", "sgd", "--lr-schedule", "constant", "--batch", "64", "--epochs", "5",
        "--json", "--eval-every", "0"]
CELLS = [("async", 1, [0.05, 0.1]), ("sync", 4, [0.1, 0.3]), ("async", 4, [0.02, 0.05]),
         ("sync", 16, [0.3, 1.0]), ("async", 16, [0.01, 0.02])]


def run(downpour, base, mode, workers, lr, seed):
    """One `downpour sim` run, the flags base and this cell's: its summary, None where it failed."""
    args = [downpour, *base, "--mode", mode, "--workers", str(workers), "--lr", str(lr), "--seed", str(seed)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def cell_row(mode, workers, lr, rs, **extra):
    """A cell's JSON line from its seeds' runs rs (None: failed) and the runs that finished.

    mode, workers, lr and extra's keys first, then how many diverged and,
    where two runs or more finished, the mean and sd of their test accuracy,
    test loss, train loss and gap (test loss - train loss)."""
    row = {"mode": "standalone" if workers == 1 else mode, "workers": workers, "lr": lr, **extra}
    ok = [r for r in rs if r is not None]
    row["diverged"] = len(rs) - len(ok)
    if len(ok) >= 2:
        for k in ("test_accuracy", "test_loss", "train_loss"):
            v = [r[k] for r in ok]
            row[k] = [round(st.mean(v), 4), round(st.stdev(v), 4)]
        gap = [r["test_loss"] - r["train_loss"] for r in ok]
        row["gap"] = [round(st.mean(gap), 4), round(st.stdev(gap), 4)]
    return row, ok


if __name__ == "__main__":
    D = sys.argv[1] if len(sys.argv) > 1 else "build/downpour"
    for mode, workers, lrs in CELLS:
        for lr in lrs:
            rs = [run(D, BASE, mode, workers, lr, s) for s in (1, 2, 3, 4, 5)]
            print(json.dumps(cell_row(mode, workers, lr, rs)[0]), flush=True)
