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
    py_local.py auto EP STEPS PUSHES EP2   the same with servers
        --local-steps auto:4 (DyLU) and Worker(local_steps="auto"): a crew
        of one is its own fastest, so H = 4 every round, exact as above;
        local_steps="auto" against EP2's fixed H is one line.
    py_local.py compressed EP STEPS   the same servers, the Worker with
        compress="topk:0.25": the servers end on the rounds' top-k
        compressed pseudo-gradients with error feedback (proto/compress.c's
        selection, redone here), not on those without it; a bad compress
        value is one line.
Prints "ok  ..." / "FAIL ..." lines and a closing count.
"""
import math
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


def exact(ep, steps, pushes_wanted, name, auto=False):
    m = make()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    results = []
    untouched = True
    with dt.Worker(m, ps=ep, task_index=0, local_steps="auto" if auto else None) as w:
        check(f"{name}: the Worker reads H = {H} from the servers ({w.local_steps})", w.local_steps == H)
        check(f"{name}: ... and auto {auto} ({w.local_auto})", w.local_auto == auto)
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


def flat_of(m):
    return torch.cat([t.detach().reshape(-1) for t in m.state_dict().values()])


def set_flat(m, v):
    at = 0
    with torch.no_grad():
        for t in m.state_dict().values():
            t.copy_(v[at:at + t.numel()].reshape(t.shape))
            at += t.numel()


def topk(v, frac):
    """proto/compress.c's top-k: the k = ceil(frac n) (at most n / 2)
    entries of largest magnitude, ties to the lower index; the rest 0."""
    n = v.numel()
    k = min(max(math.ceil(frac * n), 1), n // 2)
    keep = sorted(range(n), key=lambda i: (-abs(v[i].item()), i))[:k]
    out = torch.zeros_like(v)
    out[keep] = v[keep]
    return out


def compressed_alone(steps, frac, feedback):
    """The rounds as the servers see them: each starts from the servers'
    weights, its pseudo-gradient (plus what earlier rounds did not send)
    top-k compressed, and the outer SGD lr 1 steps by what was sent."""
    m = make()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    server, resid = flat_of(m), torch.zeros_like(flat_of(m))
    bs = batches(steps)
    for r in range(0, steps, H):
        set_flat(m, server)
        for x, y in bs[r:r + H]:
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
        v = (server - flat_of(m)) + (resid if feedback else 0)
        sent = topk(v, frac)
        resid = v - sent
        server = server - sent
    return server


def compressed(ep, steps, name):
    """compress="topk:0.25" with error feedback: the servers end on
    compressed_alone's weights; without the feedback they would not."""
    m = make()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with dt.Worker(m, ps=ep, task_index=0, compress="topk:0.25") as w:
        for x, y in batches(steps):
            w.pull()
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            w.push(loss=loss, batch=len(x))
            opt.zero_grad()
        w.finish()
        flat = w.client.pull()
    got = torch.cat([torch.from_numpy(flat[n]).reshape(-1) for n in m.state_dict()])
    ref = compressed_alone(steps, 0.25, True)
    worst = (got - ref).abs().max().item()
    check(f"{name}: the servers' weights are the rounds' top-k pseudo-gradients with error feedback "
          f"(max |diff| {worst:.2e})", worst < 1e-6)
    off = (got - compressed_alone(steps, 0.25, False)).abs().max().item()
    check(f"{name}: ... and not those without the feedback (max |diff| {off:.2e})", off > 1e-4)
    bad = None
    try:
        dt.Worker(make(), ps=ep, task_index=0, compress="topk:2")
    except downpour.Error as e:
        bad = str(e)
    check(f"{name}: compress=\"topk:2\" is refused with one line ({bad})",
          bad is not None and "compress:" in bad and "\n" not in bad)


if __name__ == "__main__":
    if sys.argv[1] == "init":
        dt.save_init(make(), sys.argv[2])
        sys.exit(0)
    if sys.argv[1] == "compressed":
        compressed(sys.argv[2], int(sys.argv[3]), f"{sys.argv[3]} steps, topk:0.25")
    elif sys.argv[1] == "auto":
        # servers --local-steps auto:4 with a crew of one: its own step time
        # is the fastest, so every round is H = 4, each pushed with its steps
        # (a push without them would be refused) and the run exact as above
        exact(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), f"auto, {sys.argv[3]} steps", auto=True)
        bad = None
        try:  # the other way round: local_steps="auto" against servers of a fixed H
            dt.Worker(make(), ps=sys.argv[5], task_index=0, local_steps="auto")
        except downpour.Error as e:
            bad = str(e)
        check(f"local_steps=\"auto\" against servers of --local-steps 4 is refused with one line ({bad})",
              bad is not None and "give both the same" in bad and "\n" not in bad)
    else:
        exact(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), f"{sys.argv[3]} steps")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
