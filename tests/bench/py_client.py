#!/usr/bin/python3
"""py_client: pull + push of the default model's parameters (1,663,370 floats,
6.65 MB) from Python, against the C client, in one run (make bench).

    PYTHONPATH=build/python tests/bench/py_client.py [--build build] [--rounds 20] [--blocks 5]

It starts one downpour-ps (the default model, async, SGD, 2 workers) and
alternates blocks: build/tests/bench_client (the C worker's client, worker
1) for --rounds rounds, then the same rounds from Python as worker 0,
through downpour.torch.Worker (pull into the module's parameters in place,
push of their .grad) and through the NumPy downpour.Client (a flat array);
so that other load on the machine falls on every side alike. Each of
tcp frames (--transport zmq) and shared memory (auto, what a worker on the
servers' host gets) is measured. Figures: medians over all rounds after
each block's warm-up; ratio = Python / C.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import downpour  # noqa: E402
import downpour.torch  # noqa: E402
from torch_net import DEFAULT_SPEC, build_module  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="downpour-bench-py.")
    ready = os.path.join(tmp, "ready")
    ps = subprocess.Popen([os.path.join(a.build, "downpour-ps"), "--bind", "tcp://127.0.0.1:0",
                           "--ready-file", ready, "--workers", "2", "--mode", "async",
                           "--optimizer", "sgd", "--lr", "1e-9", "--threads", "1"],
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "ps.log"), "w"))
    try:
        for _ in range(100):
            if os.path.exists(ready) and os.path.getsize(ready):
                break
            time.sleep(0.1)
        ep = open(ready).read().strip()
        print(f"py_client: 1 downpour-ps ({ep}, default model, async, sgd), "
              f"{a.blocks} blocks x {a.rounds} rounds per side, torch {torch.__version__}, "
              f"{downpour.library_path()}")
        for transport in ("zmq", "auto"):
            t = {"c": [], "torch": [], "numpy": []}
            model = build_module(DEFAULT_SPEC, (1, 28, 28))
            w = downpour.torch.Worker(model, ps=[ep], task_index=0, spec=DEFAULT_SPEC,
                                      transport=transport)
            for p in model.parameters():
                p.grad.fill_(1e-6)
            c = w.client
            flat = np.empty(c.num_floats, dtype=np.float32)
            g = np.full(c.num_floats, 1e-6, dtype=np.float32)
            for b in range(a.blocks):
                out = subprocess.run([os.path.join(a.build, "tests", "bench_client"), ep, "1",
                                      str(a.rounds), DEFAULT_SPEC, transport],
                                     capture_output=True, text=True, check=True).stdout
                t["c"] += [float(x.split()[1]) + float(x.split()[2]) for x in out.splitlines()
                           if x.startswith("c ")]
                for r in range(3 + a.rounds):
                    t0 = time.perf_counter()
                    w.pull()
                    w.push(loss=0.0, batch=1)
                    t1 = time.perf_counter()
                    c.pull(flat)
                    c.push(g, loss=0.0, batch=1)
                    t2 = time.perf_counter()
                    if r >= 3:
                        t["torch"].append((t1 - t0) * 1e3)
                        t["numpy"].append((t2 - t1) * 1e3)
            w.close()
            med = {k: statistics.median(v) for k, v in t.items()}
            mb = c.num_floats * 4 / 1e6
            print(f"\ntransport {transport} ({'tcp frames' if transport == 'zmq' else 'shared memory'}), "
                  f"{c.num_floats} floats ({mb:.2f} MB) each way, ms per pull + push, "
                  f"median of {len(t['c'])}:")
            print(f"  {'C client (bench_client)':34s} {med['c']:8.3f}")
            print(f"  {'Python downpour.torch.Worker':34s} {med['torch']:8.3f}   "
                  f"ratio {med['torch'] / med['c']:.3f}")
            print(f"  {'Python downpour.Client (NumPy)':34s} {med['numpy']:8.3f}   "
                  f"ratio {med['numpy'] / med['c']:.3f}")
    finally:
        ps.terminate()
        ps.wait()


if __name__ == "__main__":
    main()
