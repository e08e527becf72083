#!/usr/bin/env python3
"""torch_bench: PyTorch's training throughput for Downpour's default network,
the yardstick tests/gpu/run.sh sets our CUDA backend against.

Same architecture as DP_MODEL_DEFAULT_SPEC ("conv5x5:32 relu maxpool2
conv5x5:64 relu maxpool2 fc:512 relu fc:10 softmax", 1x28x28 inputs), or
--model's spec or preset (resnet20, resnet56: tests/torch_net.py), SGD with
momentum (or Adam with --optimizer adam), cross-entropy. The step does what the standalone worker does: copy
a host batch (pinned) to the GPU, forward, loss, backward, update, and read
the loss back to the host (one sync per step). Synthetic data: throughput does
not depend on pixel values. Warm-up steps first (cuDNN plans, allocator),
then timed steps between two cuda synchronize calls.

TF32 is off by default for both convolutions and matmuls (PyTorch allows it
for convolutions by default), matching the backend's default FP32 math;
--tf32 1 allows it in both, like DP_CUDA_TF32=1.

Prints one JSON object: batch, steps, images_per_s, step_ms, tf32, device,
torch version.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300, help="timed steps")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--tf32", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--optimizer", choices=("momentum", "adam"), default="momentum")
    ap.add_argument("--model", default=None,
                    help="a Downpour spec or preset (resnet20, ...); default: the default network")
    args = ap.parse_args()

    import torch
    import torch.nn as nn

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from torch_net import DEFAULT_SPEC, build_module

    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return 2
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    dev = torch.device(args.device)
    torch.manual_seed(1)

    net = build_module(args.model or DEFAULT_SPEC, (1, 28, 28)).to(dev)
    if args.optimizer == "adam":
        # foreach, not fused: the plain multi-tensor path, as most scripts get it
        opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    B = args.batch
    # a few distinct host batches, pinned, cycled through
    xs = [torch.rand(B, 1, 28, 28).pin_memory() for _ in range(4)]
    ys = [torch.randint(0, 10, (B,)).pin_memory() for _ in range(4)]

    def step(i):
        x = xs[i % 4].to(dev, non_blocking=True)
        y = ys[i % 4].to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # the host reads the loss every step, as the worker does

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    last = 0.0
    for i in range(args.steps):
        last = step(i)
    torch.cuda.synchronize(dev)
    dt = time.perf_counter() - t0
    print(json.dumps({
        "batch": B,
        "steps": args.steps,
        "images_per_s": round(B * args.steps / dt, 1),
        "step_ms": round(1000 * dt / args.steps, 4),
        "tf32": args.tf32,
        "optimizer": args.optimizer,
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "model": args.model or "default",
        "last_loss": round(last, 5),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
