"""py_deal: a PyTorch worker of an elastic crew training the batches shard 0
deals it (downpour.torch.Worker.sampler over a TensorDataset), for
test_py_deal.sh. Each push's batch is one line of --log: "STEP i,j,...".

--gate N FILE: after N pushes, wait (polling) until FILE exists.
--hold N FILE: when dealt its N-th batch, write its indices to FILE and
wait there forever (the test kills it with the batch in flight).
SIGTERM: the worker leaves after its whole step (downpour_leave), exit 0.
A dealt plan the servers refuse: its one line on stderr, exit 2."""
import argparse
import json
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import downpour
import downpour.torch as dt


def model():
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-init")
    ap.add_argument("--ps")
    ap.add_argument("--task", type=int, default=0)
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--log")
    ap.add_argument("--gate", nargs=2)
    ap.add_argument("--hold", nargs=2)
    ap.add_argument("--stats", help="the chief: Client.stats()'s epoch_samples, as JSON, here")
    a = ap.parse_args()
    m = model()
    if a.write_init:
        dt.save_init(m, a.write_init)
        return 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(a.size, 4, generator=g), torch.randint(0, 2, (a.size,), generator=g),
                       torch.arange(a.size))
    w = dt.Worker(m, ps=[a.ps], task_index=a.task, timeout=60)
    try:
        sampler = w.sampler(ds, batch_size=a.batch)
    except downpour.Error as e:
        print(f"py_deal: {e}", file=sys.stderr)
        w.client.leave()
        return 2
    log = open(a.log, "a", buffering=1)
    for n, (x, y, idx) in enumerate(DataLoader(ds, batch_sampler=sampler), 1):
        if a.hold and n == int(a.hold[0]):
            open(a.hold[1] + ".tmp", "w").write(",".join(str(int(i)) for i in idx))
            os.rename(a.hold[1] + ".tmp", a.hold[1])
            while True:
                time.sleep(0.05)
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        w.push(loss=loss.item(), batch=len(x))
        m.zero_grad()
        log.write(f"{w.step} " + ",".join(str(int(i)) for i in idx) + "\n")
        while a.gate and n >= int(a.gate[0]) and not os.path.exists(a.gate[1]) and not stop:
            time.sleep(0.02)
        if stop:
            w.client.leave()
            return 0
    if a.task == 0:
        w.wait_all(120)
        if a.stats:
            json.dump(w.client.stats()["epoch_samples"], open(a.stats, "w"))
        w.shutdown()
    else:
        w.finish()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
