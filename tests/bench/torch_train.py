#!/usr/bin/python3
"""torch_train: PyTorch's training throughput on Downpour's default network,
the reference `make bench` (tests/bench/run.sh) sets Downpour's numbers against.

Same network as DP_MODEL_DEFAULT_SPEC on 1x28x28 inputs:
  conv5x5:32 same, relu, maxpool2, conv5x5:64 same, relu, maxpool2,
  fc:512, relu, fc:10, cross-entropy; SGD lr 0.01, momentum 0.9.
--model SPEC and --input CxHxW take another spec or preset (resnet20: the
CifarResNet of tests/torch_net.py, PyTorch's own BatchNorm2d) and shape, as
bench_train's -m and -i do.
One step = forward + backward + update on a fixed synthetic batch (no data
loading), as tests/bench/bench_train.c does for Downpour. Which memory
format is faster depends on the machine (oneDNN's convolutions in
channels_last were 15-25% faster on one, NCHW on another), so by default
both are measured, sample by sample in turn, and run.sh takes the faster
(--layout nhwc or nchw measures one).

Output, one line per sample (what run.sh parses):
  sample torch-LAYOUT THREADS BATCH IMAGES_PER_S LOSS
A sample is the throughput of as many steps as fit in --seconds, so its
median over --samples is robust against other load on a shared machine.
On stderr first: the ATen CPU capability in use ("# torch: ATen CPU
capability AVX2"), which ATEN_CPU_CAPABILITY limits (oneDNN's limit,
ONEDNN_MAX_CPU_ISA, shows with ONEDNN_VERBOSE=1).

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


def make_step(batch, channels_last, spec=DEFAULT_SPEC, shape=(1, 28, 28)):
    """One training step of a fresh network on a fixed batch, as a function."""
    torch.manual_seed(1)
    net = build_module(spec, shape)
    net.train()
    x = torch.rand(batch, *shape)
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

    return step


def sample(step, batch, seconds):
    """(images/s, loss) of as many steps as fit in `seconds` (at least 2)."""
    n, t0 = 0, time.perf_counter()
    while True:
        loss = step()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds and n >= 2:
            return n * batch / dt, float(loss)


def measure(batch, seconds, samples, warmup, layouts, spec=DEFAULT_SPEC, shape=(1, 28, 28)):
    """{layout: [(images/s, loss)]}, the layouts' samples taken in turn so
    that other load on the machine falls on each alike."""
    steps = {lay: make_step(batch, lay == "nhwc", spec, shape) for lay in layouts}
    for step in steps.values():
        for _ in range(warmup):
            step()
    out = {lay: [] for lay in layouts}
    for _ in range(samples):
        for lay, step in steps.items():
            out[lay].append(sample(step, batch, seconds))
    return out


def capability():
    """The ATen CPU capability line of torch's build config, e.g. "AVX2"."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="32,64,128")
    ap.add_argument("--seconds", type=float, default=0.5, help="length of one sample")
    ap.add_argument("--samples", type=int, default=3, help="samples per batch size")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--layout", choices=("both", "nhwc", "nchw"), default="both",
                    help="memory format: nhwc (channels_last), nchw, or both in turn")
    ap.add_argument("--model", default=DEFAULT_SPEC, help="spec or preset (default the seed CNN)")
    ap.add_argument("--input", default="1x28x28", help="CxHxW (default 1x28x28)")
    a = ap.parse_args()
    shape = tuple(int(v) for v in a.input.split("x"))
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    print(f"# torch: ATen CPU capability {capability()}", file=sys.stderr, flush=True)
    layouts = ("nhwc", "nchw") if a.layout == "both" else (a.layout,)
    for b in (int(s) for s in a.batches.split(",")):
        res = measure(b, a.seconds, a.samples, a.warmup, layouts, a.model, shape)
        for lay in layouts:
            for ips, loss in res[lay]:
                print(f"sample torch-{lay} {a.threads} {b} {ips:.1f} {loss:.4f}", flush=True)
            print(f"# torch {lay} threads {a.threads} batch {b}: median "
                  f"{statistics.median(r[0] for r in res[lay]):.0f} images/s", file=sys.stderr)


if __name__ == "__main__":
    main()
