#!/usr/bin/python3
"""DiLoCo on Fashion-MNIST: each worker trains with its own AdamW (the inner
optimizer) for H steps, then pushes the pseudo-gradient (the weights the
round started from minus those it reached); the servers step by Nesterov
momentum (the outer optimizer, lr 0.7, momentum 0.9) and hand out the new
weights. The loop is an ordinary PyTorch one; the Worker learns H from the
servers and makes push() a round's step (downpour.torch's help):

    PYTHONPATH=build/python build/downpour launch --workers 2 --mode sync --local-steps 8 \\
        --outer-optimizer nesterov -- python3 examples/torch_diloco.py

The model and data are examples/torch_fashion_mnist.py's.
"""
import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fashion_mnist import load, make_model  # noqa: E402

import downpour.torch  # noqa: E402  (Downpour)


def main():
    ap = argparse.ArgumentParser(description="DiLoCo on Fashion-MNIST as Downpour workers")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3, help="the inner AdamW's lr")
    ap.add_argument("--epochs", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = make_model()
    x, y = load("train")
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)          # the inner optimizer
    with downpour.torch.Worker(model) as w:                       # Downpour: TF_CONFIG's servers
        task, pushes = w.info.task_index, 0
        for epoch in range(a.epochs):
            perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
            mine = perm[task::a.workers]
            for i in range(0, len(mine) - a.batch + 1, a.batch):
                idx = mine[i:i + a.batch]
                w.pull()                                          # Downpour: a round's start only
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
                pushes += w.push(loss=loss, batch=len(idx)) is not None  # Downpour: every H-th
                opt.zero_grad()
        print(f"worker {task}: {pushes} pushes of rounds of {w.local_steps} steps", flush=True)
        if task == 0:
            w.wait_all()                                          # Downpour: the rounds are over
            w.pull()                                              # so this fetches the final weights
            xt, yt = load("t10k")
            model.eval()
            with torch.no_grad():
                acc = (model(xt).argmax(1) == yt).float().mean().item()
            st = w.stats()
            print(f"test accuracy {acc:.4f}; the servers applied {st['applied']} pushes", flush=True)
            w.shutdown()


if __name__ == "__main__":
    main()
