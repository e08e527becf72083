"""torch_rows: a sparse model's --save file (embed.keys, embed.weight and
the dense layers, "embed:D relu fc:H relu fc:2 softmax"; a sigmoid head's
one logit, "... fc:1 sigmoid" or "embed:1 sigmoid" with its "bias", read
through torch.sigmoid) rebuilt in PyTorch
as an nn.EmbeddingBag (sum, per-sample weights: the libsvm values) looked
up at searchsorted(keys, key), and scored on a libsvm test file: prints
its test AUC (probability of class 1; ties counted half). Every test key
must be in the file (no initial values here). Usage: FILE TEST.svm[.gz]"""
import gzip
import json
import struct
import sys

import numpy as np
import torch


def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    dt = {"F32": "<f4", "U64": "<u8", "I64": "<i8"}
    out = {}
    for name, e in h.items():
        if name == "__metadata__":
            continue
        s, t = e["data_offsets"]
        out[name] = np.frombuffer(b[8 + n + s:8 + n + t], dtype=dt[e["dtype"]]).reshape(e["shape"])
    return out


def main(path, test):
    t = tensors(path)
    keys = t["embed.keys"]
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(t["embed.weight"].copy()), mode="sum")
    fcs = sorted(k[:-len(".weight")] for k in t if k.startswith("fc") and k.endswith(".weight"))
    opener = gzip.open if test.endswith(".gz") else open
    idx, w, offsets, labels = [], [], [], []
    with opener(test, "rt") as f:
        for line in f:
            parts = line.split()
            labels.append(1 if float(parts[0]) > 0 else 0)
            offsets.append(len(idx))
            for kv in parts[1:]:
                k, v = kv.split(":")
                i = int(np.searchsorted(keys, np.uint64(int(k))))
                assert i < len(keys) and keys[i] == np.uint64(int(k)), f"key {k} not in the file"
                idx.append(i)
                w.append(float(v))
    with torch.no_grad():
        x = bag(torch.tensor(idx), torch.tensor(offsets), per_sample_weights=torch.tensor(w))
        for name in fcs:  # relu before each fc, as the spec says
            x = torch.relu(x) @ torch.from_numpy(t[name + ".weight"].copy()).T + torch.from_numpy(t[name + ".bias"].copy())
        if "bias" in t:  # embed:1 sigmoid: the head's own bias
            x = x + torch.from_numpy(t["bias"].copy())
        if x.shape[1] == 1:  # a sigmoid head: one logit, BCEWithLogitsLoss's
            p = torch.sigmoid(x[:, 0]).double().numpy()
        else:
            p = torch.softmax(x, dim=1)[:, 1].double().numpy()
    y = np.array(labels)
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p))
    ps = p[order]
    i = 0
    while i < len(ps):  # average ranks over ties
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = y.sum()
    print((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
