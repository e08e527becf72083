#!/usr/bin/python3
"""py_nodes: a worker of `downpour launch --nnodes N`, for test_launch_nodes.sh.

    py_nodes.py STEPS

Prints the variables the launcher gave it (torchrun's, TF_CONFIG's task
index, DOWNPOUR_PS) on one "env ..." line, trains a small module STEPS
steps through downpour.torch.Worker() with no ps= (the servers found from
the environment, as any launched program finds them); the chief (RANK 0)
then waits for every worker of every node, prints "result: applied N
pushes, version V" and stops the servers; the others finish and exit.
"""
import json
import os
import sys

import torch
from torch import nn

import downpour.torch as dt

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT")


def main():
    steps = int(sys.argv[1])
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"] if "TF_CONFIG" in os.environ else "-"
    print("env " + " ".join(f"{k}={os.environ.get(k, '-')}" for k in KEYS)
          + f" TASK={task} DOWNPOUR_PS={os.environ.get('DOWNPOUR_PS', '-')}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    g = torch.Generator().manual_seed(int(os.environ["RANK"]))
    with dt.Worker(model) as w:
        for _ in range(steps):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            w.pull()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            w.push(loss=loss, batch=len(x))
            model.zero_grad()
        if w.info.task_index == 0:
            w.wait_all(timeout=120)
            st = w.stats()
            print(f"result: applied {st['applied']} pushes, version {st['version']}", flush=True)
            w.shutdown()


if __name__ == "__main__":
    main()
