#!/usr/bin/python3
"""torch_embed: kernels/embed.c's forward and backward against PyTorch's
nn.EmbeddingBag(mode='sum', sparse=True) with per_sample_weights, for
tests/unit/test_embed.c (which writes FILE, then runs this).

    /usr/bin/python3 tests/torch_embed.py FILE

FILE: "B D U nnz", the B bag offsets, the nnz slots (each feature's row
among the U distinct keys), then one line each: the nnz values, the rows
(U x D), dout (B x D), Downpour's out (B x D) and row gradients (U x D).
PyTorch: the bag over the rows with the values as per_sample_weights,
out.backward(dout), the sparse gradient coalesced. Checks out and the
gradient within 1e-6 of their scale, and that the gradient's rows are
exactly the batch's keys; prints one line per failure and exits 1, else
"ok"."""
import sys

import torch


def floats(line):
    return torch.tensor([float(t) for t in line.split()], dtype=torch.float32)


def main():
    lines = open(sys.argv[1]).read().split("\n")
    B, D, U, nnz = (int(t) for t in lines[0].split())
    offsets = torch.tensor([int(t) for t in lines[1].split()], dtype=torch.int64)
    slots = torch.tensor([int(t) for t in lines[2].split()], dtype=torch.int64)
    values = floats(lines[3])
    rows = floats(lines[4]).reshape(U, D)
    dout = floats(lines[5]).reshape(B, D)
    out_c = floats(lines[6]).reshape(B, D)
    grad_c = floats(lines[7]).reshape(U, D)
    assert len(offsets) == B and len(slots) == nnz and len(values) == nnz

    bag = torch.nn.EmbeddingBag(U, D, mode="sum", sparse=True)
    with torch.no_grad():
        bag.weight.copy_(rows)
    out = bag(slots, offsets, per_sample_weights=values)
    out.backward(dout)
    grad = bag.weight.grad.coalesce()
    bad = []
    scale = max(out.abs().max().item(), 1e-12)
    worst = (out.detach() - out_c).abs().max().item()
    if worst > 1e-6 * scale:
        bad.append(f"forward: max |diff| {worst:.3g} of scale {scale:.3g}")
    touched = sorted(grad.indices()[0].tolist())
    if touched != list(range(U)):
        bad.append(f"the sparse gradient's rows {touched} are not the batch's {U} keys")
    dense = grad.to_dense()
    scale = max(dense.abs().max().item(), 1e-12)
    worst = (dense - grad_c).abs().max().item()
    if worst > 1e-6 * scale:
        bad.append(f"row gradients: max |diff| {worst:.3g} of scale {scale:.3g}")
    for b in bad:
        print("torch_embed:", b)
    if not bad:
        print(f"torch_embed: ok (B {B}, D {D}, {U} keys, {nnz} features)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
