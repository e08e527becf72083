#!/usr/bin/python3
"""py_worker: a PyTorch training loop made a Downpour worker with
downpour.torch.Worker, for the test_py_* tests.

    py_worker.py --write-init FILE [--spec SPEC]    the --init file of the model
    py_worker.py --ps EP --task I --workers N [--spec SPEC] [--steps S | --epochs E]
                 [--batch B] [--seed N] [--out FILE.json] [--shutdown]

The model is tests/integration/py_common.py's small CNN, or with --spec the
spec's network as tests/torch_net.py builds it (the servers then run --model
SPEC). The chief (task 0) waits for every worker, pulls the final weights,
scores them on the test set and writes --out: {"test_accuracy", "stats",
"steps", "updates_lost", "staleness"}; --shutdown then stops the servers.
Every worker's --out has its own "steps" and mean "staleness"."""
import argparse
import json
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import py_common  # noqa: E402
import downpour.torch  # noqa: E402


def model_for(spec):
    if spec:
        from torch_net import build_module
        return build_module(spec, (1, 28, 28))
    return py_common.small_cnn()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-init")
    ap.add_argument("--ps")
    ap.add_argument("--task", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--spec")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--out")
    ap.add_argument("--shutdown", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model = model_for(a.spec)
    if a.write_init:
        downpour.torch.save_init(model, a.write_init)
        return
    x, y = py_common.load("train")
    loss_fn = nn.CrossEntropyLoss()
    opts = {"spec": a.spec} if a.spec else {}
    steps, stale = 0, 0.0
    with downpour.torch.Worker(model, ps=a.ps.split(","), task_index=a.task, timeout=a.timeout,
                               **opts) as w:
        order = py_common.batches(len(y), a.batch, a.task, a.workers, a.seed, a.epochs)
        for k, idx in enumerate(order):
            if a.steps and k >= a.steps:
                break
            if k < w.step:  # a restarted worker goes on after the steps the servers hold
                continue
            w.pull()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            r = w.push(loss=loss, batch=len(idx))
            model.zero_grad()
            steps += 1
            stale += r.staleness
        out = {"steps": steps, "staleness": stale / max(steps, 1),
               "updates_lost": w.client.updates_lost()}
        if a.task == 0:
            w.wait_all(timeout=a.timeout * 10)
            w.pull()
            xt, yt = py_common.load("t10k")
            out["test_accuracy"] = py_common.accuracy(model, xt, yt)
            out["stats"] = w.stats()
            if a.shutdown:
                w.shutdown()
    print(json.dumps({k: v for k, v in out.items() if k != "stats"}))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    try:
        main()
    except downpour.Error as e:
        print(f"py_worker: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
