#!/usr/bin/python3
"""torch_local: the PyTorch side of tests/bench/torch_local.sh.

    torch_local.py alone STEPS           the loop alone: AdamW on the example's
                                         network, Fashion-MNIST batches of 64, 1 thread
    torch_local.py worker STEPS [EP]     the same loop as a downpour.torch.Worker
                                         (the servers' --local-steps decide the rounds;
                                         EP: the shards, else TF_CONFIG's)
    torch_local.py own STEPS             a Worker's loop over a DataLoader in its own
                                         shuffled order (servers --workers MIN:MAX)
    torch_local.py dealt STEPS           the same over the batches the servers deal
                                         (DataLoader(batch_sampler=Worker.sampler))
Prints "first_step_at T" (time.time() when the first step began) and
"images_per_s X" over the steps after the first.
"""
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../examples"))
from torch_fashion_mnist import load, make_model  # noqa: E402

torch.set_num_threads(1)
mode, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = make_model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
# real batches: on a fixed random one the weights run off under an outer
# Nesterov, into denormals that slow every step down 2.5x
xs, ys = load("train")
w = None
if mode != "alone":
    import downpour.torch
    ep = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    w = downpour.torch.Worker(model, ps=ep, task_index=int(os.environ.get("RANK", 0)) if ep else None)


def batches():
    """(x, y) of each step: slices of the data, or a DataLoader's batches."""
    if mode in ("alone", "worker"):
        return ((xs[64 * k:64 * (k + 1)], ys[64 * k:64 * (k + 1)]) for k in range(steps))
    from torch.utils.data import DataLoader, TensorDataset
    ds = TensorDataset(xs, ys)
    if mode == "own":
        return DataLoader(ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    return DataLoader(ds, batch_sampler=w.sampler(ds, batch_size=64, epochs=0, steps=steps))


for k, (x, y) in enumerate(batches()):
    if k == steps:
        break
    if k == 0:
        print(f"first_step_at {time.time():.3f}", flush=True)
    if k == 1:
        t0 = time.monotonic()
    if w and mode != "dealt":  # the sampler's step pulled with its batch
        w.pull()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    if w:
        w.push(loss=loss, batch=64)
    opt.zero_grad()
print(f"images_per_s {64 * (k - 1) / (time.monotonic() - t0):.1f}", flush=True)
if w:
    if w.info.task_index == 0:
        w.wait_all()
        w.shutdown()
    else:
        w.finish()
    w.close()
