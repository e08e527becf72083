"""compare_st.py A.safetensors B.safetensors [--rtol R] [--atol A]

Compares every tensor of two safetensors files (float32; int64 counters) and prints the
worst difference; exit status 0 when all are within atol + rtol*|b|. Reads the
format itself (8-byte header length, JSON header, raw data): no safetensors
package needed."""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        dt = np.int64 if t["dtype"] == "I64" else np.float32  # counters: num_batches_tracked
        out[name] = np.frombuffer(data[base + a : base + b], dtype=dt).reshape(t["shape"]).astype(np.float64)
    return out


def main():
    args = sys.argv[1:]
    rtol, atol = 1e-4, 1e-5
    if "--rtol" in args:
        i = args.index("--rtol")
        rtol = float(args[i + 1])
        del args[i : i + 2]
    if "--atol" in args:
        i = args.index("--atol")
        atol = float(args[i + 1])
        del args[i : i + 2]
    a, b = load(args[0]), load(args[1])
    if a.keys() != b.keys():
        print("tensor names differ:", sorted(a.keys() ^ b.keys()))
        return 1
    ok = True
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape:
            print(f"{name}: shapes {x.shape} vs {y.shape}")
            ok = False
            continue
        d = np.abs(x - y)
        bad = d > atol + rtol * np.abs(y)
        print(f"{name}: max |diff| {d.max():.3g}, {int(bad.sum())} of {d.size} outside tolerance")
        ok = ok and not bad.any()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
