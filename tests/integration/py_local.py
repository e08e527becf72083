#!/usr/bin/python3
"""py_local: downpour.torch.Worker with local steps, for test_py_local.sh.

    py_local.py init FILE          the module's --init file
    py_local.py exact EP           1 worker, servers --local-steps 4 with
        outer SGD lr 1: 20 steps of inner SGD lr 0.1 through the Worker
        equal the same 20 steps alone to float rounding (each round's
        pseudo-gradient applied once: w0 - 1 * (w0 - w) = w); pull() inside
        a round leaves the module alone; 5 pushes, each returned at a
        round's end and None between; a round cut short by finish() is
        pushed too (22 steps: 6 pushes).
Prints "ok  ..." / "FAIL ..." lines and a closing count.
"""
import sys

import torch
from torch import nn

import downpour
import downpour.torch as dt

H = 4
passed = failed = 0


def check(name, ok):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name, flush=True)
    passed, failed = passed + bool(ok), failed + (not ok)


def make():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def batches(n):
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def alone(n):
    m = make()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for x, y in batches(n):
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        opt.zero_grad()
    return m


def exact(ep, steps, pushes_wanted, name):
    m = make()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    results = []
    untouched = True
    with dt.Worker(m, ps=ep, task_index=0) as w:
        check(f"{name}: the Worker reads H = {H} from the servers ({w.local_steps})", w.local_steps == H)
        for k, (x, y) in enumerate(batches(steps)):
            before = [p.detach().clone() for p in m.parameters()]
            w.pull()
            if k % H:
                untouched &= all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            results.append(w.push(loss=loss, batch=len(x)))
            opt.zero_grad()
        check(f"{name}: pull() inside a round leaves the module alone", untouched)
        got = sum(r is not None for r in results)
        check(f"{name}: push() returns a result at each round's end only ({got} of {steps})",
              all((r is not None) == ((k + 1) % H == 0) for k, r in enumerate(results)))
        w.finish()  # a round cut short goes first
        st = w.stats()
        check(f"{name}: the servers applied {st['applied']} pushes, {pushes_wanted} wanted",
              st["applied"] == pushes_wanted)
        w.client.pull()  # the servers' weights now
        flat = w.client.pull()
    ref = alone(steps)
    worst = max((flat[n] - p.detach().numpy()).__abs__().max() for n, p in ref.state_dict().items())
    check(f"{name}: the servers' weights are the {steps} steps alone (max |diff| {worst:.2e})",
          worst < 1e-5)


if __name__ == "__main__":
    if sys.argv[1] == "init":
        dt.save_init(make(), sys.argv[2])
        sys.exit(0)
    exact(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), f"{sys.argv[3]} steps")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
