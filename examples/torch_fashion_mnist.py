#!/usr/bin/python3
"""An ordinary PyTorch training loop on Fashion-MNIST, made a Downpour worker
by the lines marked "Downpour". The servers and N of these, with one command
(README.md, "Bring your own model"):

    PYTHONPATH=build/python build/downpour launch --workers 2 --mode async \
        -- python3 examples/torch_fashion_mnist.py

downpour launch gives each copy TF_CONFIG (the servers, its task) and
WORLD_SIZE, which the defaults below read; the chief's Worker(model) writes
the servers' model first (--init FILE to launch gives it instead). By hand,
the same run is:

    PYTHONPATH=build/python python3 examples/torch_fashion_mnist.py --write-init model.safetensors
    build/downpour-ps --init model.safetensors --workers 2 --mode async --bind tcp://*:5555 &
    PYTHONPATH=build/python python3 examples/torch_fashion_mnist.py --ps tcp://127.0.0.1:5555 --task 1 --workers 2 &
    PYTHONPATH=build/python python3 examples/torch_fashion_mnist.py --ps tcp://127.0.0.1:5555 --task 0 --workers 2

The model is whatever nn.Module you have; the servers hold its state_dict
(parameters trained by their optimizer, --optimizer; buffers such as batch
norm's running statistics kept as values). Task 0, the chief, waits for the
others at the end, scores the final weights and stops the servers.

With --dealt the servers deal the batches (an elastic crew, --workers
MIN:MAX): the loop takes them from a DataLoader over Worker.sampler, and
every sample of each epoch is trained once whoever joins, leaves or dies
(`downpour scale`, --max-restarts):

    PYTHONPATH=build/python build/downpour launch --workers 2:4 --mode async \
        -- python3 examples/torch_fashion_mnist.py --dealt
"""
import argparse
import gzip
import os
import struct

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import downpour.torch  # Downpour

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def load(split):
    def idx(name):
        with gzip.open(os.path.join(DATA, name + ".gz"), "rb") as f:
            raw = f.read()
        dims = struct.unpack(">" + "I" * raw[3], raw[4:4 + 4 * raw[3]])
        return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(dims)
    x = torch.from_numpy(idx(f"{split}-images-idx3-ubyte").astype(np.float32) / 255).unsqueeze(1)
    return x, torch.from_numpy(idx(f"{split}-labels-idx1-ubyte").astype(np.int64))


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser(description="Fashion-MNIST with PyTorch, as a Downpour worker")
    ap.add_argument("--write-init", metavar="FILE", help="write the servers' --init file and exit")
    ap.add_argument("--ps", help="the shards, comma-separated (default: TF_CONFIG's)")
    ap.add_argument("--task", type=int, help="this worker's index (default: TF_CONFIG's, else 0)")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORLD_SIZE", 1)),
                    help="how many share the data (default: $WORLD_SIZE, else 1)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the epochs)")
    ap.add_argument("--dealt", action="store_true",
                    help="train the batches the servers deal (servers with --workers MIN:MAX)")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = make_model()
    if a.write_init:
        downpour.torch.save_init(model, a.write_init)  # Downpour
        return
    x, y = load("train")
    loss_fn = nn.CrossEntropyLoss()
    ps = a.ps.split(",") if a.ps else None
    with downpour.torch.Worker(model, ps=ps, task_index=a.task) as w:  # Downpour
        task = w.info.task_index
        steps = 0
        if a.dealt:  # Downpour: the servers' batches, each sample of an epoch once
            ds = TensorDataset(x, y)
            dealt = w.sampler(ds, batch_size=a.batch, epochs=0 if a.steps else a.epochs, steps=a.steps)
            for xb, yb in DataLoader(ds, batch_sampler=dealt):  # each step pulls with its batch
                loss = loss_fn(model(xb), yb)
                loss.backward()
                w.push(loss=loss, batch=len(xb))
                model.zero_grad()
        for epoch in range(0 if a.dealt else a.epochs):
            perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
            mine = perm[task::a.workers]  # this worker's share of the epoch
            for i in range(0, len(mine) - a.batch + 1, a.batch):
                if a.steps and steps == a.steps:
                    break
                steps += 1
                idx = mine[i:i + a.batch]
                w.pull()                                  # Downpour: the current weights
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                w.push(loss=loss, batch=len(idx))         # Downpour: instead of opt.step()
                model.zero_grad()
        if task == 0:
            w.wait_all()                                  # Downpour: every worker is done
            w.pull()
            xt, yt = load("t10k")
            model.eval()
            with torch.no_grad():
                acc = (model(xt).argmax(1) == yt).float().mean().item()
            st = w.stats()
            dealt = "".join(f"; epoch {e['epoch']}: {e['trained']} samples trained"
                            for e in st["epoch_samples"])
            print(f"test accuracy {acc:.4f}; the servers applied {st['applied']} pushes, "
                  f"staleness mean {st['staleness_mean']:.2f} max {st['staleness_max']}{dealt}")
            w.shutdown()                                  # Downpour: stop the servers


if __name__ == "__main__":
    main()
