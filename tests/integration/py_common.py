"""py_common: what the Python workers of the test_py_* tests share — the
Fashion-MNIST reader (IDX, plain or .gz, as the C reader), the small CNN
with batch norm they train, the data order, and evaluation."""
import gzip
import os
import struct

import numpy as np
import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    if os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split, d=DATA):
    """(x float32 [n, 1, 28, 28] in [0, 1], y int64 [n]) of "train" or "t10k"."""
    x = read_idx(os.path.join(d, f"{split}-images-idx3-ubyte"))
    y = read_idx(os.path.join(d, f"{split}-labels-idx1-ubyte"))
    return torch.from_numpy(x.astype(np.float32) / 255).unsqueeze(1), torch.from_numpy(y.astype(np.int64))


def small_cnn():
    """A small CNN with a batch norm (its running statistics are state on the servers)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def batches(n, batch, task, workers, seed, epochs=1):
    """Worker task's index batches: each epoch one permutation from the seed,
    global step j covers [j*N*b, (j+1)*N*b) and worker r takes the r-th slice."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        per = batch * workers
        for j in range(n // per):
            yield perm[j * per + task * batch:j * per + (task + 1) * batch]


def accuracy(model, x, y, chunk=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), chunk):
            correct += (model(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum().item()
    model.train()
    return correct / len(y)
