"""torch_net: Downpour's model spec as a PyTorch module, for the tests and
benchmarks that compare with PyTorch (tests/integration/torch_load.py,
tests/bench/torch_train.py, tests/gpu/torch_bench.py).

Parameter names follow common/model.c (conv1, conv2, fc1, ...), so a
Downpour checkpoint loads with load_state_dict(strict=True); the module
outputs logits (the spec's softmax is the loss)."""
import collections

from torch import nn

DEFAULT_SPEC = "conv5x5:32 relu maxpool2 conv5x5:64 relu maxpool2 fc:512 relu fc:10 softmax"


def build_module(spec, in_shape):
    """nn.Sequential with PyTorch names conv1, fc1, ... as model.h numbers them."""
    c, h, w = in_shape
    layers = collections.OrderedDict()
    n_conv = n_fc = n_other = 0
    flat = False
    toks = spec.split()
    for i, tok in enumerate(toks):
        if tok.startswith("conv"):
            parts = tok[4:].split(":")
            k1, k2 = (int(x) for x in parts[0].split("x"))
            out = int(parts[1])
            pad = k1 // 2 if len(parts) < 3 or parts[2] == "same" else 0
            n_conv += 1
            layers[f"conv{n_conv}"] = nn.Conv2d(c, out, (k1, k2), padding=pad)
            c, h, w = out, h + 2 * pad - k1 + 1, w + 2 * pad - k2 + 1
        elif tok == "relu":
            n_other += 1
            layers[f"relu_{n_other}"] = nn.ReLU()
        elif tok.startswith("maxpool"):
            k = int(tok[7:])
            n_other += 1
            layers[f"pool_{n_other}"] = nn.MaxPool2d(k)
            h, w = h // k, w // k
        elif tok.startswith("fc:"):
            if not flat:
                layers["flatten"] = nn.Flatten()
                c, h, w, flat = c * h * w, 1, 1, True
            out = int(tok[3:])
            n_fc += 1
            layers[f"fc{n_fc}"] = nn.Linear(c, out)
            c = out
        elif tok == "softmax":
            if i != len(toks) - 1:
                raise ValueError(f"spec: softmax must be last: {spec}")
        else:
            raise ValueError(f"spec: unknown token {tok!r}")
    return nn.Sequential(layers)
