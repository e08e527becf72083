#!/usr/bin/python3
"""py_sigint: the two sides of test_py_sigint.sh, over downpour (NumPy).

    py_sigint.py subject EP KIND   worker 1 of a sync pair: pull, push step
        1, print "blocked" and block in a call the servers hold (KIND pull:
        the next pull, which waits for worker 0's push; KIND torch: the same
        pull through downpour.torch.Worker); a SIGINT must raise
        KeyboardInterrupt out of it (printed with its delay from the call's
        start), and the context manager then leaves (finish, close).
    py_sigint.py chief EP          worker 0: two steps; the second one the
        servers may only answer once worker 1 is counted gone; prints the
        seconds that took, then shuts the servers down.
    py_sigint.py late EP           worker 0 of 2: a SIGINT the main thread
        takes while the watcher is held back (its test gate closed), as
        when a call returns by itself just as the signal comes; the gate
        opens 0.3 s into the next call, wait_all, which must not be
        interrupted by it: it returns once worker 1 finishes, and prints
        "wait_all ok".
    py_sigint.py finisher EP       worker 1: pull, then finish 1.5 s later.
"""
import sys
import time

import numpy as np

import downpour

SPEC = "fc:10 softmax"


def subject(ep, kind):
    if kind == "torch":
        import torch
        import downpour.torch as dt
        net = torch.nn.Module()
        net.fc1 = torch.nn.Linear(784, 10)  # the spec's one layer, by its name
        ctx = dt.Worker(net, ps=ep, task_index=1, spec=SPEC, timeout=60)
        pull, push = ctx.pull, lambda: ctx.push(loss=0.0, batch=1)
    else:
        ctx = downpour.Client.from_spec(SPEC, ps=ep, task_index=1, timeout=60)
        pull = ctx.pull
        push = lambda: ctx.push(np.zeros(ctx.num_floats, dtype=np.float32), batch=1)
    with ctx:
        pull()
        push()
        print("blocked", flush=True)
        t0 = time.monotonic()
        try:
            pull()  # held: step 1 waits for worker 0's push
            print("the pull returned: the servers did not hold it", flush=True)
        except KeyboardInterrupt:
            print(f"KeyboardInterrupt after {time.monotonic() - t0:.3f} s", flush=True)
            raise
        except downpour.Terminated:
            print(f"Terminated after {time.monotonic() - t0:.3f} s", flush=True)
            raise


def chief(ep):
    with downpour.Client.from_spec(SPEC, ps=ep, task_index=0, timeout=60) as c:
        g = np.zeros(c.num_floats, dtype=np.float32)
        t0 = time.monotonic()
        for _ in range(2):
            c.pull()
            c.push(g, batch=1)
        c.pull()
        print(f"two steps in {time.monotonic() - t0:.3f} s", flush=True)
        c.shutdown()


def late(ep):
    import os
    import signal
    import threading
    from downpour import _sigint
    with downpour.Client.from_spec(SPEC, ps=ep, task_index=0, timeout=60) as c:
        c.pull()
        _sigint._gate.clear()  # the watcher waits here
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises at once; never slept out
            print("no KeyboardInterrupt", flush=True)
        except KeyboardInterrupt:
            pass
        threading.Timer(0.3, _sigint._gate.set).start()
        c.wait_all(timeout=20)
        print("wait_all ok", flush=True)


def finisher(ep):
    with downpour.Client.from_spec(SPEC, ps=ep, task_index=1, timeout=60) as c:
        c.pull()
        time.sleep(1.5)
        c.finish()


if __name__ == "__main__":
    {"subject": lambda: subject(sys.argv[2], sys.argv[3]), "chief": lambda: chief(sys.argv[2]),
     "late": lambda: late(sys.argv[2]), "finisher": lambda: finisher(sys.argv[2])}[sys.argv[1]]()
