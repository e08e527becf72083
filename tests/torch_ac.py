#!/usr/bin/python3
"""torch_ac: kernels/ac_loss.c's loss, gradient and clipping against
PyTorch's, for tests/unit/test_ac_loss.c (which writes FILE, then runs this).

    /usr/bin/python3 tests/torch_ac.py FILE

FILE: "B A beta vcoef max_norm", the logits (B x A), one "value return
action" line per sample, "loss norm" (Downpour's loss and the gradient's
norm before clipping), the clipped gradient (logits', then values').
PyTorch: the loss as Stable-Baselines3's A2C writes it (advantage detached,
Categorical's entropy, vf_coef x MSE), autograd, clip_grad_norm_. Checks
the loss within 1e-6, the norm and every clipped entry within 1e-6 of the
gradient's scale; prints one line per failure and exits 1, else "ok"."""
import sys

import torch
from torch.distributions import Categorical


def main():
    lines = open(sys.argv[1]).read().split("\n")
    B, A, beta, vcoef, max_norm = lines[0].split()
    B, A, beta, vcoef, max_norm = int(B), int(A), float(beta), float(vcoef), float(max_norm)
    z = torch.tensor([float(t) for t in lines[1].split()]).reshape(B, A).requires_grad_()
    rows = [lines[2 + n].split() for n in range(B)]
    v = torch.tensor([float(r[0]) for r in rows]).requires_grad_()
    ret = torch.tensor([float(r[1]) for r in rows])
    act = torch.tensor([int(r[2]) for r in rows])
    loss_c, norm_c = (float(t) for t in lines[2 + B].split())
    grad_c = torch.tensor([float(t) for t in lines[3 + B].split()])

    dist = Categorical(logits=z)
    adv = (ret - v).detach()
    loss = -(adv * dist.log_prob(act)).mean() + vcoef * ((ret - v) ** 2).mean() - beta * dist.entropy().mean()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_([z, v], max_norm)
    grad = torch.cat([z.grad.reshape(-1), v.grad])
    bad = []
    if abs(loss.item() - loss_c) > 1e-6 * max(1.0, abs(loss_c)):
        bad.append(f"loss: Downpour {loss_c!r}, PyTorch {loss.item()!r}")
    if abs(norm.item() - norm_c) > 1e-6 * max(1.0, norm_c):
        bad.append(f"norm before clipping: Downpour {norm_c!r}, PyTorch {norm.item()!r}")
    scale = grad.abs().max().item()
    worst = (grad - grad_c).abs().max().item()
    if worst > 1e-6 * max(scale, 1e-12):
        bad.append(f"clipped gradient: max |diff| {worst:.3g} of scale {scale:.3g}")
    for b in bad:
        print("torch_ac:", b)
    if not bad:
        print("torch_ac: ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
