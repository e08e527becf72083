#!/usr/bin/python3
"""py_client: checks of the Python package against live servers, for
test_py_client.sh (which starts the servers). Each subcommand prints "ok
NAME" / "FAIL NAME: why" lines and ends with "N passed, N failed".

  exact --ps EPS --init FILE --optimizer sgd|adam --lr X
      one worker pushing real gradients of a module with batch norm; after
      every push the pulled weights equal torch.optim's on the same
      gradients (to float rounding), and the buffers equal the values pushed
      (async: the pushed value replaces the held one)
  errors --ps EP --init FILE
      a wrong .grad shape, a NaN gradient and a module that is not the
      servers' each raise one exception naming the tensor; the client
      stays usable after each
  spec --ps EP --spec SPEC
      a spec server: Worker(spec=...) and Client.from_spec; a module whose
      tensor has another shape is refused naming it; the NumPy Client's
      pull into dicts and flat arrays
  init --init FILE
      write the --init file of the module the others use
"""
import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import downpour  # noqa: E402
import downpour.torch  # noqa: E402

PASSED = FAILED = 0


def check(name, ok, why=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
        print(f"ok   {name}")
    else:
        FAILED += 1
        print(f"FAIL {name}: {why}")


def expect(name, exc, fn, *words):
    """fn() raises exc whose text holds every word."""
    try:
        fn()
    except exc as e:
        missing = [w for w in words if w not in str(e)]
        check(f"{name}: {type(e).__name__}: {e}", not missing, f"no {missing} in the message")
        return e
    except Exception as e:  # noqa: BLE001
        check(name, False, f"raised {type(e).__name__}: {e}, not {exc.__name__}")
        return None
    check(name, False, f"no {exc.__name__} raised")
    return None


def bn_net():
    torch.manual_seed(5)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 3))


def batch(k):
    g = torch.Generator().manual_seed(100 + k)
    return torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g)


def cmd_exact(a):
    model = bn_net()
    ref = bn_net()  # the same initial values (the --init file's)
    params_ref = dict(ref.named_parameters())
    opt = (torch.optim.SGD(ref.parameters(), lr=a.lr) if a.optimizer == "sgd"
           else torch.optim.Adam(ref.parameters(), lr=a.lr))
    loss_fn = nn.CrossEntropyLoss()
    worst_p = worst_s = 0.0
    with downpour.torch.Worker(model, ps=a.ps.split(","), task_index=0, timeout=20,
                               init=a.init) as w:
        check(f"{len(a.ps.split(','))} shard(s), the table of {len(w.client.tensors)} tensors",
              w.info.shards == len(a.ps.split(",")))
        check(f"servers without --local-steps: info.local_steps 1 (got {w.info.local_steps})",
              w.info.local_steps == 1)
        w.pull()
        same = all(torch.equal(v.float(), ref.state_dict()[k].float())
                   for k, v in model.state_dict().items())
        check("the first pull is the --init file's values", same)
        ptrs = [p.data_ptr() for p in model.parameters()]
        for k in range(a.steps):
            x, y = batch(k)
            loss = loss_fn(model(x), y)
            loss.backward()
            for n, p in model.named_parameters():
                params_ref[n].grad = p.grad.clone()
            pushed_state = {n: b.clone() for n, b in model.named_buffers()}
            r = w.push(loss=loss, batch=len(y))
            if r.applied != w.info.shards:
                check(f"step {k + 1} applied", False, str(r))
            opt.step()
            model.zero_grad()
            w.pull()
            for n, p in model.named_parameters():
                d = float((p.detach() - params_ref[n].detach()).abs().max())
                scale = float(params_ref[n].detach().abs().max()) + 1e-12
                worst_p = max(worst_p, d / scale)
            for n, b in model.named_buffers():
                worst_s = max(worst_s, float((b.float() - pushed_state[n].float()).abs().max()))
        check(f"{a.steps} pushes: weights = torch.optim.{type(opt).__name__}'s on the same "
              f"gradients (worst relative difference {worst_p:.2e} <= 1e-5)", worst_p <= 1e-5)
        check(f"... the buffers pulled are the values pushed (worst {worst_s:.1e})", worst_s == 0)
        check("... num_batches_tracked counted every step through the servers",
              int(model[1].num_batches_tracked) == a.steps,
              str(model[1].num_batches_tracked))
        check("pull wrote the parameters in place (no new tensors)",
              ptrs == [p.data_ptr() for p in model.parameters()])
        check("every .grad is a view into the Worker's one flat buffer",
              all(p.grad is not None and p.grad.data_ptr() == g.data_ptr()
                  for p, g, _ in w._grads))
        # zero_grad(set_to_none=True): the next backward makes new .grad tensors, copied in
        model.zero_grad(set_to_none=True)
        x, y = batch(99)
        loss_fn(model(x), y).backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters()}
        w.push(loss=0.0, batch=16)
        got = {t.name: w._flat[t.offset:t.offset + t.count].view(t.shape) for t in w.client.tensors}
        check("after zero_grad(set_to_none=True) the push carries the new .grad",
              all(torch.equal(got[n], want[n]) for n in want))
        st = w.stats()
        check(f"stats: {st['applied']} applied = {a.steps + 1} pushes", st["applied"] == a.steps + 1)
    return 0


def cmd_errors(a):
    model = bn_net()
    eps = a.ps.split(",")
    with downpour.torch.Worker(model, ps=eps, task_index=0, timeout=20) as w:
        w.pull()
        x, y = batch(0)
        nn.functional.cross_entropy(model(x), y).backward()
        # PyTorch refuses a .grad of another shape itself; a parameter whose
        # data was replaced by another shape is the worker's to catch.
        keep = model[4].weight.data
        model[4].weight.data = torch.zeros(5, 144)
        e = expect("a parameter replaced by another shape: the next pull refuses it",
                   downpour.ShapeError, w.pull, "4.weight", "[5, 144]", "[3, 144]")
        check("... the exception names the tensor (.tensor)", e is not None and e.tensor == "4.weight")
        model[4].weight.data = keep
        w.pull()
        nn.functional.cross_entropy(model(x), y).backward()
        good_bias = model[0].bias.grad.clone()
        model[0].bias.grad[2] = float("nan")
        e = expect("a NaN gradient", downpour.Rejected, lambda: w.push(loss=1.0, batch=16),
                   "0.bias", "nan", "element 2")
        check("... refused by the servers, the exception names the tensor",
              e is not None and e.tensor == "0.bias" and e.code == "refused")
        model[0].bias.grad.copy_(good_bias)
        r = w.push(loss=1.0, batch=16)
        check("... the worker goes on: the next push is applied", r.applied == len(eps), str(r))
        st = w.stats()
        check(f"... the servers counted the refusal (rejected {st['rejected']})", st["rejected"] >= 1)

    # A module that is not the servers' table.
    other = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 5))
    expect("a module of another shape, with init=: refused before connecting, naming it",
           downpour.ShapeError,
           lambda: downpour.torch.Worker(other, ps=eps, task_index=0, timeout=5, init=a.init),
           "4.weight", "[5, 144]", "[3, 144]")
    e = expect("a module of another shape, without init=: the servers refuse its table",
               downpour.ModelMismatch,
               lambda: downpour.torch.Worker(other, ps=eps, task_index=0, timeout=5),
               "model mismatch", "init=")
    check("... of kind model_mismatch", e is not None and e.code == "model_mismatch")
    renamed = nn.Sequential()
    for name, mod in zip(["c", "bn", "r", "f", "fc"], bn_net()):
        renamed.add_module(name, mod)
    expect("a module whose tensor is named otherwise, with init=: names both",
           downpour.ModelMismatch,
           lambda: downpour.torch.Worker(renamed, ps=eps, task_index=0, timeout=5, init=a.init),
           "c.weight", "0.weight")
    # Tied parameters (one storage under two names) are refused, naming both,
    # by the Worker and by save_init, before anything is sent or written.
    tied = bn_net()
    tied[4].weight = nn.Parameter(torch.zeros(3, 144))
    extra = nn.Linear(144, 3)
    extra.weight = tied[4].weight
    tied.add_module("5", extra)
    expect("tied parameters: the Worker refuses them, naming both tensors", downpour.ModelMismatch,
           lambda: downpour.torch.Worker(tied, ps=eps, task_index=0, timeout=5),
           "4.weight", "5.weight", "tied")
    expect("... and so does save_init", downpour.ModelMismatch,
           lambda: downpour.torch.save_init(tied, a.init + ".tied"), "4.weight", "5.weight")
    check("... which wrote nothing", not os.path.exists(a.init + ".tied"))
    # The file the servers read is what save_init wrote: it loads back strictly.
    tensors, meta = downpour.safetensors.read(a.init)
    fresh = bn_net()
    fresh.load_state_dict({n: torch.from_numpy(t) for n, t in tensors}, strict=True)
    check("the --init file loads back into the module with load_state_dict(strict=True)", True)
    check("... its downpour.state names every buffer, no parameter",
          meta.get("downpour.state", "").split(",") == [n for n, _ in bn_net().named_buffers()],
          meta.get("downpour.state"))
    return 0


def cmd_spec(a):
    from torch_net import build_module
    model = build_module(a.spec, (1, 28, 28))
    eps = a.ps.split(",")
    with downpour.torch.Worker(model, ps=eps, task_index=0, spec=a.spec, timeout=20) as w:
        w.pull()
        check("Worker(spec=...) connects to a --model server and pulls",
              float(model.fc1.weight.abs().sum()) > 0)
        nn.functional.cross_entropy(model(torch.rand(4, 1, 28, 28)), torch.tensor([0, 1, 2, 3])).backward()
        r = w.push(loss=1.0, batch=4)
        check("... and pushes", r.applied == len(eps), str(r))
        # The NumPy client: the same servers, worker 0 again from a new connection.
    bad = build_module(a.spec.replace("fc:10", "fc:11"), (1, 28, 28))
    expect("a module whose tensor is not the spec's shape", downpour.ShapeError,
           lambda: downpour.torch.Worker(bad, ps=eps, task_index=0, spec=a.spec, timeout=5),
           "fc2.weight", "[11,", "[10,")
    with downpour.Client.from_spec(a.spec, (1, 28, 28), ps=eps, task_index=0, timeout=20) as c:
        d = c.pull()
        check("Client.pull(): a dict of the spec's tensors",
              list(d) == [t.name for t in c.tensors] and d["conv1.weight"].shape == (32, 1, 5, 5)
              if "conv5x5:32" in a.spec else list(d) == [t.name for t in c.tensors])
        flat = np.empty(c.num_floats, dtype=np.float32)
        c.pull(flat)
        mine = {t.name: np.zeros(t.shape, dtype=np.float32) for t in c.tensors}
        c.pull(mine)
        check("Client.pull(flat) and pull(dict) agree with pull()",
              all(np.array_equal(mine[t.name], flat[t.offset:t.offset + t.count].reshape(t.shape))
                  and np.array_equal(d[t.name], mine[t.name]) for t in c.tensors))
        expect("Client.pull into an array of the wrong shape", downpour.ShapeError,
               lambda: c.pull({c.tensors[0].name: np.zeros((1, 2), dtype=np.float32)}),
               c.tensors[0].name)
        g = {t.name: np.full(t.shape, 1e-3, dtype=np.float32) for t in c.tensors}
        name = c.tensors[0].name
        expect("Client.push of an array of the wrong shape", downpour.ShapeError,
               lambda: c.push({name: np.zeros((1, 2), dtype=np.float32)}), name, "[1, 2]")
        r = c.push(g, loss=0.5, batch=1)
        check(f"Client.push(dict) as step {c.step}", r.applied == len(eps), str(r))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["init", "exact", "errors", "spec"])
    ap.add_argument("--ps")
    ap.add_argument("--init")
    ap.add_argument("--spec")
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "init":  # the --init file of the test's module
        downpour.torch.save_init(bn_net(), a.init)
        return 0
    {"exact": cmd_exact, "errors": cmd_errors, "spec": cmd_spec}[a.cmd](a)
    print(f"{PASSED} passed, {FAILED} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
