#!/usr/bin/python3
"""torch_parity: Downpour's network against PyTorch's on the same weights and
batch (tests/unit/test_torch_parity.c writes DIR, then runs this).

    /usr/bin/python3 tests/torch_parity.py DIR

DIR/model.safetensors is a Downpour checkpoint (dp_checkpoint_save) of the
weights before the step; it must load with load_state_dict(strict=True)
into tests/torch_net.py's module, num_batches_tracked as int64. DIR/step.safetensors
holds the batch (x, y), Downpour's training loss, its gradient of every
trainable tensor ("grad.NAME"), the running statistics after the step
("after.NAME") and the evaluation-mode probabilities before it ("probs").
Checks: loss within relative 1e-5, each gradient within 1e-4 of its norm,
the running statistics within 1e-5 (relative to their norm), evaluation
outputs within 1e-5. Prints one line per failure and exits 1, else "ok"."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "integration"))
from torch_load import read_safetensors  # noqa: E402
from torch_net import build_module  # noqa: E402


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    tensors, meta = read_safetensors(os.path.join(d, "model.safetensors"))
    step, _ = read_safetensors(os.path.join(d, "step.safetensors"))
    in_shape = tuple(int(v) for v in meta["input"].split("x"))
    net = build_module(meta["spec"], in_shape)
    bad = []
    for k, v in tensors.items():
        if k.endswith("num_batches_tracked") and v.dtype != torch.int64:
            bad.append(f"{k}: dtype {v.dtype}, PyTorch saves int64")
    net.load_state_dict(tensors, strict=True)
    x, y = step["x"], step["y"].long()
    # evaluation mode first: the running statistics as loaded
    net.eval()
    with torch.no_grad():
        probs = F.softmax(net(x), dim=1)
    e = (probs - step["probs"]).abs().max().item()
    if e > 1e-5:
        bad.append(f"eval probabilities differ by {e:.3g}")
    net.train()
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    ours = step["loss"].item()
    if abs(loss.item() - ours) > 1e-5 * abs(loss.item()):
        bad.append(f"loss: torch {loss.item():.9g}, downpour {ours:.9g}")
    n_grads = 0
    for name, p in net.named_parameters():
        g = step["grad." + name]
        n_grads += 1
        diff = (p.grad - g).norm().item()
        if diff > 1e-4 * p.grad.norm().item() + 1e-12:
            bad.append(f"grad {name}: |diff| {diff:.3g}, |grad| {p.grad.norm().item():.3g}")
    for name, b in net.named_buffers():
        a = step["after." + name].to(b.dtype)
        diff = (b.double() - a.double()).norm().item()
        if diff > 1e-5 * b.double().norm().item() + 1e-7:
            bad.append(f"{name} after the step: |diff| {diff:.3g}")
    for line in bad:
        print("torch_parity: " + line)
    if bad:
        sys.exit(1)
    print(f"ok: loss {loss.item():.7g}, {n_grads} gradients, eval outputs match")


if __name__ == "__main__":
    main()
