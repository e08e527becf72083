#!/usr/bin/python3
"""torch_load: check that a Downpour checkpoint loads into the equivalent
PyTorch nn.Module and evaluate it on the test set.

    /usr/bin/python3 tests/integration/torch_load.py MODEL.safetensors \
        --data /usr/share/datasets/fashion-mnist [--limit N]

Run it with Debian's /usr/bin/python3 (python3-torch, python3-numpy); the
safetensors package is not needed: the file is parsed here (8-byte LE header
length, JSON header, raw little-endian data). The network is rebuilt from the
"spec" metadata (conv KxK "same" => padding K//2, maxpoolK => MaxPool2d(K),
flatten C,H,W before the first fc, fc => Linear; softmax is the loss, so the
module outputs logits) and loaded with load_state_dict(strict=True): a name,
shape or count that differs from PyTorch's own layout fails here.

--data DIR holds IDX files (t10k-images-idx3-ubyte[.gz], ...) or the CIFAR-10
binary test_batch.bin. Prints one JSON line:
    {"test_accuracy": ..., "test_loss": ..., "n": ...}
Exit status 1 with one line on stderr on any error.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_net import build_module  # noqa: E402

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """(tensors: name -> torch.Tensor, metadata: dict)"""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, e in header.items():
        if e["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {e['dtype']}")
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[b:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        tensors[name] = torch.from_numpy(arr.copy())
    return tensors, meta


def read_idx(path, magic):
    if os.path.exists(path + ".gz"):  # as the C reader: FILE.gz first
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    (m,) = struct.unpack(">I", raw[:4])
    if m != magic:
        raise ValueError(f"{path}: bad magic 0x{m:08x}")
    ndim = m & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    arr = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {arr.size} bytes of data, header says {dims}")
    return arr.reshape(dims)


def load_test_set(d):
    """(images uint8 [n, c, h, w], labels int64 [n])"""
    cifar = os.path.join(d, "test_batch.bin")
    if not os.path.exists(cifar):
        cifar = os.path.join(d, "cifar-10-batches-bin", "test_batch.bin")
    if os.path.exists(cifar):
        rec = np.fromfile(cifar, dtype=np.uint8).reshape(-1, 3073)
        return rec[:, 1:].reshape(-1, 3, 32, 32), rec[:, 0].astype(np.int64)
    x = read_idx(os.path.join(d, "t10k-images-idx3-ubyte"), 0x803)
    y = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte"), 0x801)
    return x[:, None, :, :], y.astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="safetensors checkpoint written by Downpour")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="test data directory (IDX or CIFAR-10 binary)")
    # The suite's hook (tests/integration/lib.sh): the test split cut as
    # Downpour's programs cut it, so the two accuracies compare.
    hook = int(os.environ.get("DP_TEST_TEST_SAMPLES") or 0)
    ap.add_argument("--limit", type=int, default=hook, help="evaluate the first N samples only")
    ap.add_argument("--batch", type=int, default=500)
    args = ap.parse_args()

    tensors, meta = read_safetensors(args.model)
    if "spec" not in meta or "input" not in meta:
        raise ValueError(f"{args.model}: metadata lacks 'spec' or 'input'")
    in_shape = tuple(int(v) for v in meta["input"].split("x"))
    net = build_module(meta["spec"], in_shape)
    # Tensors the module lacks (optimizer state saved by the server) are set
    # aside; strict=True still demands every module tensor, named and shaped
    # as PyTorch does.
    state = {k: v for k, v in tensors.items() if k in net.state_dict()}
    extra = sorted(set(tensors) - set(state))
    if extra:
        print(f"torch_load: ignoring tensors the module does not have: {extra}", file=sys.stderr)
    net.load_state_dict(state, strict=True)
    net.eval()

    x, y = load_test_set(args.data)
    if args.limit > 0:
        x, y = x[:args.limit], y[:args.limit]
    if tuple(x.shape[1:]) != in_shape:
        raise ValueError(f"data shape {tuple(x.shape[1:])} does not match the model input {in_shape}")
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), args.batch):
            xb = torch.from_numpy(x[i:i + args.batch].astype(np.float32)) / 255
            yb = torch.from_numpy(y[i:i + args.batch])
            logits = net(xb)
            loss_sum += nn.functional.cross_entropy(logits, yb, reduction="sum").item()
            correct += (logits.argmax(1) == yb).sum().item()
    n = len(y)
    print(json.dumps({"test_accuracy": correct / n, "test_loss": loss_sum / n, "n": n}))


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        print(f"torch_load: {e}", file=sys.stderr)
        sys.exit(1)
