#!/usr/bin/python3
"""torch_ddp: what a user would run instead of a Downpour cluster on one
machine: PyTorch's DistributedDataParallel over gloo (CPU), one process per
worker, each on its own batches, gradients all-reduced bucket by bucket
while backward runs. tests/bench/ddp.sh sets it beside `downpour local`.

The network is Downpour's default spec (tests/torch_net.py), Adam (lr 0.001)
or SGD with momentum, the batch per process and the threads per process as
given. Data: a few fixed random batches per process, cycled (no loading:
Downpour's prefetch thread costs its worker little, so this can only favour
PyTorch). Warm-up steps first, then --steps timed between two barriers.

Prints one JSON line (rank 0): workers, batch, threads, steps, images_per_s
(all processes' images over the timed wall time), step_ms, torch version.
"""
import argparse
import json
import os
import sys
import time


def run(rank, args, port):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from torch_net import DEFAULT_SPEC, build_module

    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(1)  # the same initial weights on every rank, as DDP expects
    module = build_module(DEFAULT_SPEC, (1, 28, 28))
    if args.layout == "nhwc":
        module = module.to(memory_format=torch.channels_last)
    net = torch.nn.parallel.DistributedDataParallel(module)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    xs = [torch.rand(args.batch, 1, 28, 28, generator=g) for _ in range(4)]
    if args.layout == "nhwc":
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    ys = [torch.randint(0, 10, (args.batch,), generator=g) for _ in range(4)]

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xs[i % 4]), ys[i % 4])
        loss.backward()  # DDP's all-reduce runs under this, by buckets
        opt.step()
        return loss.item()

    for i in range(args.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({
            "workers": args.workers, "batch": args.batch, "threads": args.threads,
            "steps": args.steps, "optimizer": args.optimizer, "layout": args.layout,
            "images_per_s": round(args.workers * args.batch * args.steps / dt, 1),
            "step_ms": round(1000 * dt / args.steps, 3), "torch": torch.__version__,
        }), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="per process")
    ap.add_argument("--threads", type=int, default=1, help="per process")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--optimizer", choices=("adam", "momentum"), default="adam")
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
    ap.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw",
                    help="memory format (which is faster depends on the machine: torch_train.py)")
    args = ap.parse_args()
    import socket

    import torch.multiprocessing as mp

    port = args.port
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.workers, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
