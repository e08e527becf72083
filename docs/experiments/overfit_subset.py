#!/usr/bin/env python3
"""overfit_subset.py: docs/EXPERIMENTS.md section 10, the overfitting regime.

Section 10's question where the standalone trainer does overfit: the same
MLP (fc:256 relu fc:256 relu fc:10 softmax, 269,322 floats) on the first
6,000 Fashion-MNIST training samples only (--train-samples, the same subset
in every mode), 20 epochs of them, batch 64 per worker, plain SGD at a
constant lr, compute times exponential (mean 10 ms), in `downpour sim`:
standalone (1 worker) against async with 4 and 16 workers, each at two lrs,
seeds 1-5, two runs at a time. The whole test set scores each run. One JSON
line per cell: test accuracy, test loss, the train loss (the simulator's
smoothed loss of the last pushes, on the subset) and the gap test loss -
train loss, mean and sd over the seeds.

usage: docs/experiments/overfit_subset.py [DOWNPOUR] [SAMPLES] [EPOCHS]
       (defaults build/downpour 6000 20)
"""
import json
import statistics as st
import sys
from concurrent.futures import ThreadPoolExecutor

from overfit import cell_row, run  # a run and a cell's figures, as in overfit.py's table

D = sys.argv[1] if len(sys.argv) > 1 else "build/downpour"
SAMPLES = sys.argv[2] if len(sys.argv) > 2 else "6000"
EPOCHS = sys.argv[3] if len(sys.argv) > 3 else "20"
BASE = ["sim", "--compute", "exp:10", "--model", "fc:256 relu fc:256 relu fc:10 softmax",
        "--optimizer", "sgd", "--lr-schedule", "constant", "--batch", "64", "--epochs", EPOCHS,
        "--train-samples", SAMPLES, "--threads", "1", "--json", "--eval-every", "0"]
# lrs: a first grid at 15 epochs (standalone 0.05, 0.1; async 4 0.02, 0.05; async 16
# 0.01, 0.02) found the upper lr better in every row: these are one step up
CELLS = [("async", 1, [0.1, 0.2]), ("async", 4, [0.05, 0.1]), ("async", 16, [0.02, 0.05])]
SEEDS = (1, 2, 3, 4, 5)


jobs = [(m, w, lr, s) for m, w, lrs in CELLS for lr in lrs for s in SEEDS]
with ThreadPoolExecutor(max_workers=2) as pool:
    results = dict(zip(jobs, pool.map(lambda job: run(D, BASE, *job), jobs)))
for mode, workers, lrs in CELLS:
    for lr in lrs:
        rs = [results[(mode, workers, lr, s)] for s in SEEDS]
        row, ok = cell_row(mode, workers, lr, rs, train_samples=int(SAMPLES), epochs=int(EPOCHS))
        if len(ok) >= 2:
            row["staleness_mean"] = round(st.mean(r["staleness_mean"] for r in ok), 2)
            row["updates"] = ok[0]["updates"]
        print(json.dumps(row), flush=True)
