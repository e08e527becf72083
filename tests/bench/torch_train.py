#!/usr/bin/python3
"""torch_train: PyTorch's training throughput on Downpour's default network,
the reference `make bench` (tests/bench/run.sh) sets Downpour's numbers against.

Same network as DP_MODEL_DEFAULT_SPEC on 1x28x28 inputs:
  conv5x5:32 same, relu, maxpool2, conv5x5:64 same, relu, maxpool2,
  fc:512, relu, fc:10, cross-entropy; SGD lr 0.01, momentum 0.9.
One step = forward + backward + update on a fixed synthetic batch (no data
loading), as tests/bench/bench_train.c does for Downpour. Activations and
weights are channels_last by default: on this machine oneDNN's convolutions
make a step 15-25% faster so than in NCHW (--layout nchw to compare).

Output, one line per sample (what run.sh parses):
  sample torch THREADS BATCH IMAGES_PER_S LOSS
A sample is the throughput of as many steps as fit in --seconds, so its
median over --samples is robust against other load on a shared machine.

Run it as PyTorch is fastest here (run.sh does): OPENBLAS_NUM_THREADS=1 (torch's
own pool plus OpenBLAS's oversubscribes 2 cores) and glibc's malloc
thresholds raised (MALLOC_MMAP_THRESHOLD_ etc.; otherwise every step maps
and unmaps its large buffers and page-faults).
"""
import argparse
import statistics
import sys
import time

import os

try:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from torch_net import DEFAULT_SPEC, build_module
except ImportError as e:  # run.sh checks first; this is for people running it by hand
    print(f"torch_train: cannot import torch ({e}); install python3-torch", file=sys.stderr)
    sys.exit(3)


def measure(batch, seconds, samples, warmup, channels_last):
    torch.manual_seed(1)
    net = build_module(DEFAULT_SPEC, (1, 28, 28))
    x = torch.rand(batch, 1, 28, 28)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(warmup):
        step()
    out = []
    for _ in range(samples):
        n, t0 = 0, time.perf_counter()
        while True:
            loss = step()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= seconds and n >= 2:
                break
        out.append((n * batch / dt, float(loss)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="32,64,128")
    ap.add_argument("--seconds", type=float, default=0.5, help="length of one sample")
    ap.add_argument("--samples", type=int, default=3, help="samples per batch size")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--layout", choices=("nhwc", "nchw"), default="nhwc",
                    help="memory format: nhwc (channels_last, the faster here) or nchw")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    for b in (int(s) for s in a.batches.split(",")):
        res = measure(b, a.seconds, a.samples, a.warmup, a.layout == "nhwc")
        for ips, loss in res:
            print(f"sample torch {a.threads} {b} {ips:.1f} {loss:.4f}", flush=True)
        print(f"# torch threads {a.threads} batch {b}: median "
              f"{statistics.median(r[0] for r in res):.0f} images/s", file=sys.stderr)


if __name__ == "__main__":
    main()
