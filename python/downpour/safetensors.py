"""downpour.safetensors: the safetensors files `downpour-ps --init` reads, in
plain Python and NumPy (no safetensors package).

The format: an 8-byte little-endian header length N, N bytes of JSON (padded
with spaces to a multiple of 8, so the data that follows is aligned), then
the tensors' bytes. The JSON maps each tensor name to {"dtype", "shape",
"data_offsets": [begin, end]} (offsets into the data) and "__metadata__" to
a map of strings. The servers take the table in the order the data lies in
the file; the metadata key "downpour.state" (a comma list) names the
tensors that are state (batch norm's running statistics), not trained by
gradients.
"""
import json
import struct

import numpy as np

STATE_KEY = "downpour.state"
ROWS_KEY = "downpour.rows"  # the width D of a row table beside the tensors (common/safetensors.h)

# Every dtype the C reader (common/safetensors.c) takes: a sparse model's
# file holds its row keys as U64 (embed.keys). BF16 has no NumPy type: its
# 16 bits are the top half of a float32's, and it reads as float32.
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
           "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
           "BOOL": "?"}


def write(path, tensors, metadata=None):
    """Write tensors (a list of (name, array) pairs, in the order their data is
    to lie in the file) as float32, with metadata (a dict of strings)."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors:
        a = np.require(a, dtype="<f4", requirements="C")  # keeps a 0-d tensor 0-d
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read(path):
    """(tensors, metadata): tensors a list of (name, NumPy array) in the order
    their data lies in the file (the servers' table order), metadata a dict.
    ValueError naming the file on anything malformed."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: header is not JSON: {e}") from None
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    entries = []
    for name, e in header.items():
        dt = _DTYPES.get(e.get("dtype"))
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {e.get('dtype')}")
        b, end = e["data_offsets"]
        if not 0 <= b <= end <= len(data):
            raise ValueError(f"{path}: tensor {name}: data_offsets {b}..{end} outside the data")
        if (end - b) % np.dtype(dt).itemsize:
            raise ValueError(f"{path}: tensor {name}: {end - b} bytes are no whole {e['dtype']} values")
        a = np.frombuffer(data[b:end], dtype=dt)
        if e["dtype"] == "BF16":
            a = (a.astype("<u4") << 16).view("<f4")
        shape = tuple(int(d) for d in e["shape"])
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {end - b} bytes for shape {list(shape)}")
        entries.append((b, name, a.reshape(shape).copy()))
    entries.sort(key=lambda t: t[0])  # stable: equal offsets (empty tensors) keep header order
    return [(name, a) for _, name, a in entries], meta


def table(path):
    """The tensor table of an --init file: a list of (name, shape, trainable)
    in the servers' order."""
    tensors, meta = read(path)
    state = set(s for s in meta.get(STATE_KEY, "").split(",") if s)
    return [(name, tuple(a.shape), name not in state) for name, a in tensors]


def rows_width(path):
    """The width of the row table an --init file names beside its tensors
    (a sparse embedding's; 0: none)."""
    _, meta = read(path)
    return int(meta.get(ROWS_KEY, 0) or 0)
