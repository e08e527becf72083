#!/usr/bin/python3
"""torch_sigmoid: Downpour's binary head (sigmoid) against PyTorch's
BCEWithLogitsLoss on the same weights and batch (tests/unit/test_sigmoid.c
writes DIR, then runs this).

    /usr/bin/python3 tests/torch_sigmoid.py DIR

DIR/model.safetensors is a dense model "... fc:1 sigmoid" (dp_checkpoint_save
of the weights before the step): it must load with load_state_dict(strict=True)
into tests/torch_net.py's module, its last layer nn.Linear(IN, 1).
DIR/step.safetensors holds the batch (x, y), Downpour's loss, its gradient of
every tensor ("grad.NAME") and its probabilities of class 1 ("p1").
DIR/lr.safetensors is logistic regression's head ("embed:1 sigmoid"): the
embedding's outputs ("x", one a sample), the head's "bias", labels "y",
Downpour's "loss", the outputs' gradient "dx" and the bias's "dbias"; in
PyTorch BCEWithLogitsLoss(x + bias, y). Checks the losses within relative
1e-6, the gradients within 1e-5 of their norm, p1 within 1e-6. Prints one
line per failure and exits 1, else "ok"."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "integration"))
from torch_load import read_safetensors  # noqa: E402
from torch_net import build_module  # noqa: E402


def near(bad, what, torch_v, ours, rel):
    diff = (torch_v - ours).norm().item()
    if not diff <= rel * max(torch_v.norm().item(), 1e-30):
        bad.append(f"{what}: |diff| {diff:.3g}, |torch| {torch_v.norm().item():.3g}")


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    bce = torch.nn.BCEWithLogitsLoss()
    bad = []
    tensors, meta = read_safetensors(os.path.join(d, "model.safetensors"))
    step, _ = read_safetensors(os.path.join(d, "step.safetensors"))
    in_shape = tuple(int(v) for v in meta["input"].split("x"))
    net = build_module(meta["spec"], in_shape).double()
    net.load_state_dict(tensors, strict=True)
    last = list(net.children())[-1]
    if not (isinstance(last, torch.nn.Linear) and last.out_features == 1):
        bad.append(f"the last module is {last}, not nn.Linear(IN, 1)")
    x, y = step["x"].double(), step["y"].double()
    z = net(x).squeeze(1)
    loss = bce(z, y)
    loss.backward()
    near(bad, "loss", loss.detach(), step["loss"].double(), 1e-6)
    near(bad, "p1", torch.sigmoid(z.detach()), step["p1"].double(), 1e-6)
    for name, p in net.named_parameters():
        near(bad, "grad " + name, p.grad, step["grad." + name].double(), 1e-5)
    lr, _ = read_safetensors(os.path.join(d, "lr.safetensors"))
    x = lr["x"].double().requires_grad_()
    bias = lr["bias"].double().requires_grad_()
    loss = bce(x + bias, lr["y"].double())
    loss.backward()
    near(bad, "embed:1 sigmoid loss", loss.detach(), lr["loss"].double(), 1e-6)
    near(bad, "embed:1 sigmoid d/dx", x.grad, lr["dx"].double(), 1e-5)
    near(bad, "embed:1 sigmoid d/dbias", bias.grad, lr["dbias"].double(), 1e-5)
    for b in bad:
        print("torch_sigmoid:", b)
    if not bad:
        print(f"torch_sigmoid: ok ({meta['spec']}, B {len(y)}; embed:1 sigmoid, B {len(lr['y'])})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
