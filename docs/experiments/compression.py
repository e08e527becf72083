#!/usr/bin/env python3
"""compression.py: docs/EXPERIMENTS.md section 8 (compression with error feedback).

The MLP of sections 1-2 (fc:128 relu fc:10 softmax, 101,770 floats) on
Fashion-MNIST in `downpour sim`: 4 workers, exponential compute times (mean
10 ms), 2 epochs of data, batch 64, plain SGD at a constant lr (0.05, and
0.2 for sign, whose scaled sign moves each entry by the slice's mean |g|),
sync and async; --compress none, topk:0.01 and sign, each with
--error-feedback on and off; seeds 1-3. One JSON line per cell: test
accuracy (mean, sd) and the bytes worker 0 pushed (the chief's
bytes_pushed; every worker pushes as much).

usage: docs/experiments/compression.py [DOWNPOUR]   (default build/downpour)
"""
import json
import statistics as st
import subprocess
import sys

D = sys.argv[1] if len(sys.argv) > 1 else "build/downpour"
BASE = ["sim", "--workers", "4", "--compute", "exp:10", "--model", "fc:128 relu fc:10 softmax",
        "--optimizer", "sgd", "--lr-schedule", "constant", "--batch", "64", "--epochs", "2",
        "--json", "--eval-every", "0"]


def run(mode, compress, ef, lr, seed):
    args = [D, *BASE, "--mode", mode, "--compress", compress, "--error-feedback", ef,
            "--lr", str(lr), "--seed", str(seed)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


CELLS = [("none", "off", 0.05), ("topk:0.01", "off", 0.05), ("topk:0.01", "on", 0.05),
         ("sign", "off", 0.05), ("sign", "on", 0.05), ("sign", "off", 0.2), ("sign", "on", 0.2)]
for mode in ("sync", "async"):
    for compress, ef, lr in CELLS:
        rs = [run(mode, compress, ef, lr, s) for s in (1, 2, 3)]
        row = {"mode": mode, "compress": compress, "error_feedback": ef, "lr": lr}
        if any(r is None for r in rs):
            row["failed"] = sum(r is None for r in rs)
        else:
            v = [r["test_accuracy"] for r in rs]
            row["test_accuracy"] = [round(st.mean(v), 4), round(st.stdev(v), 4)]
            row["mb_pushed_worker0"] = round(rs[0]["bytes_pushed"] / 1e6, 2)
        print(json.dumps(row), flush=True)
