#!/usr/bin/env python3
"""dcasgd.py: docs/EXPERIMENTS.md section 7 (DC-ASGD, Zheng et al. 2017).

A small CNN (conv5x5:16 relu maxpool2 fc:128 relu fc:10 softmax) on
Fashion-MNIST in `downpour sim`: sequential SGD (one worker) against ASGD
and DC-ASGD (const:0.04, adaptive:2) with 4, 8 and 16 async workers,
exponential compute times (mean 100 ms), 2 epochs of data, batch 32, plain
SGD at a constant lr 0.05 for all, seeds 1-3. One JSON line per cell: test
error and staleness, mean and sd over the seeds.

usage: docs/experiments/dcasgd.py [DOWNPOUR]   (default build/downpour)
"""
import json
import statistics as st
import subprocess
import sys

D = sys.argv[1] if len(sys.argv) > 1 else "build/downpour"
BASE = ["sim", "--mode", "async", "--compute", "exp:100",
        "--model", "conv5x5:16 relu maxpool2 fc:128 relu fc:10 softmax",
        "--optimizer", "sgd", "--lr", "0.05", "--lr-schedule", "constant", "--batch", "32",
        "--epochs", "2", "--json", "--eval-every", "0"]


def run(workers, dc, seed):
    args = [D, *BASE, "--workers", str(workers), "--delay-compensation", dc, "--seed", str(seed)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


cells = [(1, "off")] + [(m, dc) for m in (4, 8, 16) for dc in ("off", "const:0.04", "adaptive:2")]
for workers, dc in cells:
    rs = [run(workers, dc, s) for s in (1, 2, 3)]
    row = {"workers": workers, "delay_compensation": dc}
    if any(r is None for r in rs):
        row["failed"] = sum(r is None for r in rs)
    else:
        err = [1 - r["test_accuracy"] for r in rs]
        row["test_error"] = [round(st.mean(err), 4), round(st.stdev(err), 4)]
        row["staleness_mean"] = round(st.mean(r["staleness_mean"] for r in rs), 2)
        row["dc_compensated"] = rs[0].get("dc_compensated", 0)
    print(json.dumps(row), flush=True)
