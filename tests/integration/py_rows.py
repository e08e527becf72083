#!/usr/bin/python3
"""py_rows: a PyTorch module with a sparse embedding as a worker
(downpour.torch.Worker: its rows on the servers), for test_py_rows.sh.

    py_rows.py init FILE V          the --init file of the module with V keys:
        the embedding's weight left out, its width in the metadata; the
        refusals (two sparse embeddings, pull() without keys)
    py_rows.py train EP OPT V STEPS one worker against servers running the
        dense layer with SGD lr 0.1 and the rows with OPT (sgd, adagrad,
        adam, sparse_adam) at lr 0.1 from zeros: STEPS steps through the Worker end on
        the weights of the same steps in one process with torch's SGD on the
        dense layer and SGD / Adagrad / SparseAdam (sparse gradients, a few
        keys a batch; the rows' sparse_adam) / Adam on the embedding, to
        float rounding (adam: every key in every batch, so
        that the rows' own step counts are torch's one count, on a dense
        gradient: the rows' adam is torch.optim.Adam's, with eps outside the
        bias correction, where SparseAdam puts it inside, 1e-4 apart after
        20 steps here)
Prints "ok  ..." / "FAIL ..." lines and a closing count.
"""
import sys

import numpy as np
import torch
from torch import nn

import downpour
import downpour.torch as dt
from downpour import safetensors as st

D, B, PER = 4, 8, 3  # width, bags a batch, keys a bag
passed = failed = 0


def check(name, ok):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name, flush=True)
    passed, failed = passed + bool(ok), failed + (not ok)


class Net(nn.Module):
    def __init__(self, V):
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.EmbeddingBag(V, D, mode="sum", sparse=True)
        self.fc = nn.Linear(D, 3)

    def forward(self, keys, offsets):
        return self.fc(torch.tanh(self.emb(keys, offsets)))


def batches(V, n, every_key):
    """n batches of B bags of PER keys (every key of V in each when every_key)."""
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(n):
        keys = torch.randint(0, V, (B * PER,), generator=g)
        if every_key:
            keys[:V] = torch.randperm(V, generator=g)
        out.append((keys, torch.arange(0, B * PER, PER), torch.randint(0, 3, (B,), generator=g)))
    return out


def alone(V, opt, data):
    m = Net(V)
    with torch.no_grad():
        m.emb.weight.zero_()  # the servers' --row-init 0
    dense = torch.optim.SGD(m.fc.parameters(), lr=0.1)
    if opt == "adam":
        m.emb.sparse = False  # torch.optim.Adam: a dense gradient, every row in it
    rows = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
            "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-8),
            "adam": lambda p: torch.optim.Adam(p, lr=0.1, eps=1e-8),
            "sparse_adam": lambda p: torch.optim.SparseAdam(p, lr=0.1, eps=1e-8)}[opt](m.emb.parameters())
    for keys, offsets, y in data:
        nn.functional.cross_entropy(m(keys, offsets), y).backward()
        dense.step(), rows.step()
        dense.zero_grad(), rows.zero_grad()
    return m


def init(path, V):
    dt.save_init(Net(V), path)
    tensors, meta = st.read(path)
    check("save_init leaves the sparse embedding out and names its width",
          [n for n, _ in tensors] == ["fc.weight", "fc.bias"] and meta.get(st.ROWS_KEY) == str(D))
    two = nn.Sequential(nn.Embedding(5, 2, sparse=True), nn.Embedding(5, 2, sparse=True))
    try:
        dt.save_init(two, path + ".two")
        check("two sparse embeddings refused", False)
    except downpour.ModelMismatch as e:
        check(f"two sparse embeddings refused, naming both ({e})", "0 and 1" in str(e))


def train(ep, opt, V, steps):
    every = opt == "adam"
    data = batches(V, steps, every)
    ref = alone(V, opt, data)
    m = Net(V)
    with dt.Worker(m, ps=ep, task_index=0) as w:
        try:
            w.pull()
            check("pull() without keys refused", False)
        except downpour.Error as e:
            check(f"pull() without keys refused ({e})", "pull(keys)" in str(e))
        for keys, offsets, y in data:
            w.pull(keys)
            loss = nn.functional.cross_entropy(m(keys, offsets), y)
            loss.backward()
            w.push(loss=loss, batch=B)
            m.zero_grad()
        w.pull(torch.arange(V))  # every row, for the comparison
        tol = 1e-6
        for name, a, b in (("emb.weight", m.emb.weight, ref.emb.weight),
                           ("fc.weight", m.fc.weight, ref.fc.weight),
                           ("fc.bias", m.fc.bias, ref.fc.bias)):
            err = float((a - b).abs().max())
            scale = float(b.abs().max())
            check(f"{opt}: {name} after {steps} steps equals one process's ({err:.2e} of "
                  f"{scale:.3f})", err <= tol * max(1.0, scale) and scale > 0)
        s = w.stats()
        check(f"{opt}: the servers applied {steps} pushes ({s['applied']})", s["applied"] == steps)


if __name__ == "__main__":
    if sys.argv[1] == "init":
        init(sys.argv[2], int(sys.argv[3]))
    else:
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
