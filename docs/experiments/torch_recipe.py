#!/usr/bin/python3
"""torch_recipe: the accuracy recipe of resnet_recipe.sh in PyTorch, as a
PyTorch user writes it: tests/torch_net.py's CifarResNet (He et al.'s CIFAR
family, option-A shortcuts, the module Downpour's checkpoints load into),
SGD with momentum and coupled weight decay on every parameter, a cosine
over the run stepped per batch, random crop (zero padding 4) and horizontal
flip, per-channel normalisation by the training set's mean and std. The
same recipe as `downpour-worker --standalone` is given in resnet_recipe.sh;
the two differ only in their random streams (initial weights, data order,
augmentation draws).

Prints one JSON line per epoch: epoch, test_accuracy, train_loss, seconds.

    python3 docs/experiments/torch_recipe.py --epochs 10 --seed 1 --threads 1
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "tests"), os.path.join(HERE, "..", "..", "tests", "integration")]
from py_common import accuracy, load  # noqa: E402
from torch_net import build_module  # noqa: E402

PAD = 4  # the crop's zero padding, as Downpour's --augment (worker/exec/data.h)


def augment(x, gen):
    """Per sample: a crop of the zero-padded image at a uniform offset in
    [-PAD, PAD] and a flip with probability 1/2 (on raw pixels, before the
    normalisation, so the padding is black as in Downpour)."""
    B, _, H, W = x.shape
    padded = F.pad(x, (PAD, PAD, PAD, PAD))
    off = torch.randint(0, 2 * PAD + 1, (B, 2), generator=gen)
    flip = torch.rand(B, generator=gen) < 0.5
    out = torch.empty_like(x)
    for b in range(B):
        dy, dx = int(off[b, 0]), int(off[b, 1])
        crop = padded[b, :, dy:dy + H, dx:dx + W]
        out[b] = crop.flip(-1) if flip[b] else crop
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-samples", type=int, default=0, help="the first N (0: all), as Downpour's flag")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    x, y = load("train")
    if a.train_samples > 0:
        x, y = x[:a.train_samples], y[:a.train_samples]
    xt, yt = load("t10k")
    mean, std = x.mean().item(), x.std().item()
    xt = (xt - mean) / std
    model = build_module(a.model, tuple(x.shape[1:])).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    steps_per_epoch = len(y) // a.batch  # the last partial batch dropped, as Downpour does
    total = steps_per_epoch * a.epochs
    # Downpour's cosine:N (kernels/optim.c): lr * (1 + cos(pi * step / N)) / 2, per step
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    for epoch in range(1, a.epochs + 1):
        t0 = time.time()
        perm = torch.randperm(len(y), generator=gen)
        loss_sum = 0.0
        for k in range(steps_per_epoch):
            idx = perm[k * a.batch:(k + 1) * a.batch]
            xb = ((augment(x[idx], gen) - mean) / std).contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(xb), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
        acc = accuracy(model, xt, yt)
        print(json.dumps({"epoch": epoch, "test_accuracy": round(acc, 5),
                          "train_loss": round(loss_sum / steps_per_epoch, 5),
                          "seconds": round(time.time() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
