#!/usr/bin/env python3
"""local_steps.py: docs/EXPERIMENTS.md section 6 (local SGD and DiLoCo).

A small MLP (fc:128 relu fc:10 softmax, 101,770 floats: 407 KB a push) on
Fashion-MNIST in `downpour sim`: 8 workers, exponential compute times (mean
10 ms a step), 2 epochs of data, batch 64, inner SGD at a constant lr 0.05.
--local-steps H in 1, 4, 16, 64 with the outer optimizer sgd (averaging,
lr 1; in async also lr 1/8, see below), nesterov (DiLoCo's lr 0.7,
momentum 0.9, the momentum on every push) or, in async, delayed-nesterov
(the same, its momentum once per 8 pushes: Liu et al.'s DN) and DN with
--local-steps auto:H (DyLU: each worker's H by its measured simulated step
time against the crew's fastest), sync and async, seeds 1-3. In async, outer sgd at lr 1 applies
each worker's whole pseudo-gradient, so 8 workers move the weights 8
rounds' worth where sync averages them into one: lr 1/8 is async's
averaging. One
JSON line per cell: test accuracy, simulated seconds, pushes and the bytes
they move (pushes x 101,770 x 4), mean and sd over the seeds.

usage: docs/experiments/local_steps.py [DOWNPOUR]   (default build/downpour)
"""
import json
import statistics as st
import subprocess
import sys

D = sys.argv[1] if len(sys.argv) > 1 else "build/downpour"
FLOATS = 784 * 128 + 128 + 128 * 10 + 10
BASE = ["sim", "--workers", "8", "--compute", "exp:10", "--model", "fc:128 relu fc:10 softmax",
        "--optimizer", "sgd", "--lr", "0.05", "--lr-schedule", "constant", "--batch", "64",
        "--epochs", "2", "--json", "--eval-every", "0"]


def run(mode, h, outer, lr, seed):
    auto = outer.endswith("+auto")
    outer = outer.removesuffix("+auto")
    args = [D, *BASE, "--mode", mode, "--local-steps", f"auto:{h}" if auto else str(h), "--seed", str(seed)]
    if h > 1:
        args += ["--outer-optimizer", outer, "--outer-lr", str(lr)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


OUTER = {"sync": [("sgd", 1), ("nesterov", 0.7)],
         "async": [("sgd", 1), ("sgd", 0.125), ("nesterov", 0.7), ("delayed-nesterov", 0.7),
                   ("delayed-nesterov+auto", 0.7)]}
for mode in ("sync", "async"):
    for h in (1, 4, 16, 64):
        for outer, lr in ([("sgd", 1)] if h == 1 else OUTER[mode]):
            rs = [run(mode, h, outer, lr, s) for s in (1, 2, 3)]
            row = {"mode": mode, "local_steps": h, "outer": f"{outer} lr {lr}" if h > 1 else "-"}
            if any(r is None for r in rs):
                row["failed"] = sum(r is None for r in rs)
            else:
                for k in ("test_accuracy", "sim_s", "staleness_mean"):
                    v = [r[k] for r in rs]
                    row[k] = [round(st.mean(v), 4), round(st.stdev(v), 4)]
                row["pushes"] = rs[0]["pushes"]
                row["mb_pushed"] = round(rs[0]["pushes"] * FLOATS * 4 / 1e6, 1)
            print(json.dumps(row), flush=True)
